#!/usr/bin/env bash
# Installs what Sluice needs to build and test on Debian 12, and nothing that is already
# there. Needs root (or sudo) for apt-get. Usage: scripts/install-deps.sh [build|test|bench|image]
set -euo pipefail
what=${1:-build}
cd "$(dirname "$0")/.."

packages=(libevent-dev libcurl4-openssl-dev libssl-dev zlib1g-dev libsystemd-dev libcrypt-dev libhiredis-dev liblua5.4-dev pkg-config)
case "$what" in
  # buildah, podman, debootstrap: `make image` and Tests/e2e/test_docker.py build and run the
  # container image without a Docker engine; chromium: Tests/e2e/test_dashboard.py; squid: a
  # parent proxy in Tests/e2e/test_parent_proxy.py; redis-server:
  # the fleet's Redis in Tests/e2e/test_fleet.py (the tests start their own, on loopback);
  # prometheus (with promtool): Tests/e2e/test_monitoring.py checks docs/monitoring/ and
  # scrapes a running Sluice with its own Prometheus on loopback; libjs-chart.js: the
  # dashboard's charts (served by the admin listener, Tests/e2e/test_dashboard.py).
  test)  packages+=(nginx-light curl openssl ca-certificates python3-pip systemd chromium chromium-driver squid
                    adduser binutils buildah podman debootstrap redis-server prometheus libjs-chart.js) ;;
  image) packages+=(buildah podman debootstrap binutils) ;;
  # The benchmark's peers and tools (Benchmarks/bench); Apache Traffic Server is measured where
  # it is installed, not installed here. libnginx-mod-http-lua: nginx-lua in the `lua` scenario.
  bench) packages+=(nginx-light libnginx-mod-http-lua curl wrk haproxy squid tinyproxy strace valgrind binutils
                    openssl iproute2 python3-pip) ;;
esac

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "installing: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

requirements=""
[ "$what" = test ] && requirements=Tests/e2e/requirements.txt
[ "$what" = bench ] && requirements=Benchmarks/requirements.txt
if [ -n "$requirements" ]; then
  # Debian's own python3 refuses plain pip installs (PEP 668); a pyenv python accepts them.
  pip=(python3 -m pip install -q --disable-pip-version-check -r "$requirements")
  "${pip[@]}" 2>/dev/null || "${pip[@]}" --break-system-packages
fi

command -v swift >/dev/null || { echo "error: no Swift 6 toolchain on PATH (https://www.swift.org/install/linux/)" >&2; exit 1; }
