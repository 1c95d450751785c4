#!/usr/bin/env bash
# Benchmarks/run.sh — side-by-side benchmark of Sluice against direct access and
# peer forward proxies (nginx, squid, tinyproxy). DESIGN.md §6–§7.
#
# What it does, all on 127.0.0.1 and every load bounded in time:
#   1. installs what is missing with apt-get (wrk, nginx-light, squid, tinyproxy, curl),
#   2. starts nginx as the upstream (a 1 KiB file and a 1 GiB file),
#   3. starts each proxy in the foreground with a config written to a temp dir:
#      Sluice ($SLUICE_BIN), nginx as a forward proxy, squid (no caching), tinyproxy,
#   4. runs wrk (1 KiB GET) against direct and each proxy at 1, 16, 64, 256
#      connections, interleaved (for each connection count, every target in turn),
#   5. downloads 1 GiB through each target with curl,
#   6. prints markdown tables: req/s, p50, p99, ratio to direct; MB/s and ratio for the
#      download; CPU time per request and RSS for each proxy.
# Progress goes to stderr, the report to stdout:  sudo Benchmarks/run.sh > report.md
# Run it as root on an otherwise idle machine: every row reports how much CPU other
# processes took during it ("other load"), and a busy machine makes the ratios noise.
#
# Environment (all optional):
#   DURATION=10            seconds per wrk run
#   CONNECTIONS="1 16 64 256"
#   CPU_CONN=64            connection count whose run is used for CPU time per request
#   TARGETS="direct sluice sluice-pipeline nginx squid tinyproxy"   subset/order of targets
#                          (sluice-pipeline: Sluice with PIPELINE_YAML, by default three
#                          adapters and the JSON access log to a file)
#   SLUICE_BIN=.build/release/sluice   (relative paths are relative to the repo root)
#   SLUICE_EXTRA_YAML=     YAML appended to Sluice's generated config (e.g. policies:)
#   SQUID_WORKERS=$(nproc) squid SMP workers (1 = classic single process, run with -N)
#   SQUID_EXTRA=           lines appended to squid.conf
#   BASE_PORT=18080        upstream port; proxies use BASE_PORT+1 .. BASE_PORT+4
#   CACHE_DIR=/tmp/sluice-bench-cache   keeps the 1 GiB file between runs
#   BIG=1                  0 skips the 1 GiB download
#   BIG_MAX_TIME=120       curl --max-time for the 1 GiB download (seconds)
#   WRK_TIMEOUT=5s         wrk --timeout
#   PAUSE=1                seconds of rest between runs (lets sockets settle)
#   WARMUP=2               seconds of unmeasured load per target before the runs (0: none)
#   QUIET_WAIT=0           before each run, wait up to this many seconds for other
#                          processes to use < 5% of the CPU (for shared dev machines)
#   KEEP_LOGS=0            1 keeps the temp dir (configs, logs, raw wrk output)
#   NO_INSTALL=0           1 never calls apt-get

set -uo pipefail
export LC_ALL=C
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"
# Never let the environment route our clients through some other proxy.
unset http_proxy HTTP_PROXY https_proxy HTTPS_PROXY all_proxy ALL_PROXY no_proxy NO_PROXY

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)

DURATION=${DURATION:-10}
CONNECTIONS=${CONNECTIONS:-"1 16 64 256"}
CPU_CONN=${CPU_CONN:-64}
TARGETS=${TARGETS:-"direct sluice sluice-pipeline nginx squid tinyproxy"}
SLUICE_BIN=${SLUICE_BIN:-.build/release/sluice}
SLUICE_EXTRA_YAML=${SLUICE_EXTRA_YAML:-}
BASE_PORT=${BASE_PORT:-18080}
CACHE_DIR=${CACHE_DIR:-/tmp/sluice-bench-cache}
BIG=${BIG:-1}
BIG_MAX_TIME=${BIG_MAX_TIME:-120}
WRK_TIMEOUT=${WRK_TIMEOUT:-5s}
NCPU=$(nproc 2>/dev/null || echo 2)
SQUID_WORKERS=${SQUID_WORKERS:-$NCPU}
SQUID_EXTRA=${SQUID_EXTRA:-}
PAUSE=${PAUSE:-1}
WARMUP=${WARMUP:-2}
QUIET_WAIT=${QUIET_WAIT:-0}
KEEP_LOGS=${KEEP_LOGS:-0}
NO_INSTALL=${NO_INSTALL:-0}

case "$SLUICE_BIN" in /*) ;; *) SLUICE_BIN="$REPO/$SLUICE_BIN" ;; esac

UP_PORT=$BASE_PORT
declare -A PORT=(
    [direct]=$BASE_PORT
    [sluice]=$((BASE_PORT + 1))
    [nginx]=$((BASE_PORT + 2))
    [squid]=$((BASE_PORT + 3))
    [tinyproxy]=$((BASE_PORT + 4))
    [sluice-pipeline]=$((BASE_PORT + 6))
)
UP_AUTH="127.0.0.1:$UP_PORT"
SMALL_URL="http://$UP_AUTH/1k"
BIG_URL="http://$UP_AUTH/1g"
BIG_FILE="$CACHE_DIR/1GiB.bin"
BIG_SIZE=$((1024 * 1024 * 1024))

log()  { printf '== %s\n' "$*" >&2; }
warn() { printf '!! %s\n' "$*" >&2; }
die()  { printf '!! fatal: %s\n' "$*" >&2; exit 1; }

for t in $TARGETS; do
    [[ -n "${PORT[$t]:-}" ]] || die "unknown target '$t' in TARGETS (known: ${!PORT[*]})"
done
[[ "$DURATION" =~ ^[0-9]+$ && "$DURATION" -ge 1 ]] || die "DURATION must be a whole number of seconds >= 1"
(( BASE_PORT + 4 < 32768 )) || die "BASE_PORT must leave BASE_PORT+4 below 32768 (the ephemeral port range)"

IS_ROOT=0
[[ $(id -u) -eq 0 ]] && IS_ROOT=1

# ---------------------------------------------------------------------------
# Process bookkeeping and cleanup
# ---------------------------------------------------------------------------
declare -A PID=()        # target/name -> pid of the foreground process we started
declare -A STATUS=()     # target -> "" (ok) or the reason it is n/a
TMP=""
POLICY_RC_CREATED=0

descendants() {          # pid and all its descendants, one per line
    local root=$1
    ps -e -o pid=,ppid= 2>/dev/null | awk -v root="$root" '
        { parent[$1] = $2; pids[NR] = $1 }
        END {
            keep[root] = 1; print root; changed = 1
            while (changed) {
                changed = 0
                for (i in pids) { p = pids[i]
                    if (!(p in keep) && (parent[p] in keep)) { keep[p] = 1; print p; changed = 1 } }
            }
        }'
}

starttime() {           # a process's start time (field 22 of /proc/PID/stat): tells a pid from its reuse
    local s; local -a f
    s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    s=${s##*) }; read -r -a f <<< "$s"; echo "${f[19]}"
}

stop_pid() {             # TERM a process tree we started, KILL what is left of it after 5 s
    local pid=$1 p i st
    local -a tree=()
    kill -0 "$pid" 2>/dev/null || return 0
    for p in $(descendants "$pid"); do
        st=$(starttime "$p") && tree+=("$p:$st")
    done
    kill -TERM "$pid" 2>/dev/null
    for ((i = 0; i < 50; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    # Whatever of that tree is still there (same pid *and* start time: not a reused pid).
    for p in "${tree[@]}"; do
        [[ "$(starttime "${p%%:*}")" == "${p#*:}" ]] && kill -KILL "${p%%:*}" 2>/dev/null
    done
    wait "$pid" 2>/dev/null
    return 0
}

cleanup() {
    local rc=$? name
    trap - EXIT INT TERM
    for name in "${!PID[@]}"; do stop_pid "${PID[$name]}"; done
    if (( POLICY_RC_CREATED )); then rm -f /usr/sbin/policy-rc.d; fi
    if [[ -n "$TMP" && -d "$TMP" ]]; then
        if [[ "$KEEP_LOGS" == 1 ]]; then log "logs and configs kept in $TMP"; else rm -rf "$TMP"; fi
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'warn "interrupted"; exit 130' INT TERM

# ---------------------------------------------------------------------------
# 1. Install what is missing
# ---------------------------------------------------------------------------
install_missing() {
    local -a missing=()
    command -v wrk       >/dev/null || missing+=(wrk)
    command -v curl      >/dev/null || missing+=(curl)
    command -v nginx     >/dev/null || missing+=(nginx-light)
    command -v squid     >/dev/null || missing+=(squid)
    command -v tinyproxy >/dev/null || missing+=(tinyproxy)
    command -v ps        >/dev/null || missing+=(procps)
    (( ${#missing[@]} == 0 )) && return 0
    if [[ "$NO_INSTALL" == 1 ]]; then warn "missing: ${missing[*]} (NO_INSTALL=1, not installing)"; return 0; fi
    if (( ! IS_ROOT )); then warn "missing: ${missing[*]}; run as root to install them"; return 0; fi
    log "installing: ${missing[*]}"
    # Keep the packages' own services from starting: this benchmark runs its own instances.
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d \
            && POLICY_RC_CREATED=1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2 || warn "apt-get update failed"
    local pkg
    for pkg in "${missing[@]}"; do
        # One at a time: a peer that fails to install is reported as n/a, not fatal.
        if ! apt-get install -y -qq --no-install-recommends "$pkg" >&2; then
            if [[ "$pkg" == nginx-light ]]; then
                apt-get install -y -qq --no-install-recommends nginx >&2 || warn "could not install nginx"
            else
                warn "could not install $pkg"
            fi
        fi
    done
    if (( POLICY_RC_CREATED )); then rm -f /usr/sbin/policy-rc.d; POLICY_RC_CREATED=0; fi
}
install_missing
command -v wrk   >/dev/null || die "wrk is not installed"
command -v curl  >/dev/null || die "curl is not installed"
command -v nginx >/dev/null || die "nginx is not installed (needed for the upstream)"
command -v ps    >/dev/null || die "ps (procps) is not installed"

# ---------------------------------------------------------------------------
# 2. Files and the upstream
# ---------------------------------------------------------------------------
TMP=$(mktemp -d /tmp/sluice-bench.XXXXXX) || die "mktemp failed"
# Workers of nginx (nobody), squid (proxy) and tinyproxy (nobody) must traverse it.
chmod 755 "$TMP"
mkdir -p "$TMP/www" "$TMP/logs"
head -c 1024 /dev/urandom | base64 -w 0 | head -c 1024 > "$TMP/www/1k"
chmod 644 "$TMP/www/1k"

mkdir -p "$CACHE_DIR" && chmod 755 "$CACHE_DIR" || die "cannot create $CACHE_DIR"
if [[ "$BIG" == 1 ]]; then
    if [[ ! -f "$BIG_FILE" || $(stat -c %s "$BIG_FILE") -ne $BIG_SIZE ]]; then
        log "creating the 1 GiB file $BIG_FILE (once; kept for later runs)"
        head -c "$BIG_SIZE" /dev/urandom > "$BIG_FILE.part" && mv "$BIG_FILE.part" "$BIG_FILE" \
            || die "cannot create $BIG_FILE"
    fi
    chmod 644 "$BIG_FILE"
    cat "$BIG_FILE" > /dev/null   # into the page cache, so the disk is not what we measure
fi

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_port() {            # wait_port PORT PID SECONDS
    local port=$1 pid=$2 secs=$3 i
    for ((i = 0; i < secs * 10; i++)); do
        kill -0 "$pid" 2>/dev/null || return 1
        port_open "$port" && return 0
        sleep 0.1
    done
    return 1
}

start_bg() {             # start_bg NAME LOGFILE CMD...  (foreground process, under our control)
    local name=$1 logf=$2; shift 2
    "$@" > "$logf" 2>&1 < /dev/null &
    PID[$name]=$!
}

for t in "${!PORT[@]}"; do
    if [[ " $TARGETS " == *" $t "* ]] || [[ $t == direct ]]; then
        port_open "${PORT[$t]}" && die "port ${PORT[$t]} (for $t) is already in use; set BASE_PORT"
    fi
done

nginx_common() {         # shared top of both nginx configs: nginx_common DIR
    local d=$1
    cat <<EOF
worker_processes auto;
daemon off;
master_process on;
pid $d/nginx.pid;
error_log $d/error.log warn;
worker_rlimit_nofile 65536;
events { worker_connections 8192; }
EOF
}
nginx_http_common() {
    local d=$1
    cat <<EOF
    access_log off;
    default_type application/octet-stream;
    client_body_temp_path $d/client_body;
    proxy_temp_path       $d/proxy;
    fastcgi_temp_path     $d/fastcgi;
    uwsgi_temp_path       $d/uwsgi;
    scgi_temp_path        $d/scgi;
    keepalive_requests 1000000;
    keepalive_timeout 75s;
    tcp_nodelay on;
EOF
}

start_upstream() {
    local d="$TMP/upstream"
    mkdir -p "$d"
    {
        nginx_common "$d"
        cat <<EOF
http {
$(nginx_http_common "$d")
    sendfile on;
    tcp_nopush on;
    server {
        listen 127.0.0.1:$UP_PORT backlog=4096;
        root $TMP/www;
        location = /1g { alias $BIG_FILE; }
    }
}
EOF
    } > "$d/nginx.conf"
    start_bg upstream "$TMP/logs/upstream.log" nginx -e "$d/error.log" -p "$d" -c "$d/nginx.conf"
    wait_port "$UP_PORT" "${PID[upstream]}" 10 || { cat "$TMP/logs/upstream.log" "$d/error.log" >&2 2>/dev/null; die "upstream nginx did not start"; }
    local got
    got=$(curl -s -o /dev/null --max-time 5 -w '%{http_code} %{size_download}' "$SMALL_URL")
    [[ "$got" == "200 1024" ]] || die "upstream check failed: $got"
    log "upstream nginx on $UP_AUTH (pid ${PID[upstream]})"
}

# ---------------------------------------------------------------------------
# 3. The proxies
# The pipeline DESIGN §7 asks Sluice to be measured with: three adapters and the JSON
# access log (to a file, as in production).
default_pipeline_yaml() {
    cat <<EOF
monitors:
  - access_log: { path: $TMP/sluice-pipeline/access.log }
policies:
  default:
    adapters:
      - headers: { set: { X-Forwarded-By: sluice }, remove: [X-Debug] }
      - bearer: bench-token-0123456789
      - api_key: { header: X-Api-Key, value: bench-key-0123456789 }
EOF
}

# ---------------------------------------------------------------------------
start_sluice() {
    local name=${1:-sluice} extra=${2:-$SLUICE_EXTRA_YAML}
    local port=${PORT[$name]} d="$TMP/$name"
    if [[ ! -x "$SLUICE_BIN" ]]; then
        STATUS[$name]="n/a (no binary at $SLUICE_BIN; build it with 'swift build -c release')"
        return 1
    fi
    mkdir -p "$d"
    cat > "$d/sluice.yaml" <<EOF
# generated by Benchmarks/run.sh
listen: ["127.0.0.1:$port"]
workers: auto
access:
  allow_clients: [127.0.0.0/8]
$extra
EOF
    start_bg "$name" "$TMP/logs/$name.log" "$SLUICE_BIN" run --config "$d/sluice.yaml"
    wait_port "$port" "${PID[$name]}" 15
}

start_nginx_proxy() {
    local port=${PORT[nginx]} d="$TMP/nginx"
    mkdir -p "$d"
    {
        nginx_common "$d"
        cat <<EOF
http {
$(nginx_http_common "$d")
    # nginx is not a general forward proxy; this is its best case: absolute-form
    # requests (nginx accepts them and routes on the path) sent to one fixed
    # upstream over a pool of kept-alive connections.
    upstream origin {
        server $UP_AUTH;
        keepalive 1024;
        keepalive_requests 1000000;
        keepalive_timeout 60s;
    }
    server {
        listen 127.0.0.1:$port backlog=4096;
        location / {
            proxy_pass http://origin;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host \$http_host;
            # Stream large bodies through memory buffers, never through a temp file.
            proxy_max_temp_file_size 0;
        }
    }
}
EOF
    } > "$d/nginx.conf"
    start_bg nginx "$TMP/logs/nginx.log" nginx -e "$d/error.log" -p "$d" -c "$d/nginx.conf"
    wait_port "$port" "${PID[nginx]}" 10
}

start_squid() {
    local port=${PORT[squid]} d="$TMP/squid" workers=$SQUID_WORKERS
    command -v squid >/dev/null || { STATUS[squid]="n/a (squid not installed)"; return 1; }
    mkdir -p "$d"
    cat > "$d/squid.conf" <<EOF
# generated by Benchmarks/run.sh: a pure forwarding squid (no caching, no logging)
http_port 127.0.0.1:$port
visible_hostname sluice-bench
workers $workers
pid_filename $d/squid.pid
cache_log $d/cache.log
access_log none
cache_store_log none
logfile_rotate 0
coredump_dir $d
# No caching at all: nothing stored in memory, no cache_dir (so no disk cache).
cache deny all
cache_mem 0 MB
# Per-request bookkeeping the other proxies do not do: per-client-IP tables, ICMP
# pinger helper.
client_db off
pinger_enable off
max_filedescriptors 65536
shutdown_lifetime 0 seconds
http_access allow localhost
http_access deny all
$SQUID_EXTRA
EOF
    # Run as root, squid drops to its cache_effective_user (proxy) and must then write here.
    if (( IS_ROOT )) && id proxy >/dev/null 2>&1; then chown -R proxy: "$d"; fi
    if (( workers > 1 )); then
        # SMP (one worker per core, like nginx and Sluice): -N would disable it, so run
        # the master with --foreground instead; it stays our child and takes its kids
        # down on SIGTERM. The kids talk over UNIX sockets in squid's state dir.
        if [[ ! -d /run/squid ]] && (( IS_ROOT )); then
            mkdir -p /run/squid && chown proxy: /run/squid
        fi
        start_bg squid "$TMP/logs/squid.log" squid --foreground -f "$d/squid.conf"
    else
        # -N: no daemon, one process, stays our child.
        start_bg squid "$TMP/logs/squid.log" squid -N -f "$d/squid.conf"
    fi
    wait_port "$port" "${PID[squid]}" 20
}

start_tinyproxy() {
    local port=${PORT[tinyproxy]} d="$TMP/tinyproxy" user="" group=""
    command -v tinyproxy >/dev/null || { STATUS[tinyproxy]="n/a (tinyproxy not installed)"; return 1; }
    mkdir -p "$d"
    if (( IS_ROOT )); then
        user=nobody; group=$(id -gn nobody 2>/dev/null || echo nogroup)
        chown "$user:$group" "$d"
    fi
    {
        [[ -n "$user" ]] && printf 'User %s\nGroup %s\n' "$user" "$group"
        cat <<EOF
Port $port
Listen 127.0.0.1
Timeout 600
# Default is 100; the 256-connection runs need more or clients queue in the backlog.
MaxClients 1024
LogFile "$d/tinyproxy.log"
LogLevel Error
PidFile "$d/tinyproxy.pid"
Allow 127.0.0.1
ViaProxyName "tinyproxy"
EOF
    } > "$d/tinyproxy.conf"
    # -d: stay in the foreground.
    start_bg tinyproxy "$TMP/logs/tinyproxy.log" tinyproxy -d -c "$d/tinyproxy.conf"
    wait_port "$port" "${PID[tinyproxy]}" 10
}

check_proxy() {          # a real request through it before we measure anything
    local t=$1 got
    got=$(curl -s -o /dev/null --max-time 5 -w '%{http_code} %{size_download}' \
        -x "http://127.0.0.1:${PORT[$t]}" "$SMALL_URL")
    [[ "$got" == "200 1024" ]] && return 0
    STATUS[$t]="n/a (check through the proxy gave '$got', expected '200 1024')"
    return 1
}

tail_logs() {            # the last lines a failed target wrote
    local t=$1 f
    for f in "$TMP/logs/$t.log" "$TMP/$t"/*.log; do
        [[ -s "$f" ]] && { warn "--- $f"; tail -n 15 "$f" >&2; }
    done
}

start_upstream
ACTIVE=()
for t in $TARGETS; do
    [[ $t == direct ]] && { ACTIVE+=(direct); STATUS[direct]=""; continue; }
    STATUS[$t]=""
    ok=0
    case $t in
        sluice)    start_sluice sluice && ok=1 ;;
        sluice-pipeline) start_sluice sluice-pipeline "${PIPELINE_YAML:-$(default_pipeline_yaml)}" && ok=1 ;;
        nginx)     start_nginx_proxy && ok=1 ;;
        squid)     start_squid && ok=1 ;;
        tinyproxy) start_tinyproxy && ok=1 ;;
    esac
    if (( ok )) && check_proxy "$t"; then
        ACTIVE+=("$t")
        log "$t on 127.0.0.1:${PORT[$t]} (pid ${PID[$t]})"
    else
        if [[ -z "${STATUS[$t]}" ]]; then
            why=$(cat "$TMP/logs/$t.log" "$TMP/$t"/*.log 2>/dev/null | grep -m1 -iE 'fatal|emerg|error|cannot|unable' | cut -c1-160)
            STATUS[$t]="n/a (did not start${why:+: $why})"
        fi
        warn "$t: ${STATUS[$t]}"
        [[ -n "${PID[$t]:-}" ]] && { tail_logs "$t"; stop_pid "${PID[$t]}"; unset "PID[$t]"; }
    fi
done

# ---------------------------------------------------------------------------
# Resource sampling: CPU ticks and RSS of a process tree we started
# ---------------------------------------------------------------------------
CLK_TCK=$(getconf CLK_TCK 2>/dev/null || echo 100)

cpu_ticks() {            # utime+stime of the whole tree, in clock ticks
    local p total=0 s
    local -a f
    for p in $(descendants "$1"); do
        s=$(cat "/proc/$p/stat" 2>/dev/null) || continue
        s=${s##*) }                      # drop "pid (comm) ", comm may hold spaces
        read -r -a f <<< "$s"            # f[0] = state (field 3) ... f[11] = utime, f[12] = stime
        total=$((total + f[11] + f[12]))
    done
    echo "$total"
}

rss_kib() {              # VmRSS summed over the tree (nginx: master + workers)
    local p total=0 v
    for p in $(descendants "$1"); do
        v=$(awk '/^VmRSS:/ { print $2 }' "/proc/$p/status" 2>/dev/null)
        total=$((total + ${v:-0}))
    done
    echo "$total"
}

alive() { [[ -n "${PID[$1]:-}" ]] && kill -0 "${PID[$1]}" 2>/dev/null; }

declare -A RSS_IDLE=() RSS_LOAD=() RSS_BIG=() CPU_US=()
for t in "${ACTIVE[@]}"; do
    [[ $t == direct ]] && continue
    RSS_IDLE[$t]=$(rss_kib "${PID[$t]}")
done

# ---------------------------------------------------------------------------
# 4. wrk, interleaved
# ---------------------------------------------------------------------------
declare -A RPS=() P50=() P99=() ERRS=() OTHER=()

total_ticks() {          # "busy total" CPU ticks of the machine so far, from /proc/stat's cpu line
    awk '/^cpu / { t = 0; for (i = 2; i <= NF; i++) t += $i; print t - $5 - $6, t; exit }' /proc/stat
}
others_snapshot() {      # FILE: "pid:starttime ticks comm" of every process that is not ours
    # ticks = utime+stime+cutime+cstime, so a compiler that ran and was reaped in
    # between still shows up, in its parent's cutime.
    local ours
    ours=" $(descendants $$ | tr '\n' ' ') "
    cat /proc/[0-9]*/stat 2>/dev/null | awk -v ours="$ours" '
        { pid = $1; if (index(ours, " " pid " ")) next
          line = $0; sub(/^.*\) /, "", line); split(line, f, " ")
          comm = $0; sub(/^[^(]*\(/, "", comm); sub(/\) [^)]*$/, "", comm); gsub(/ /, "_", comm)
          print pid ":" f[20], f[12] + f[13] + f[14] + f[15], comm }' > "$1"
}
others_ticks() {         # CPU ticks used by processes not ours between two snapshots
    awk 'NR == FNR { a[$1] = $2; next } { d = $2 - (($1 in a) ? a[$1] : 0); if (d > 0) s += d } END { print s + 0 }' "$1" "$2"
}
others_top() {           # the processes behind others_ticks, busiest first
    awk 'NR == FNR { a[$1] = $2; next } { d = $2 - (($1 in a) ? a[$1] : 0); if (d > 0) print d, $3, $1 }' "$1" "$2" \
        | sort -rn | head -n 5 | awk '{ split($3, p, ":"); printf "   %5d ticks  pid %-7s %s\n", $1, p[1], $2 }'
}
other_pct() {            # other_pct SNAP0 SNAP1 "BUSY0 TOTAL0" "BUSY1 TOTAL1" [OURS]: % of the CPU used by others
    # Two estimates, each too high in its own way, so take the smaller: the sum over
    # other processes (a parent that reaps a long-lived child gets all of that child's
    # time at once in cutime) and what the machine was busy with minus our own
    # processes' time OURS (softirq time charged to nobody lands here).
    local o b0 t0 b1 t1 ours=${5:-0}
    o=$(others_ticks "$1" "$2"); read -r b0 t0 <<< "$3"; read -r b1 t1 <<< "$4"
    awk -v o="$o" -v b=$((b1 - b0 - ours)) -v t=$((t1 - t0)) \
        'BEGIN { if (b < 0) b = 0; if (o > b) o = b; printf "%.0f", (t > 0 ? o * 100 / t : 0) }'
}
reaped_ticks() {         # cutime+cstime of this shell: CPU of the children it has waited for (wrk)
    local s; local -a f
    s=$(cat "/proc/$$/stat"); s=${s##*) }; read -r -a f <<< "$s"
    echo $((f[13] + f[14]))
}

wait_quiet() {           # up to QUIET_WAIT seconds for other processes to drop below 5% of the CPU
    local waited=0 a b pct
    (( QUIET_WAIT > 0 )) || return 0
    while (( waited < QUIET_WAIT )); do
        others_snapshot "$TMP/quiet.0"; a=$(total_ticks); sleep 1
        b=$(total_ticks); others_snapshot "$TMP/quiet.1"
        pct=$(other_pct "$TMP/quiet.0" "$TMP/quiet.1" "$a" "$b")
        (( pct < 5 )) && return 0
        (( waited == 0 )) && log "waiting for other processes to quiet down (${pct}% of the CPU)"
        waited=$((waited + 1))
    done
    warn "still busy after ${QUIET_WAIT}s; measuring anyway"
}

run_wrk() {              # run_wrk TARGET CONNECTIONS
    local t=$1 c=$2 threads=2 out path res kv errs="" e
    local tot0 tot1 p0=0 p1=0 u0 u1 w0 w1
    (( c < threads )) && threads=$c
    out="$TMP/logs/wrk-$t-$c.txt"
    if [[ $t == direct ]]; then path=/1k; else path=$SMALL_URL; fi
    others_snapshot "$TMP/others.0"; tot0=$(total_ticks)
    u0=$(cpu_ticks "${PID[upstream]}"); w0=$(reaped_ticks)
    [[ $t != direct ]] && p0=$(cpu_ticks "${PID[$t]}")
    BENCH_PATH=$path BENCH_HOST=$UP_AUTH \
        timeout --foreground $((DURATION + 30)) \
        wrk -t"$threads" -c"$c" -d"${DURATION}s" --timeout "$WRK_TIMEOUT" --latency \
            -s "$HERE/absolute.lua" "http://127.0.0.1:${PORT[$t]}/" > "$out" 2>&1
    [[ $t != direct ]] && p1=$(cpu_ticks "${PID[$t]}")
    u1=$(cpu_ticks "${PID[upstream]}"); w1=$(reaped_ticks)
    tot1=$(total_ticks); others_snapshot "$TMP/others.1"
    res=$(grep -m1 '^BENCH_RESULT ' "$out") || { warn "wrk gave no result for $t/$c:"; tail -n 5 "$out" >&2; return 1; }
    local -A r=()
    for kv in ${res#BENCH_RESULT }; do r[${kv%%=*}]=${kv#*=}; done
    RPS[$t:$c]=$(awk -v n="${r[requests]}" -v d="${r[duration_us]}" 'BEGIN { printf "%.0f", (d > 0 ? n / (d / 1e6) : 0) }')
    P50[$t:$c]=${r[p50_us]}
    P99[$t:$c]=${r[p99_us]}
    for e in connect read write status timeout; do
        [[ ${r[err_$e]} -gt 0 ]] && errs+="${errs:+, }$e ${r[err_$e]}"
    done
    ERRS[$t:$c]=${errs:-0}
    # CPU the machine spent on processes that are not ours (another build, a test
    # suite...) while wrk ran: if it is more than a few %, the row is not trustworthy.
    OTHER[$t:$c]=$(other_pct "$TMP/others.0" "$TMP/others.1" "$tot0" "$tot1" $(( (p1 - p0) + (u1 - u0) + (w1 - w0) )))
    if [[ $t != direct && ${r[requests]} -gt 0 ]]; then
        CPU_US[$t:$c]=$(awk -v t=$((p1 - p0)) -v hz="$CLK_TCK" -v n="${r[requests]}" \
            'BEGIN { printf "%.1f", t * 1e6 / hz / n }')
    fi
    log "$(printf '%-10s c=%-4s %8s req/s  p50 %6s us  p99 %7s us  cpu/req %6s us  other load %3s%%  errors: %s' \
        "$t" "$c" "${RPS[$t:$c]}" "${P50[$t:$c]}" "${P99[$t:$c]}" "${CPU_US[$t:$c]:--}" "${OTHER[$t:$c]}" "${ERRS[$t:$c]}")"
}

# Is anything else eating CPU (a compiler, say)? Then the numbers are noise.
others_snapshot "$TMP/others.0"; t0=$(total_ticks); sleep 2; t1=$(total_ticks); others_snapshot "$TMP/others.1"
IDLE_BUSY=$(other_pct "$TMP/others.0" "$TMP/others.1" "$t0" "$t1")
if (( IDLE_BUSY > 5 )); then
    warn "other processes use ${IDLE_BUSY}% of the CPU before any load: results will be noisy"
    others_top "$TMP/others.0" "$TMP/others.1" >&2
fi

n_runs=$(( $(wc -w <<< "$CONNECTIONS") * ${#ACTIVE[@]} ))
log "wrk: ${#ACTIVE[@]} targets x connections ($CONNECTIONS), ${DURATION}s each: about $(( n_runs * (DURATION + PAUSE) ))s"
if (( WARMUP > 0 )); then
    log "warm-up: ${WARMUP}s at 16 connections per target (not measured)"
    for t in "${ACTIVE[@]}"; do
        if [[ $t == direct ]]; then path=/1k; else path=$SMALL_URL; fi
        BENCH_PATH=$path BENCH_HOST=$UP_AUTH timeout --foreground $((WARMUP + 30)) \
            wrk -t2 -c16 -d"${WARMUP}s" -s "$HERE/absolute.lua" "http://127.0.0.1:${PORT[$t]}/" \
            > "$TMP/logs/warmup-$t.txt" 2>&1
    done
    sleep "$PAUSE"
fi
for c in $CONNECTIONS; do
    for t in "${ACTIVE[@]}"; do
        if [[ $t != direct ]] && ! alive "$t"; then
            [[ -n "${STATUS[$t]}" ]] || { STATUS[$t]="n/a (exited during the run)"; warn "$t exited"; tail_logs "$t"; }
            continue
        fi
        sleep "$PAUSE"
        wait_quiet
        run_wrk "$t" "$c"
    done
done
for t in "${ACTIVE[@]}"; do
    [[ $t == direct ]] && continue
    alive "$t" && RSS_LOAD[$t]=$(rss_kib "${PID[$t]}")
done

# ---------------------------------------------------------------------------
# 5. 1 GiB through each target
# ---------------------------------------------------------------------------
declare -A BIG_MBS=() BIG_NOTE=() BIG_OTHER=()
if [[ "$BIG" == 1 ]]; then
    for t in "${ACTIVE[@]}"; do
        if [[ $t != direct ]] && ! alive "$t"; then continue; fi
        proxy=(); p0=0; p1=0
        [[ $t != direct ]] && proxy=(-x "http://127.0.0.1:${PORT[$t]}")
        sleep "$PAUSE"
        wait_quiet
        others_snapshot "$TMP/others.0"; tot0=$(total_ticks)
        u0=$(cpu_ticks "${PID[upstream]}"); w0=$(reaped_ticks)
        [[ $t != direct ]] && p0=$(cpu_ticks "${PID[$t]}")
        res=$(curl -s -o /dev/null --max-time "$BIG_MAX_TIME" "${proxy[@]}" \
            -w '%{speed_download} %{size_download} %{http_code}' "$BIG_URL")
        rc=$?
        [[ $t != direct ]] && p1=$(cpu_ticks "${PID[$t]}")
        u1=$(cpu_ticks "${PID[upstream]}"); w1=$(reaped_ticks)
        tot1=$(total_ticks); others_snapshot "$TMP/others.1"
        BIG_OTHER[$t]=$(other_pct "$TMP/others.0" "$TMP/others.1" "$tot0" "$tot1" $(( (p1 - p0) + (u1 - u0) + (w1 - w0) )))
        read -r speed size code <<< "$res"
        BIG_MBS[$t]=$(awk -v s="${speed:-0}" 'BEGIN { printf "%.0f", s / 1e6 }')
        if (( rc == 28 )); then BIG_NOTE[$t]="timed out after ${BIG_MAX_TIME}s ($size bytes)"
        elif (( rc != 0 )); then BIG_NOTE[$t]="curl exit $rc ($size bytes)"
        elif [[ "$code" != 200 || "$size" != "$BIG_SIZE" ]]; then BIG_NOTE[$t]="HTTP $code, $size bytes"
        fi
        log "$(printf '%-10s 1 GiB: %5s MB/s  other load %3s%%  %s' "$t" "${BIG_MBS[$t]}" "${BIG_OTHER[$t]}" "${BIG_NOTE[$t]:-}")"
        [[ $t != direct ]] && alive "$t" && RSS_BIG[$t]=$(rss_kib "${PID[$t]}")
    done
fi

# ---------------------------------------------------------------------------
# 6. Report (stdout)
# ---------------------------------------------------------------------------
fmt_us() {               # microseconds -> "123 µs" / "1.23 ms"
    awk -v u="$1" 'BEGIN { if (u < 1000) printf "%d µs", u; else if (u < 100000) printf "%.2f ms", u / 1000; else printf "%.0f ms", u / 1000 }'
}
ratio() {                # ratio A B with two decimals, or n/a
    awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || b + 0 == 0) print "n/a"; else printf "%.2f", a / b }'
}
mib() { awk -v k="$1" 'BEGIN { if (k == "") print "n/a"; else printf "%.1f MiB", k / 1024 }'; }

sluice_rev=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo "no commit")
git -C "$REPO" diff --quiet HEAD -- Sources Package.swift 2>/dev/null || sluice_rev+=" (+ uncommitted changes)"
ver() { "$@" 2>&1 | head -n1; }
echo "# Sluice benchmark"
echo
echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC'); host: $(nproc) cores, $(uname -sr), $(. /etc/os-release 2>/dev/null; echo "${PRETTY_NAME:-?}")"
echo "- sluice: ${SLUICE_BIN#"$REPO"/} @ $sluice_rev; $(ver wrk -v | awk '{print $1, $2}'); $(ver nginx -v | sed 's/^nginx version: //'); $(command -v squid >/dev/null && ver squid -v | sed 's/Squid Cache: Version /squid /'); $(command -v tinyproxy >/dev/null && ver tinyproxy -v)"
echo "- wrk: ${DURATION}s per run, 2 threads (1 for 1 connection), targets interleaved per connection count; 1 KiB GET; all on 127.0.0.1, wrk, upstream nginx and proxy share the cores"
echo
echo "## 1 KiB GET (wrk)"
echo
echo "| target | connections | req/s | p50 | p99 | ratio to direct | proxy CPU/req | other load | errors |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
for c in $CONNECTIONS; do
    for t in $TARGETS; do
        k="$t:$c"
        if [[ -n "${RPS[$k]:-}" ]]; then
            cpu=${CPU_US[$k]:-}; [[ -n "$cpu" ]] && cpu="$cpu µs" || cpu="–"
            printf '| %s | %s | %s | %s | %s | %s | %s | %s%% | %s |\n' "$t" "$c" "${RPS[$k]}" \
                "$(fmt_us "${P50[$k]}")" "$(fmt_us "${P99[$k]}")" \
                "$(ratio "${RPS[$k]}" "${RPS[direct:$c]:-}")" "$cpu" "${OTHER[$k]}" "${ERRS[$k]}"
        else
            printf '| %s | %s | n/a | n/a | n/a | n/a | n/a | | |\n' "$t" "$c"
        fi
    done
done
echo
echo "- proxy CPU/req: utime+stime of the proxy's processes during the run / requests completed."
echo "- other load: share of the machine's CPU (all cores) used during the run by processes this script did not start (a build, a test suite); above a few % the row is noisy."
echo "- errors: wrk socket errors and HTTP statuses > 399 (status). A proxy that closes the connection after each response without sending \`Connection: close\` (tinyproxy) shows one read error per request: wrk finds the connection closed when it sends the next request and reconnects; the responses it counted were complete."
(( IDLE_BUSY > 5 )) && echo "- **warning:** other processes used ${IDLE_BUSY}% of the CPU just before the load started; the results are noisy."

if [[ "$BIG" == 1 ]]; then
    echo
    echo "## 1 GiB download (curl)"
    echo
    echo "| target | MB/s | ratio to direct | other load | note |"
    echo "| --- | ---: | ---: | ---: | --- |"
    for t in $TARGETS; do
        if [[ -n "${BIG_MBS[$t]:-}" ]]; then
            printf '| %s | %s | %s | %s%% | %s |\n' "$t" "${BIG_MBS[$t]}" \
                "$(ratio "${BIG_MBS[$t]}" "${BIG_MBS[direct]:-}")" "${BIG_OTHER[$t]}" "${BIG_NOTE[$t]:-}"
        else
            printf '| %s | n/a | n/a | | |\n' "$t"
        fi
    done
    echo
    echo "One download per target, \`curl -s -o /dev/null\` (through the proxy with \`-x\`), the file in the page cache; MB = 10^6 bytes; curl shares the cores too."
fi

echo
echo "## Proxy resources"
echo
big_col=""; big_sep=""
[[ "$BIG" == 1 ]] && { big_col=" RSS after 1 GiB |"; big_sep=" ---: |"; }
echo "| proxy | CPU per request (at $CPU_CONN conns) | RSS idle | RSS after wrk |$big_col"
echo "| --- | ---: | ---: | ---: |$big_sep"
for t in $TARGETS; do
    [[ $t == direct ]] && continue
    cpu=${CPU_US[$t:$CPU_CONN]:-}
    [[ -n "$cpu" ]] && cpu="$cpu µs" || cpu="n/a"
    printf '| %s | %s | %s | %s |' "$t" "$cpu" "$(mib "${RSS_IDLE[$t]:-}")" "$(mib "${RSS_LOAD[$t]:-}")"
    [[ "$BIG" == 1 ]] && printf ' %s |' "$(mib "${RSS_BIG[$t]:-}")"
    echo
done
echo
echo "CPU: utime+stime of the proxy's processes (/proc/PID/stat, ${CLK_TCK} Hz ticks) over the $CPU_CONN-connection run, divided by the requests wrk completed. RSS: VmRSS summed over the proxy's processes (nginx: master + workers; squid: master, coordinator, workers), so pages they share are counted more than once."

if [[ " ${ACTIVE[*]} " == *" sluice "* ]]; then
    echo
    echo "## Sluice against its goals (DESIGN.md §7)"
    echo
    echo "| goal | target | measured |"
    echo "| --- | --- | --- |"
    echo "| throughput at 64 connections | ≥ 0.70 of direct | $(ratio "${RPS[sluice:64]:-}" "${RPS[direct:64]:-}") |"
    echo "| CPU per request | ≤ 12 µs | ${CPU_US[sluice:$CPU_CONN]:-n/a} µs |"
    echo "| 1 GiB streaming | ≥ 0.55 of direct | $(ratio "${BIG_MBS[sluice]:-}" "${BIG_MBS[direct]:-}") |"
    echo "| RSS idle | ≤ 20 MiB | $(mib "${RSS_IDLE[sluice]:-}") |"
fi

na=0
for t in $TARGETS; do [[ -n "${STATUS[$t]:-}" ]] && na=1; done
if (( na )); then
    echo
    echo "## Not measured"
    echo
    for t in $TARGETS; do [[ -n "${STATUS[$t]:-}" ]] && echo "- $t: ${STATUS[$t]}"; done
fi
exit 0
