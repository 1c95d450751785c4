#!/usr/bin/env bash
# Makes the base image `debian:bookworm-slim` in the local container storage (buildah/podman)
# from Debian's own packages, for machines that cannot pull from a registry. Does nothing
# when the image is already there (pulled or made before). Needs root, debootstrap, podman.
#
#   docker/base-image.sh            # the mirror this machine's apt uses (else deb.debian.org)
#   MIRROR=http://ftp.de.debian.org/debian docker/base-image.sh
#
# Like Docker Hub's slim variant: the minbase package set, no documentation, manual pages or
# translations (dpkg keeps them out of later installs too), no apt lists or .deb cache, and
# apt sources for bookworm, bookworm-updates and bookworm-security on the same mirror(s).
set -euo pipefail
BASE_IMAGE=${BASE_IMAGE:-debian:bookworm-slim}
SUITE=bookworm

if podman image exists "$BASE_IMAGE" 2>/dev/null; then
  echo "base image $BASE_IMAGE: present"
  exit 0
fi

# The mirrors apt is configured with on this machine (only those may be reachable).
site() { apt-get indextargets --format '$(SITE) $(RELEASE)' 2>/dev/null | awk -v r="$1" '$2 == r { print $1; exit }'; }
MIRROR=${MIRROR:-$(site "$SUITE")}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=${SECURITY_MIRROR:-$(site "$SUITE-security")}
if [ -z "$SECURITY_MIRROR" ] && [ "$MIRROR" = http://deb.debian.org/debian ]; then
  SECURITY_MIRROR=http://deb.debian.org/debian-security
fi

root=$(mktemp -d /var/tmp/sluice-base.XXXXXX)
trap 'rm -rf "$root"' EXIT
echo "base image $BASE_IMAGE: debootstrap --variant=minbase $SUITE from $MIRROR"
debootstrap --variant=minbase "$SUITE" "$root" "$MIRROR" >"$root.log" 2>&1 \
  || { tail -20 "$root.log" >&2; rm -f "$root.log"; exit 1; }
rm -f "$root.log"

# apt sources: the suite, its updates and (when known) its security archive.
rm -f "$root/etc/apt/sources.list"
{
  printf 'Types: deb\nURIs: %s\nSuites: %s %s-updates\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
    "$MIRROR" "$SUITE" "$SUITE"
  if [ -n "$SECURITY_MIRROR" ]; then
    printf '\nTypes: deb\nURIs: %s\nSuites: %s-security\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
      "$SECURITY_MIRROR" "$SUITE"
  fi
} >"$root/etc/apt/sources.list.d/debian.sources"

# Slim: what containers do not need, kept out of later package installs as well.
cat >"$root/etc/dpkg/dpkg.cfg.d/docker" <<'CFG'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/lintian/overrides/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/man/*
CFG
cat >"$root/etc/apt/apt.conf.d/docker-clean" <<'CFG'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
CFG
find "$root/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete
rm -rf "$root"/usr/share/{groff,info,linda,lintian/overrides,locale,man}/* \
       "$root"/var/cache/apt/archives/*.deb "$root"/var/cache/apt/*.bin "$root"/var/lib/apt/lists/* \
       "$root"/var/log/*.log "$root"/var/log/apt/* "$root"/tmp/* "$root"/root/.bash_history
# The container engine provides these; the host's must not leak into the image.
: >"$root/etc/hostname"
rm -f "$root/etc/resolv.conf"
: >"$root/etc/resolv.conf"

tar --numeric-owner -C "$root" -c . | podman import --quiet \
  --change 'CMD ["bash"]' --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  - "$BASE_IMAGE" >/dev/null
echo "base image $BASE_IMAGE: made ($(du -sh "$root" | cut -f1) unpacked)"
