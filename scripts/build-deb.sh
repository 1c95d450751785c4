#!/usr/bin/env bash
# Builds the Debian package from a built binary and man page (`make deb` builds both first):
#
#   scripts/build-deb.sh BINARY MANPAGE OUTDIR
#
# The binary should be linked with --static-swift-stdlib: the package depends only on
# Debian's own libraries, found from the binary's NEEDED entries (readelf) and the shlibs
# of the packages that hold them. Layout: /usr/bin/sluice, /lib/systemd/system/sluice.service
# (ExecStart=/usr/bin/sluice ...), conffiles /etc/sluice/sluice.yaml, /etc/sluice/sluice.env
# and /etc/logrotate.d/sluice, the man page, completions, docs. The maintainer scripts
# create the `sluice` system user and remove it on purge (docs/operations.md, "Install").
# Needs dpkg-deb, readelf and strip (binutils); not root.
set -euo pipefail

[ $# -eq 3 ] || { echo "usage: $0 BINARY MANPAGE OUTDIR" >&2; exit 2; }
bin=$(realpath -e "$1")
man=$(realpath -e "$2")
mkdir -p "$3"
outdir=$(realpath -e "$3")
[ -x "$bin" ] || { echo "error: $bin is not executable" >&2; exit 1; }
cd "$(dirname "$0")/.."

version=$("$bin" --version)
revision=${DEB_REVISION:-1}
arch=$(dpkg --print-architecture)
maintainer=${DEB_MAINTAINER:-$(git log -1 --format='%an <%ae>' 2>/dev/null || true)}
[ -n "$maintainer" ] || maintainer="Sluice maintainers <root@localhost>"

# Nothing of the Swift toolchain or the build directory may be left for the loader to find.
if ldd "$bin" | grep -E 'not found|libswift|libFoundation|libdispatch|libBlocksRuntime|/opt/swift|\.build' >&2; then
  echo "error: $bin needs libraries outside Debian (build it with --static-swift-stdlib)" >&2
  exit 1
fi

# Depends: the package of each NEEDED library, with the version its shlibs file asks for.
# ldd says where the loader finds each library: "libz.so.1 => /lib/.../libz.so.1 (0x...)",
# or "/lib64/ld-linux-x86-64.so.2 (0x...)" for the loader itself.
declare -A found owner
while read -r first second third _; do
  if [ "$second" = "=>" ]; then found[$first]=$third; else found[${first##*/}]=$first; fi
done < <(ldd "$bin")
mapfile -t needed < <(readelf -d "$bin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
# libcurl is opened on first use (dlopen, Sources/CShims/curl_loader.c), so it is not NEEDED:
# the package still depends on it, found where the loader would look.
needed+=(libcurl.so.4)
# (awk reads to the end: an early `exit` would leave ldconfig writing into a closed pipe, and
# pipefail would fail the build on its SIGPIPE whenever the listing outgrows the pipe's buffer)
found[libcurl.so.4]=$(ldconfig -p | awk '$1 == "libcurl.so.4" && !seen { print $NF; seen = 1 }')
# One dpkg query for all of them (it is slow); Debian 12 lists a file under /lib or /usr/lib,
# so compare real paths.
names=()
for soname in "${needed[@]}"; do
  [ -n "${found[$soname]:-}" ] || { echo "error: the loader cannot find $soname" >&2; exit 1; }
  names+=("$(basename "$(readlink -f "${found[$soname]}")")")
done
while IFS= read -r line; do
  pkg=${line%%: /*}
  owner[$(readlink -f "${line#"$pkg": }")]=${pkg%%[:,]*}
done < <(dpkg-query -S "${names[@]}" 2>/dev/null || true)
depends=(adduser)
for soname in "${needed[@]}"; do
  pkg=${owner[$(readlink -f "${found[$soname]}")]:-}
  [ -n "$pkg" ] || { echo "error: no Debian package holds ${found[$soname]} ($soname)" >&2; exit 1; }
  # "libssl.so.3" -> shlibs key "libssl 3"; "libevent_core-2.1.so.7" -> "libevent_core-2.1 7"
  key="${soname%%.so.*} ${soname##*.so.}"
  dep=$(dpkg-query --control-show "$pkg:$arch" shlibs 2>/dev/null \
        | awk -v k="$key" '!seen && $0 !~ /^udeb:/ && $1 " " $2 == k { $1 = ""; $2 = ""; sub(/^ +/, ""); print; seen = 1 }')
  depends+=("${dep:-$pkg}")
done
depends_line=$(printf '%s\n' "${depends[@]}" | sort -u | paste -sd, | sed 's/,/, /g')

stage=$(mktemp -d "${TMPDIR:-/tmp}/sluice-deb.XXXXXX")
trap 'rm -rf "$stage"' EXIT
root=$stage/root

DESTDIR=$root PACKAGING=1 PREFIX=/usr BINDIR=/usr/bin SYSCONFDIR=/etc \
  UNITDIR=/lib/systemd/system MANDIR=/usr/share/man DOCDIR=/usr/share/doc/sluice \
  BASHCOMPDIR=/usr/share/bash-completion/completions \
  ZSHCOMPDIR=/usr/share/zsh/vendor-completions \
  FISHCOMPDIR=/usr/share/fish/vendor_completions.d \
  scripts/install.sh "$bin" "$man"
strip --strip-unneeded "$root/usr/bin/sluice"

install -d -m 0755 "$root/DEBIAN"
cat > "$root/DEBIAN/control" <<EOF
Package: sluice
Version: $version-$revision
Architecture: $arch
Maintainer: $maintainer
Installed-Size: $(du -sk --exclude=DEBIAN "$root" | cut -f1)
Depends: $depends_line
Recommends: libjs-chart.js
Section: web
Priority: optional
Description: HTTP forward proxy daemon with a per-host interceptor pipeline
 Sluice is a local HTTP/1.1 forward proxy (HTTP_PROXY=http://127.0.0.1:3128)
 that applies a per-host policy to each request: header and credential
 adapters, retries, redirects, certificate trust evaluation and optional
 TLS interception with a local CA.
 .
 The package installs a hardened systemd unit (Type=notify, watchdog,
 reload that validates the file first), not enabled or started:
 edit /etc/sluice/sluice.yaml, then systemctl enable --now sluice.
EOF

cat > "$root/DEBIAN/conffiles" <<EOF
/etc/sluice/sluice.yaml
/etc/sluice/sluice.env
/etc/logrotate.d/sluice
EOF

cat > "$root/DEBIAN/postinst" <<'EOF'
#!/bin/sh
# The service's user: systemd runs sluice.service (DynamicUser=yes) as this static user
# when it exists, so files keep one owner across restarts and the configuration need not
# be world-readable.
set -e
if [ "$1" = configure ]; then
  if ! getent passwd sluice >/dev/null; then
    adduser --system --group --no-create-home --home /nonexistent \
      --comment "Sluice HTTP proxy" --quiet sluice
  fi
  if ! dpkg-statoverride --list /etc/sluice/sluice.yaml >/dev/null 2>&1; then
    chown root:sluice /etc/sluice/sluice.yaml
    chmod 0640 /etc/sluice/sluice.yaml
  fi
  # Never started or enabled here: the administrator configures it first.
  if [ -d /run/systemd/system ]; then
    systemctl daemon-reload || true
  fi
fi
exit 0
EOF

cat > "$root/DEBIAN/prerm" <<'EOF'
#!/bin/sh
set -e
if [ "$1" = remove ]; then
  if [ -d /run/systemd/system ]; then
    systemctl stop sluice.service || true
  fi
  # Remove the administrator's enable links with the unit, so none are left dangling.
  if command -v systemctl >/dev/null 2>&1; then
    systemctl --no-reload disable sluice.service >/dev/null 2>&1 || true
  fi
fi
exit 0
EOF

cat > "$root/DEBIAN/postrm" <<'EOF'
#!/bin/sh
set -e
case "$1" in
  remove)
    if [ -d /run/systemd/system ]; then
      systemctl daemon-reload || true
    fi
    ;;
  purge)
    # State (the interception CA) and logs; with DynamicUser=yes systemd keeps them under
    # private/ and links /var/lib/sluice and /var/log/sluice to them.
    rm -rf /var/lib/sluice /var/lib/private/sluice /var/log/sluice /var/log/private/sluice
    if getent passwd sluice >/dev/null; then
      deluser --system --quiet sluice 2>/dev/null || userdel sluice
    fi
    if getent group sluice >/dev/null; then
      delgroup --system --quiet sluice 2>/dev/null || groupdel sluice
    fi
    ;;
esac
exit 0
EOF
chmod 0755 "$root/DEBIAN/postinst" "$root/DEBIAN/prerm" "$root/DEBIAN/postrm"

(cd "$root" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z | xargs -0 md5sum) \
  > "$root/DEBIAN/md5sums"
chmod 0644 "$root/DEBIAN/control" "$root/DEBIAN/conffiles" "$root/DEBIAN/md5sums"

deb=$outdir/sluice_${version}-${revision}_${arch}.deb
# zstd: a second to compress where xz takes half a minute (23 MB instead of 15); Debian 12's
# dpkg reads it, and the binary needs Debian 12's libc anyway. DEB_COMPRESSION=xz for the smaller.
dpkg-deb --root-owner-group -Z"${DEB_COMPRESSION:-zstd}" --build "$root" "$deb" >/dev/null
echo "$deb"
