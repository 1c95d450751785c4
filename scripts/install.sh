#!/usr/bin/env bash
# Installs Sluice into DESTDIR: the binary, the systemd unit (its paths made to match), the
# configuration files, the man page, shell completions and the documentation.
# `make install` and `make deb` (scripts/build-deb.sh) both use it, so the two agree.
#
#   scripts/install.sh BINARY MANPAGE
#   scripts/install.sh --uninstall       (removes them again, except the files in SYSCONFDIR)
#
# Layout, from the environment (defaults are make install's):
#   DESTDIR     staging root, prepended to every path below (default: none)
#   PREFIX      /usr/local
#   BINDIR      $PREFIX/bin
#   SYSCONFDIR  /etc                       (sluice/sluice.yaml, sluice/sluice.env, logrotate.d/sluice)
#   UNITDIR     $PREFIX/lib/systemd/system  (systemd searches /usr/local/lib/systemd/system too)
#   MANDIR      $PREFIX/share/man
#   DOCDIR      $PREFIX/share/doc/sluice
#   BASHCOMPDIR $PREFIX/share/bash-completion/completions
#   ZSHCOMPDIR  $PREFIX/share/zsh/site-functions
#   FISHCOMPDIR $PREFIX/share/fish/vendor_completions.d
#   PACKAGING   unset: files under SYSCONFDIR that already exist are kept (they are the
#               administrator's); set (by build-deb.sh): they are always written, and the
#               man page is gzipped as Debian policy wants
set -euo pipefail

uninstall=
if [ "${1:-}" = --uninstall ] && [ $# -eq 1 ]; then
  uninstall=1
elif [ $# -eq 2 ]; then
  bin=$(realpath -e "$1")
  man=$(realpath -e "$2")
else
  echo "usage: $0 BINARY MANPAGE | $0 --uninstall" >&2
  exit 2
fi

DESTDIR=${DESTDIR:-}
case $DESTDIR in /* | "") ;; *) DESTDIR=$PWD/$DESTDIR ;; esac
cd "$(dirname "$0")/.."
PREFIX=${PREFIX:-/usr/local}
BINDIR=${BINDIR:-$PREFIX/bin}
SYSCONFDIR=${SYSCONFDIR:-/etc}
UNITDIR=${UNITDIR:-$PREFIX/lib/systemd/system}
MANDIR=${MANDIR:-$PREFIX/share/man}
DOCDIR=${DOCDIR:-$PREFIX/share/doc/sluice}
BASHCOMPDIR=${BASHCOMPDIR:-$PREFIX/share/bash-completion/completions}
ZSHCOMPDIR=${ZSHCOMPDIR:-$PREFIX/share/zsh/site-functions}
FISHCOMPDIR=${FISHCOMPDIR:-$PREFIX/share/fish/vendor_completions.d}
PACKAGING=${PACKAGING:-}

# What goes to DOCDIR, and from where.
DOCS=(README.md operations.md configuration.md errors.md trust.md examples/sluice.yaml sluice.schema.json)
SOURCES=(README.md docs/operations.md docs/configuration.md docs/errors.md docs/trust.md
         config/sluice.yaml config/sluice.schema.json)

umask 022
say() { [ -n "$PACKAGING" ] || echo "$@"; }

if [ -n "$uninstall" ]; then
  echo "removing from ${DESTDIR:-/}:"
  for path in "$BINDIR/sluice" "$UNITDIR/sluice.service" "$MANDIR/man1/sluice.1" \
              "$BASHCOMPDIR/sluice" "$ZSHCOMPDIR/_sluice" "$FISHCOMPDIR/sluice.fish" \
              "${DOCS[@]/#/$DOCDIR/}"; do
    if [ -e "$DESTDIR$path" ]; then
      rm -f -- "$DESTDIR$path"
      echo "  $path"
    fi
  done
  rmdir --ignore-fail-on-non-empty "$DESTDIR$DOCDIR/examples" "$DESTDIR$DOCDIR" 2>/dev/null || true
  echo "kept: $SYSCONFDIR/sluice/ and $SYSCONFDIR/logrotate.d/sluice (remove them by hand)"
  exit 0
fi

[ -x "$bin" ] || { echo "error: $bin is not executable" >&2; exit 1; }

# Writes standard input to DESTDIR$2 with mode $1, creating the directories.
put() {
  local mode=$1 path=$DESTDIR$2
  install -d -m 0755 "$(dirname "$path")"
  cat > "$path.tmp.$$"
  chmod "$mode" "$path.tmp.$$"
  mv -f "$path.tmp.$$" "$path"
  say "  $2"
}

# Configuration: written unless the administrator already has one (outside packaging).
put_config() {
  local mode=$1 path=$2
  if [ -z "$PACKAGING" ] && [ -e "$DESTDIR$path" ]; then
    cat > /dev/null
    say "  $path (exists, kept)"
  else
    put "$mode" "$path"
  fi
}

say "installing into ${DESTDIR:-/}:"
install -d -m 0755 "$DESTDIR$BINDIR"
install -m 0755 "$bin" "$DESTDIR$BINDIR/sluice"
say "  $BINDIR/sluice"

# The unit's settings name /usr/local/bin/sluice and /etc/sluice/: one source, those paths
# substituted (the comments, which tell how to install by hand, are left as they are).
sed -e "/^[^#]/s|/usr/local/bin/sluice|$BINDIR/sluice|g" -e "/^[^#]/s|/etc/sluice/|$SYSCONFDIR/sluice/|g" \
  systemd/sluice.service | put 0644 "$UNITDIR/sluice.service"

# /etc/sluice/sluice.yaml starts as the embedded default (valid as it is: a forward proxy on
# loopback, port 3128); the documented example with every key goes to the docs.
{
  cat <<EOF
# $SYSCONFDIR/sluice/sluice.yaml: the configuration of the sluice service (sluice.service).
# It starts as a copy of Sluice's embedded default. Every key is shown and explained in
# $DOCDIR/examples/sluice.yaml; the schema for editors is
# $DOCDIR/sluice.schema.json. After editing:
#   sluice check --config $SYSCONFDIR/sluice/sluice.yaml && systemctl reload sluice
# Secrets belong in $SYSCONFDIR/sluice/sluice.env, referenced here as \${NAME}.
#
EOF
  cat config/default.yaml
} | put_config 0644 "$SYSCONFDIR/sluice/sluice.yaml"
put_config 0600 "$SYSCONFDIR/sluice/sluice.env" < systemd/sluice.env
put_config 0644 "$SYSCONFDIR/logrotate.d/sluice" < systemd/sluice.logrotate

if [ -n "$PACKAGING" ]; then
  gzip -9nc "$man" | put 0644 "$MANDIR/man1/sluice.1.gz"
else
  put 0644 "$MANDIR/man1/sluice.1" < "$man"
fi

"$bin" --generate-completion-script bash | put 0644 "$BASHCOMPDIR/sluice"
"$bin" --generate-completion-script zsh | put 0644 "$ZSHCOMPDIR/_sluice"
"$bin" --generate-completion-script fish | put 0644 "$FISHCOMPDIR/sluice.fish"

for i in "${!DOCS[@]}"; do
  put 0644 "$DOCDIR/${DOCS[$i]}" < "${SOURCES[$i]}"
done
