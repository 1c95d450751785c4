#!/usr/bin/env bash
# Benchmarks/run.sh — side-by-side benchmark of Sluice against direct access and
# peer forward proxies (haproxy, nginx, Apache Traffic Server; squid and tinyproxy on
# request), against the engine's targets.
#
# What it does, all on 127.0.0.1, every load bounded in count and time:
#   1. installs what is missing with apt-get (wrk, nginx-light, curl, python3, and the
#      peers, strace and valgrind that the chosen TARGETS and parts need),
#   2. starts nginx as the upstream (a 1 KiB, a 64 KiB and a 1 GiB file),
#   3. starts each proxy in the foreground with a config written to a temp dir:
#      Sluice ($SLUICE_BIN, plain and with a pipeline), haproxy (set-dst from the URL),
#      nginx (fixed upstream, its best case), Traffic Server (cache off), squid, tinyproxy,
#   4. idle RSS of each proxy; after a short warm-up, RSS growth with IDLE_CLIENTS (1000)
#      kept-alive clients that each got one 1 KiB response and then sit idle,
#   5. wrk (1 KiB GET) against direct and each proxy at 1, 16, 64, 256 connections and
#      (64 KiB GET) at 64 connections, ROUNDS times each, interleaved: for each
#      connection count, round 1 of every target, then round 2 ...; the report shows
#      the median round,
#   6. downloads 1 GiB through each target with curl: MB/s to /dev/null, then again
#      through sha256 to check the bytes; the proxy's RSS is sampled every 25 ms during
#      both, for the peak growth,
#   7. system calls per request: strace -f -c on each proxy during a short wrk run,
#   8. instructions per request: Sluice (workers: 1) under valgrind --tool=callgrind,
#      once with N1 and once with N2 requests on one kept-alive connection; the
#      difference over N2-N1 leaves out start-up and shutdown,
#   9. prints markdown: a summary table (one row per proxy), the engine targets for
#      sluice-pipeline, and the detailed tables behind them.
# Progress goes to stderr, the report to stdout:  sudo Benchmarks/run.sh > report.md
# Run it as root on an otherwise idle machine: every row reports how much CPU other
# processes took during it ("other load"), and a busy machine makes the ratios noise.
# The default run (6 targets, 3 rounds, 8 s per cell: 90 wrk runs) takes about 17 minutes
# on 2 cores, 14 of them in wrk; the time of each step is in the progress lines.
#
# Environment (all optional):
#   DURATION=8             seconds per wrk run
#   ROUNDS=3               wrk runs per cell (target x connections); the median is reported
#   CONNECTIONS="1 16 64 256"
#   CPU_CONN=64            connection count whose (median) run gives CPU time per request
#   TARGETS="direct sluice sluice-pipeline haproxy nginx trafficserver"
#                          subset/order of targets; also known: squid, tinyproxy,
#                          sluice-curl (sluice-pipeline with upstream.engine: curl: the
#                          libcurl transport beside the native one, same pipeline), and
#                          sluice-metrics (sluice-pipeline plus the metrics monitor and an
#                          admin listener on BASE_PORT+10: the monitor's cost)
#                          (sluice-pipeline: Sluice with PIPELINE_YAML, by default three
#                          adapters and the JSON access log to a file)
#   SLUICE_BIN=.build/release/sluice   (relative paths are relative to the repo root)
#   SLUICE_EXTRA_YAML=     YAML appended to Sluice's generated config (e.g. policies:)
#   PIPELINE_YAML=         YAML for sluice-pipeline instead of the default pipeline
#   HAPROXY_THREADS=$(nproc)   haproxy nbthread
#   TS_THREADS=$(nproc)    Traffic Server worker (ET_NET) threads
#   SQUID_WORKERS=$(nproc) squid SMP workers (1 = classic single process, run with -N)
#   SQUID_EXTRA=           lines appended to squid.conf
#   BASE_PORT=18080        upstream port; proxies use BASE_PORT+1 .. BASE_PORT+8, the
#                          Sluice under callgrind BASE_PORT+9 (all below 32768)
#   CACHE_DIR=/tmp/sluice-bench-cache   keeps the 1 GiB file (and its sha256) between runs
#   MEDIUM=1               0 skips the 64 KiB GET; MEDIUM_CONN=64 its connection count
#   BIG=1                  0 skips the 1 GiB download
#   BIG_MAX_TIME=120       curl --max-time for each 1 GiB download (seconds)
#   RSS_SAMPLE_MS=25       RSS sampling interval during the 1 GiB downloads
#   IDLE=1                 0 skips the idle-clients RSS measure; IDLE_CLIENTS=1000
#   STRACE=1               0 skips the syscall count; STRACE_CONN=16, STRACE_DURATION=3
#   CALLGRIND=1            0 skips the instruction count; CALLGRIND_N1=200, CALLGRIND_N2=2200
#   WRK_TIMEOUT=5s         wrk --timeout
#   PAUSE=1                seconds of rest between runs (lets sockets settle)
#   WARMUP=2               seconds of unmeasured load per target before the runs (0: none)
#   QUIET_WAIT=0           before each run, wait up to this many seconds for other
#                          processes to use < 5% of the CPU (for shared dev machines)
#   KEEP_LOGS=0            1 keeps the temp dir (configs, logs, raw wrk/strace output,
#                          callgrind profiles and their top functions)
#   NO_INSTALL=0           1 never calls apt-get

set -uo pipefail
export LC_ALL=C
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"
# Never let the environment route our clients through some other proxy.
unset http_proxy HTTP_PROXY https_proxy HTTPS_PROXY all_proxy ALL_PROXY no_proxy NO_PROXY

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
NCPU=$(nproc 2>/dev/null || echo 2)

DURATION=${DURATION:-8}
ROUNDS=${ROUNDS:-3}
CONNECTIONS=${CONNECTIONS:-"1 16 64 256"}
CPU_CONN=${CPU_CONN:-64}
TARGETS=${TARGETS:-"direct sluice sluice-pipeline haproxy nginx trafficserver"}
SLUICE_BIN=${SLUICE_BIN:-.build/release/sluice}
SLUICE_EXTRA_YAML=${SLUICE_EXTRA_YAML:-}
HAPROXY_THREADS=${HAPROXY_THREADS:-$NCPU}
TS_THREADS=${TS_THREADS:-$NCPU}
SQUID_WORKERS=${SQUID_WORKERS:-$NCPU}
SQUID_EXTRA=${SQUID_EXTRA:-}
BASE_PORT=${BASE_PORT:-18080}
CACHE_DIR=${CACHE_DIR:-/tmp/sluice-bench-cache}
MEDIUM=${MEDIUM:-1}
MEDIUM_CONN=${MEDIUM_CONN:-64}
BIG=${BIG:-1}
BIG_MAX_TIME=${BIG_MAX_TIME:-120}
RSS_SAMPLE_MS=${RSS_SAMPLE_MS:-25}
IDLE=${IDLE:-1}
IDLE_CLIENTS=${IDLE_CLIENTS:-1000}
STRACE=${STRACE:-1}
STRACE_CONN=${STRACE_CONN:-16}
STRACE_DURATION=${STRACE_DURATION:-3}
CALLGRIND=${CALLGRIND:-1}
CALLGRIND_N1=${CALLGRIND_N1:-200}
CALLGRIND_N2=${CALLGRIND_N2:-2200}
WRK_TIMEOUT=${WRK_TIMEOUT:-5s}
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
    [sluice-metrics]=$((BASE_PORT + 5))
    [sluice-curl]=$((BASE_PORT + 11))
    [haproxy]=$((BASE_PORT + 7))
    [trafficserver]=$((BASE_PORT + 8))
)
CG_PORT=$((BASE_PORT + 9))   # the Sluice under callgrind (one at a time)
METRICS_ADMIN_PORT=$((BASE_PORT + 10))   # sluice-metrics' admin listener (/metrics)
UP_AUTH="127.0.0.1:$UP_PORT"
SMALL_URL="http://$UP_AUTH/1k"
BIG_URL="http://$UP_AUTH/1g"
BIG_FILE="$CACHE_DIR/1GiB.bin"
BIG_SIZE=$((1024 * 1024 * 1024))

log()  { printf '== [%4ds] %s\n' "$SECONDS" "$*" >&2; }     # seconds since the start
warn() { printf '!! %s\n' "$*" >&2; }
die()  { printf '!! fatal: %s\n' "$*" >&2; exit 1; }
want() { [[ " $TARGETS " == *" $1 "* ]]; }

for t in $TARGETS; do
    [[ -n "${PORT[$t]:-}" ]] || die "unknown target '$t' in TARGETS (known: ${!PORT[*]})"
done
for v in DURATION ROUNDS IDLE_CLIENTS STRACE_CONN STRACE_DURATION CALLGRIND_N1 CALLGRIND_N2 MEDIUM_CONN RSS_SAMPLE_MS; do
    [[ "${!v}" =~ ^[0-9]+$ && "${!v}" -ge 1 ]] || die "$v must be a whole number >= 1"
done
(( CALLGRIND_N2 > CALLGRIND_N1 )) || die "CALLGRIND_N2 must be larger than CALLGRIND_N1"
(( BASE_PORT + 9 < 32768 )) || die "BASE_PORT must leave BASE_PORT+9 below 32768 (the ephemeral port range)"

IS_ROOT=0
[[ $(id -u) -eq 0 ]] && IS_ROOT=1

# 1000 idle clients, their upstream connections and the proxies' own: raise the soft
# limit on open files to the hard one (up to 65536); the proxies inherit it.
NOFILE=$(ulimit -Hn)
[[ "$NOFILE" == unlimited || "$NOFILE" -gt 65536 ]] && NOFILE=65536
ulimit -n "$NOFILE" 2>/dev/null || NOFILE=$(ulimit -n)

# ---------------------------------------------------------------------------
# Process bookkeeping and cleanup
# ---------------------------------------------------------------------------
declare -A PID=()        # target/name -> pid of the foreground process we started
declare -A STATUS=()     # target -> "" (ok) or the reason it is n/a
NOTES=()                 # parts that were not measured, and why (the report's last section)
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

stop_named() {           # stop_named NAME: stop PID[NAME] and forget it
    [[ -n "${PID[$1]:-}" ]] || return 0
    stop_pid "${PID[$1]}"
    unset "PID[$1]"
}

cleanup() {
    local rc=$? name
    trap - EXIT INT TERM
    # Helpers first (strace, samplers, clients, valgrind), then the proxies, the upstream last.
    for name in "${!PID[@]}"; do
        [[ $name == upstream || -n "${PORT[$name]:-}" ]] || stop_pid "${PID[$name]}"
    done
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
    command -v ps        >/dev/null || missing+=(procps)
    command -v python3   >/dev/null || missing+=(python3)
    want haproxy       && ! command -v haproxy        >/dev/null && missing+=(haproxy)
    want trafficserver && ! command -v traffic_server >/dev/null && missing+=(trafficserver)
    want squid         && ! command -v squid          >/dev/null && missing+=(squid)
    want tinyproxy     && ! command -v tinyproxy      >/dev/null && missing+=(tinyproxy)
    [[ "$STRACE" == 1 ]]    && ! command -v strace   >/dev/null && missing+=(strace)
    [[ "$CALLGRIND" == 1 ]] && ! command -v valgrind >/dev/null && missing+=(valgrind)
    [[ "$CALLGRIND" == 1 ]] && ! command -v objcopy  >/dev/null && missing+=(binutils)
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
        # One at a time: a peer or tool that fails to install is reported as n/a, not fatal.
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
PY=$(command -v python3 || true)
if [[ -z "$PY" ]]; then
    # The idle clients, the RSS sampler and the callgrind client are small python3 scripts.
    for v in IDLE CALLGRIND; do
        [[ "${!v}" == 1 ]] && NOTES+=("${v,,}: n/a (python3 is not installed)")
        printf -v "$v" 0
    done
    [[ "$BIG" == 1 ]] && NOTES+=("peak RSS while streaming: n/a (python3 is not installed)")
fi
if [[ "$STRACE" == 1 ]] && ! command -v strace >/dev/null; then
    NOTES+=("syscalls per request: n/a (strace is not installed)"); STRACE=0
fi
if [[ "$CALLGRIND" == 1 ]] && ! command -v valgrind >/dev/null; then
    NOTES+=("instructions per request: n/a (valgrind is not installed)"); CALLGRIND=0
fi

# ---------------------------------------------------------------------------
# 2. Files and the upstream
# ---------------------------------------------------------------------------
TMP=$(mktemp -d /tmp/sluice-bench.XXXXXX) || die "mktemp failed"
# Workers of nginx (nobody), squid (proxy), tinyproxy (nobody) and Traffic Server
# (trafficserver) must traverse it.
chmod 755 "$TMP"
mkdir -p "$TMP/www" "$TMP/logs"
head -c 1024 /dev/urandom | base64 -w 0 | head -c 1024 > "$TMP/www/1k"
head -c 49152 /dev/urandom | base64 -w 0 > "$TMP/www/64k"     # 65536 bytes
chmod 644 "$TMP/www/1k" "$TMP/www/64k"

sha256_stdin() {         # the sha256 of stdin, hex; openssl's is ~5x faster than coreutils' here
    if command -v openssl >/dev/null; then openssl dgst -sha256 -r | cut -d' ' -f1
    else sha256sum | cut -d' ' -f1; fi
}

mkdir -p "$CACHE_DIR" && chmod 755 "$CACHE_DIR" || die "cannot create $CACHE_DIR"
BIG_SHA256=""
if [[ "$BIG" == 1 ]]; then
    if [[ ! -f "$BIG_FILE" || $(stat -c %s "$BIG_FILE") -ne $BIG_SIZE ]]; then
        log "creating the 1 GiB file $BIG_FILE (once; kept for later runs)"
        head -c "$BIG_SIZE" /dev/urandom > "$BIG_FILE.part" && mv "$BIG_FILE.part" "$BIG_FILE" \
            || die "cannot create $BIG_FILE"
    fi
    chmod 644 "$BIG_FILE"
    # Its sha256, computed once and kept next to it (recomputed if the file is newer).
    if [[ ! -s "$BIG_FILE.sha256" || "$BIG_FILE" -nt "$BIG_FILE.sha256" ]]; then
        log "computing the sha256 of $BIG_FILE (once)"
        sha256_stdin < "$BIG_FILE" > "$BIG_FILE.sha256.part" && mv "$BIG_FILE.sha256.part" "$BIG_FILE.sha256"
    fi
    BIG_SHA256=$(cat "$BIG_FILE.sha256" 2>/dev/null)
    [[ "$BIG_SHA256" =~ ^[0-9a-f]{64}$ ]] || die "no valid sha256 for $BIG_FILE"
    cat "$BIG_FILE" > /dev/null   # into the page cache, so the disk is not what we measure
fi

# Small clients and samplers in python3 (one file, a subcommand each).
cat > "$TMP/benchclient.py" <<'PYEOF'
"""Helpers for Benchmarks/run.sh; all of them bounded in time.

  rss OUT INTERVAL_MS MAX_S PID...        samples the summed VmRSS of PIDs until SIGTERM
                                          (or MAX_S); OUT gets "PEAK_KIB SAMPLES"
  idle PORT N URL HOST READY MAX_S        N connections, one GET each, responses read;
                                          READY gets "OK FAILED FIRST_ERROR"; then the
                                          connections are held open until SIGTERM/MAX_S
  seq PORT N URL HOST MAX_S               N GETs one after the other on one connection
"""
import os, resource, signal, socket, sys, time

stop = False
def on_term(signum, frame):
    global stop
    stop = True

def raise_nofile():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

def vmrss_kib(pid):
    try:
        with open("/proc/%s/status" % pid, "rb") as f:
            for line in f:
                if line.startswith(b"VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0

def write_atomic(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)

class Conn:
    """One kept-alive HTTP/1.1 connection; responses read by Content-Length or chunks."""
    def __init__(self, port, timeout):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
    def fill(self):
        d = self.s.recv(65536)
        if not d:
            raise EOFError("connection closed by the server")
        self.buf += d
    def line(self):
        while b"\r\n" not in self.buf:
            self.fill()
        l, _, self.buf = self.buf.partition(b"\r\n")
        return l
    def take(self, n):
        while len(self.buf) < n:
            self.fill()
        d, self.buf = self.buf[:n], self.buf[n:]
        return d
    def response(self):
        while b"\r\n\r\n" not in self.buf:
            self.fill()
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split()[1])
        length, chunked = None, False
        for l in lines[1:]:
            k, _, v = l.partition(b":")
            k = k.strip().lower()
            if k == b"content-length":
                length = int(v)
            elif k == b"transfer-encoding" and b"chunked" in v.lower():
                chunked = True
        body = 0
        if chunked:
            while True:
                size = int(self.line().split(b";")[0], 16)
                if size == 0:
                    while self.line() != b"":
                        pass
                    break
                body += len(self.take(size))
                self.take(2)
        elif length is not None:
            body = len(self.take(length))
        else:
            raise ValueError("response without a length: not kept alive")
        return status, body

def request(url, host):
    return ("GET %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (url, host)).encode()

def cmd_rss(out, interval_ms, max_s, *pids):
    signal.signal(signal.SIGTERM, on_term)
    deadline = time.monotonic() + float(max_s)
    peak = n = 0
    while True:
        v = sum(vmrss_kib(p) for p in pids)
        n += 1
        peak = max(peak, v)
        if n == 1:
            write_atomic(out, "%d %d\n" % (peak, n))   # tells run.sh that sampling has begun
        if stop or time.monotonic() > deadline:
            break
        time.sleep(int(interval_ms) / 1000.0)
    write_atomic(out, "%d %d\n" % (peak, n))

def cmd_idle(port, n, url, host, ready, max_s):
    signal.signal(signal.SIGTERM, on_term)
    raise_nofile()
    deadline = time.monotonic() + float(max_s)
    req = request(url, host)
    conns, failed, first = [], 0, ""
    for _ in range(int(n)):
        if time.monotonic() > deadline:
            failed += 1
            continue
        try:
            c = Conn(int(port), 10)
            c.s.sendall(req)
            conns.append(c)
        except OSError as e:
            failed += 1
            first = first or "connect/send: %s" % e
    live = []
    for c in conns:
        try:
            if time.monotonic() > deadline:
                raise TimeoutError("out of time")
            status, body = c.response()
            if status == 200 and body == 1024:
                live.append(c)
                continue
            failed += 1
            first = first or "HTTP %d, %d bytes" % (status, body)
        except (OSError, ValueError, EOFError) as e:
            failed += 1
            first = first or "read: %s" % e
        c.s.close()
    write_atomic(ready, "%d %d %s\n" % (len(live), failed, first.replace("\n", " ")))
    while not stop and time.monotonic() < deadline:
        time.sleep(0.1)
    for c in live:
        c.s.close()

def cmd_seq(port, n, url, host, max_s):
    deadline = time.monotonic() + float(max_s)
    req = request(url, host)
    c = Conn(int(port), 60)          # under valgrind a response can take a while
    for i in range(int(n)):
        if time.monotonic() > deadline:
            print("out of time after %d requests" % i)
            return 1
        c.s.sendall(req)
        status, body = c.response()
        if status != 200 or body != 1024:
            print("request %d: HTTP %d, %d bytes" % (i + 1, status, body))
            return 1
    c.s.close()
    print("ok %s" % n)
    return 0

if __name__ == "__main__":
    cmd = {"rss": cmd_rss, "idle": cmd_idle, "seq": cmd_seq}[sys.argv[1]]
    sys.exit(cmd(*sys.argv[2:]) or 0)
PYEOF

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
    if want "$t" || [[ $t == direct ]]; then
        port_open "${PORT[$t]}" && die "port ${PORT[$t]} (for $t) is already in use; set BASE_PORT"
    fi
done
if [[ "$CALLGRIND" == 1 ]] && port_open "$CG_PORT"; then
    die "port $CG_PORT (for the callgrind runs) is already in use; set BASE_PORT"
fi

nginx_common() {         # shared top of both nginx configs: nginx_common DIR
    local d=$1
    cat <<EOF
worker_processes auto;
daemon off;
master_process on;
pid $d/nginx.pid;
error_log $d/error.log warn;
worker_rlimit_nofile $NOFILE;
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
# The pipeline Sluice is measured with: three adapters and the JSON
# access log (to a file, as in production).
default_pipeline_yaml() {        # default_pipeline_yaml DIR (where the access log goes)
    cat <<EOF
monitors:
  - access_log: { path: $1/access.log }
policies:
  default:
    adapters:
      - headers: { set: { X-Forwarded-By: sluice }, remove: [X-Debug] }
      - bearer: bench-token-0123456789
      - api_key: { header: X-Api-Key, value: bench-key-0123456789 }
EOF
}
pipeline_yaml() { if [[ -n "${PIPELINE_YAML:-}" ]]; then printf '%s\n' "$PIPELINE_YAML"; else default_pipeline_yaml "$1"; fi; }
# sluice-pipeline through the libcurl transport (upstream.engine: curl): the two upstream
# transports side by side, with the same pipeline.
curl_yaml() {            # curl_yaml DIR
    pipeline_yaml "$1" | sed 's/^  default:$/  default:\n    upstream: { engine: curl }/'
}
# sluice-pipeline plus the metrics monitor and the admin listener that serves /metrics
# (the monitor's cost, against sluice-pipeline in the same run).
metrics_yaml() {         # metrics_yaml DIR
    pipeline_yaml "$1" | sed 's/^monitors:$/monitors:\n  - metrics: {}/'
    printf 'admin: { listen: 127.0.0.1:%s }\n' "$METRICS_ADMIN_PORT"
}

sluice_yaml() {          # sluice_yaml PORT WORKERS EXTRA_YAML
    cat <<EOF
# generated by Benchmarks/run.sh
listen: ["127.0.0.1:$1"]
workers: $2
access:
  allow_clients: [127.0.0.0/8]
$3
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
    sluice_yaml "$port" auto "$extra" > "$d/sluice.yaml"
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

start_haproxy() {
    local port=${PORT[haproxy]} d="$TMP/haproxy" maxconn
    command -v haproxy >/dev/null || { STATUS[haproxy]="n/a (haproxy not installed)"; return 1; }
    mkdir -p "$d"
    # haproxy wants about two descriptors per connection and refuses to start when
    # maxconn needs more than the hard limit allows (20000 on the project's VM).
    maxconn=$(( (NOFILE - 200) / 2 ))
    (( maxconn > 20000 )) && maxconn=20000
    cat > "$d/haproxy.cfg" <<EOF
# generated by Benchmarks/run.sh: haproxy 2.6 as a forward proxy (no logging)
global
    nbthread $HAPROXY_THREADS
    maxconn $maxconn

defaults
    mode http
    option http-keep-alive
    timeout connect 5s
    timeout client 75s
    timeout server 75s
    timeout http-request 30s
    timeout http-keep-alive 75s

frontend forward
    bind 127.0.0.1:$port backlog 4096
    maxconn $maxconn
    # haproxy has no forward-proxy mode; the known trick: the destination of each
    # request is the address and port in its absolute-form URL (an IP literal here),
    # and the server below is "wherever the connection was set to go".
    http-request set-dst url_ip
    http-request set-dst-port url_port
    default_backend dynamic

backend dynamic
    # Idle server connections are shared between client connections (to the same
    # destination), like the other proxies' upstream pools.
    http-reuse always
    server origin 0.0.0.0:0
EOF
    # -db: stay in the foreground, one process (threads), our child.
    start_bg haproxy "$TMP/logs/haproxy.log" haproxy -db -f "$d/haproxy.cfg"
    wait_port "$port" "${PID[haproxy]}" 10
}

start_trafficserver() {
    local port=${PORT[trafficserver]} d="$TMP/trafficserver" user=trafficserver f throttle
    command -v traffic_server >/dev/null || { STATUS[trafficserver]="n/a (trafficserver not installed)"; return 1; }
    mkdir -p "$d/etc" "$d/log" "$d/run" "$d/cache"
    # traffic_server alone (not traffic_manager), in the foreground. A runroot file
    # points every directory it uses into our temp dir; the binaries stay where the
    # package put them.
    cat > "$d/runroot.yaml" <<EOF
prefix: $d
exec_prefix: /usr
bindir: /usr/bin
sbindir: /usr/sbin
sysconfdir: $d/etc
datadir: $d/share
includedir: /usr/include
libdir: /usr/lib/trafficserver
libexecdir: /usr/lib/trafficserver/modules
localstatedir: $d/run
runtimedir: $d/run
logdir: $d/log
cachedir: $d/cache
EOF
    # Run as root it refuses to serve ("not designed to serve pages while running as
    # root"); it drops to the package's user, who must own its log and runtime dirs.
    # Without that user, "#-1" keeps root (its crash-log helper then complains; harmless).
    if id "$user" >/dev/null 2>&1; then chown -R "$user:" "$d/log" "$d/run" "$d/cache"; else user='#-1'; fi
    # Above the descriptor limit it lowers the throttle itself, with a warning.
    throttle=$(( NOFILE - 1000 )); (( throttle > 30000 )) && throttle=30000
    cat > "$d/etc/records.config" <<EOF
# generated by Benchmarks/run.sh: a pure forward proxy, no cache, no logging
CONFIG proxy.config.http.server_ports STRING $port:ipv4:ip-in=127.0.0.1
CONFIG proxy.config.reverse_proxy.enabled INT 0
CONFIG proxy.config.url_remap.remap_required INT 0
CONFIG proxy.config.http.cache.http INT 0
CONFIG proxy.config.exec_thread.autoconfig INT 0
CONFIG proxy.config.exec_thread.limit INT $TS_THREADS
CONFIG proxy.config.accept_threads INT 0
CONFIG proxy.config.task_threads INT 1
CONFIG proxy.config.admin.user_id STRING $user
CONFIG proxy.config.log.logging_enabled INT 0
CONFIG proxy.config.http.insert_request_via_str INT 0
CONFIG proxy.config.http.insert_response_via_str INT 0
CONFIG proxy.config.http.insert_client_ip INT 0
CONFIG proxy.config.http.insert_squid_x_forwarded_for INT 0
CONFIG proxy.config.http.keep_alive_no_activity_timeout_in INT 75
CONFIG proxy.config.net.connections_throttle INT $throttle
CONFIG proxy.config.diags.debug.enabled INT 0
EOF
    cat > "$d/etc/ip_allow.yaml" <<EOF
ip_allow:
  - apply: in
    ip_addrs: 127.0.0.1
    action: allow
    methods: ALL
  - apply: out
    ip_addrs: 127.0.0.1
    action: allow
    methods: ALL
EOF
    # It insists on these files existing; empty is fine (an empty storage.config: no cache).
    for f in storage.config remap.config plugin.config cache.config hosting.config volume.config \
             parent.config socks.config splitdns.config ssl_multicert.config; do
        : > "$d/etc/$f"
    done
    start_bg trafficserver "$TMP/logs/trafficserver.log" traffic_server --run-root="$d/runroot.yaml"
    wait_port "$port" "${PID[trafficserver]}" 30
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
max_filedescriptors $NOFILE
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
# Default is 100; the 256-connection runs and the 1000 idle clients need more, or
# clients queue in the backlog.
MaxClients 2048
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
    for f in "$TMP/logs/$t.log" "$TMP/$t"/*.log "$TMP/$t"/log/*.log; do
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
        sluice-pipeline) start_sluice sluice-pipeline "$(pipeline_yaml "$TMP/sluice-pipeline")" && ok=1 ;;
        sluice-metrics) start_sluice sluice-metrics "$(metrics_yaml "$TMP/sluice-metrics")" && ok=1 ;;
        sluice-curl) start_sluice sluice-curl "$(curl_yaml "$TMP/sluice-curl")" && ok=1 ;;
        haproxy)   start_haproxy && ok=1 ;;
        nginx)     start_nginx_proxy && ok=1 ;;
        trafficserver) start_trafficserver && ok=1 ;;
        squid)     start_squid && ok=1 ;;
        tinyproxy) start_tinyproxy && ok=1 ;;
    esac
    if (( ok )) && check_proxy "$t"; then
        ACTIVE+=("$t")
        log "$t on 127.0.0.1:${PORT[$t]} (pid ${PID[$t]})"
    else
        if [[ -z "${STATUS[$t]}" ]]; then
            why=$(cat "$TMP/logs/$t.log" "$TMP/$t"/*.log "$TMP/$t"/log/*.log 2>/dev/null \
                | grep -m1 -iE 'fatal|emerg|alert|error|cannot|unable' | cut -c1-160)
            STATUS[$t]="n/a (did not start${why:+: $why})"
        fi
        warn "$t: ${STATUS[$t]}"
        [[ -n "${PID[$t]:-}" ]] && { tail_logs "$t"; stop_named "$t"; }
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

declare -A RSS_IDLE=() RSS_LOAD=() RSS_BIG=()
for t in "${ACTIVE[@]}"; do
    [[ $t == direct ]] && continue
    RSS_IDLE[$t]=$(rss_kib "${PID[$t]}")
done

# ---------------------------------------------------------------------------
# Load helpers
# ---------------------------------------------------------------------------
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

wrk_run() {              # wrk_run TARGET CONNECTIONS OBJECT SECONDS OUTFILE
    local t=$1 c=$2 obj=$3 secs=$4 out=$5 threads=2 path
    (( c < threads )) && threads=$c
    # Through a proxy the request line carries the absolute URL (absolute.lua).
    if [[ $t == direct ]]; then path=/$obj; else path=http://$UP_AUTH/$obj; fi
    BENCH_PATH=$path BENCH_HOST=$UP_AUTH \
        timeout --foreground $((secs + 30)) \
        wrk -t"$threads" -c"$c" -d"${secs}s" --timeout "$WRK_TIMEOUT" --latency \
            -s "$HERE/absolute.lua" "http://127.0.0.1:${PORT[$t]}/" > "$out" 2>&1
}
declare -A WR=()
wrk_parse() {            # wrk_parse OUTFILE: its BENCH_RESULT line into WR[key]; fails without one
    local res kv
    WR=()
    res=$(grep -m1 '^BENCH_RESULT ' "$1") || return 1
    for kv in ${res#BENCH_RESULT }; do WR[${kv%%=*}]=${kv#*=}; done
}

# Per round, keyed "target|object|connections|round"; the medians, keyed "target|object|connections".
declare -A RPS_R=() P50_R=() P99_R=() ERRS_R=() OTHER_R=() CPU_R=()
declare -A RPS=() P50=() P99=() ERRS=() OTHER=() CPU_US=() ALL_R=()

run_wrk() {              # run_wrk TARGET CONNECTIONS ROUND OBJECT: one measured run
    local t=$1 c=$2 r=$3 obj=$4 out k errs="" e
    local tot0 tot1 p0=0 p1=0 u0 u1 w0 w1
    out="$TMP/logs/wrk-$t-$obj-c$c-r$r.txt"
    k="$t|$obj|$c|$r"
    others_snapshot "$TMP/others.0"; tot0=$(total_ticks)
    u0=$(cpu_ticks "${PID[upstream]}"); w0=$(reaped_ticks)
    [[ $t != direct ]] && p0=$(cpu_ticks "${PID[$t]}")
    wrk_run "$t" "$c" "$obj" "$DURATION" "$out"
    [[ $t != direct ]] && p1=$(cpu_ticks "${PID[$t]}")
    u1=$(cpu_ticks "${PID[upstream]}"); w1=$(reaped_ticks)
    tot1=$(total_ticks); others_snapshot "$TMP/others.1"
    wrk_parse "$out" || { warn "wrk gave no result for $t/$obj/c$c/round $r:"; tail -n 5 "$out" >&2; return 1; }
    RPS_R[$k]=$(awk -v n="${WR[requests]}" -v d="${WR[duration_us]}" 'BEGIN { printf "%.0f", (d > 0 ? n / (d / 1e6) : 0) }')
    P50_R[$k]=${WR[p50_us]}
    P99_R[$k]=${WR[p99_us]}
    for e in connect read write status timeout; do
        [[ ${WR[err_$e]} -gt 0 ]] && errs+="${errs:+, }$e ${WR[err_$e]}"
    done
    ERRS_R[$k]=${errs:-0}
    # CPU the machine spent on processes that are not ours (another build, a test
    # suite...) while wrk ran: if it is more than a few %, the row is not trustworthy.
    OTHER_R[$k]=$(other_pct "$TMP/others.0" "$TMP/others.1" "$tot0" "$tot1" $(( (p1 - p0) + (u1 - u0) + (w1 - w0) )))
    if [[ $t != direct && ${WR[requests]} -gt 0 ]]; then
        CPU_R[$k]=$(awk -v t=$((p1 - p0)) -v hz="$CLK_TCK" -v n="${WR[requests]}" \
            'BEGIN { printf "%.1f", t * 1e6 / hz / n }')
    fi
    log "$(printf '%-15s %3s c=%-4s r%s %8s req/s  p50 %6s us  p99 %7s us  cpu/req %6s us  other load %3s%%  errors: %s' \
        "$t" "$obj" "$c" "$r" "${RPS_R[$k]}" "${P50_R[$k]}" "${P99_R[$k]}" "${CPU_R[$k]:--}" "${OTHER_R[$k]}" "${ERRS_R[$k]}")"
}

pick_median() {          # pick_median TARGET OBJECT CONNECTIONS: the round with the median req/s
    # With an even number of rounds, the lower of the two middle ones. Its p50, p99,
    # CPU/req and other load are reported with it, so they belong to one run.
    local t=$1 obj=$2 c=$3 r k list="" all="" m
    for ((r = 1; r <= ROUNDS; r++)); do
        k="$t|$obj|$c|$r"
        [[ -n "${RPS_R[$k]:-}" ]] || continue
        list+="${RPS_R[$k]} $r"$'\n'
        all+="${all:+ / }${RPS_R[$k]}"
    done
    [[ -n "$list" ]] || return 0
    m=$(printf '%s' "$list" | sort -n | awk '{ v[NR] = $2 } END { print v[int((NR + 1) / 2)] }')
    k="$t|$obj|$c|$m"
    RPS[$t|$obj|$c]=${RPS_R[$k]}
    P50[$t|$obj|$c]=${P50_R[$k]}
    P99[$t|$obj|$c]=${P99_R[$k]}
    ERRS[$t|$obj|$c]=${ERRS_R[$k]}
    OTHER[$t|$obj|$c]=${OTHER_R[$k]}
    CPU_US[$t|$obj|$c]=${CPU_R[$k]:-}
    ALL_R[$t|$obj|$c]=$all
}

# Is anything else eating CPU (a compiler, say)? Then the numbers are noise.
others_snapshot "$TMP/others.0"; t0=$(total_ticks); sleep 2; t1=$(total_ticks); others_snapshot "$TMP/others.1"
IDLE_BUSY=$(other_pct "$TMP/others.0" "$TMP/others.1" "$t0" "$t1")
if (( IDLE_BUSY > 5 )); then
    warn "other processes use ${IDLE_BUSY}% of the CPU before any load: results will be noisy"
    others_top "$TMP/others.0" "$TMP/others.1" >&2
fi

n_conn=$(wc -w <<< "$CONNECTIONS")
n_runs=$(( (n_conn + (MEDIUM == 1 ? 1 : 0)) * ROUNDS * ${#ACTIVE[@]} ))
log "wrk: ${#ACTIVE[@]} targets x (connections $CONNECTIONS$( [[ $MEDIUM == 1 ]] && echo "; 64 KiB at $MEDIUM_CONN")) x $ROUNDS rounds, ${DURATION}s each: about $(( n_runs * (DURATION + PAUSE + 1) ))s"

if (( WARMUP > 0 )); then
    log "warm-up: ${WARMUP}s at 16 connections per target (not measured)"
    for t in "${ACTIVE[@]}"; do
        wrk_run "$t" 16 1k "$WARMUP" "$TMP/logs/warmup-$t.txt"
    done
    sleep "$PAUSE"
fi

# ---------------------------------------------------------------------------
# 4. RSS with IDLE_CLIENTS idle kept-alive clients
# After the warm-up, so that one-time allocations (pools, thread caches) are behind
# us and what grows is what the connections cost.
# ---------------------------------------------------------------------------
declare -A IDLE_BEFORE=() IDLE_AFTER=() IDLE_NOTE=()
if [[ "$IDLE" == 1 ]]; then
    for t in "${ACTIVE[@]}"; do
        [[ $t == direct ]] && continue
        alive "$t" || continue
        sleep "$PAUSE"
        ready="$TMP/idle-$t.ready"; rm -f "$ready"
        IDLE_BEFORE[$t]=$(rss_kib "${PID[$t]}")
        start_bg idle-clients "$TMP/logs/idle-$t.log" "$PY" "$TMP/benchclient.py" idle \
            "${PORT[$t]}" "$IDLE_CLIENTS" "$SMALL_URL" "$UP_AUTH" "$ready" 120
        for ((i = 0; i < 600; i++)); do
            [[ -s "$ready" ]] && break
            kill -0 "${PID[idle-clients]}" 2>/dev/null || break
            sleep 0.1
        done
        if [[ -s "$ready" ]]; then
            sleep 1          # let the proxy finish with the last responses
            IDLE_AFTER[$t]=$(rss_kib "${PID[$t]}")
            read -r ok failed first < "$ready"
            (( failed > 0 )) && IDLE_NOTE[$t]="$ok of $IDLE_CLIENTS answered and held; first failure: ${first:-?}"
            log "$(printf '%-15s %s idle clients: RSS %s -> %s KiB (%s answered)' "$t" "$IDLE_CLIENTS" "${IDLE_BEFORE[$t]}" "${IDLE_AFTER[$t]}" "$ok")"
        else
            IDLE_NOTE[$t]="the idle clients did not get their responses within 60 s"
            warn "$t: ${IDLE_NOTE[$t]}"; tail -n 5 "$TMP/logs/idle-$t.log" >&2
        fi
        stop_named idle-clients
    done
fi

# ---------------------------------------------------------------------------
# 5. wrk, interleaved: for each connection count, round 1 of every target, round 2 ...
# ---------------------------------------------------------------------------
measure_cell() {         # measure_cell OBJECT CONNECTIONS
    local obj=$1 c=$2 r t
    for ((r = 1; r <= ROUNDS; r++)); do
        for t in "${ACTIVE[@]}"; do
            if [[ $t != direct ]] && ! alive "$t"; then
                [[ -n "${STATUS[$t]}" ]] || { STATUS[$t]="n/a (exited during the run)"; warn "$t exited"; tail_logs "$t"; }
                continue
            fi
            sleep "$PAUSE"
            wait_quiet
            run_wrk "$t" "$c" "$r" "$obj"
        done
    done
    for t in "${ACTIVE[@]}"; do pick_median "$t" "$obj" "$c"; done
}
for c in $CONNECTIONS; do measure_cell 1k "$c"; done
[[ "$MEDIUM" == 1 ]] && measure_cell 64k "$MEDIUM_CONN"
for t in "${ACTIVE[@]}"; do
    [[ $t == direct ]] && continue
    alive "$t" && RSS_LOAD[$t]=$(rss_kib "${PID[$t]}")
done

# ---------------------------------------------------------------------------
# 6. 1 GiB through each target: speed, bytes, peak RSS
# ---------------------------------------------------------------------------
rss_sampler_start() {    # rss_sampler_start TARGET OUTFILE: sample the target's processes in the background
    local out=$2 i
    local -a pids
    mapfile -t pids < <(descendants "${PID[$1]}")
    rm -f "$out"
    start_bg rss-sampler "$TMP/logs/rss-sampler-$1.log" "$PY" "$TMP/benchclient.py" rss \
        "$out" "$RSS_SAMPLE_MS" $(( 2 * BIG_MAX_TIME + 60 )) "${pids[@]}"
    for ((i = 0; i < 100; i++)); do        # until it has taken its first sample
        [[ -s "$out" ]] && return 0
        kill -0 "${PID[rss-sampler]}" 2>/dev/null || break
        sleep 0.05
    done
    return 1
}

declare -A BIG_MBS=() BIG_NOTE=() BIG_OTHER=() BIG_SHA=() BIG_PEAK=()
if [[ "$BIG" == 1 ]]; then
    for t in "${ACTIVE[@]}"; do
        if [[ $t != direct ]] && ! alive "$t"; then continue; fi
        proxy=(); p0=0; p1=0; rss0=""; sampling=0; samples=""
        [[ $t != direct ]] && proxy=(-x "http://127.0.0.1:${PORT[$t]}")
        sleep "$PAUSE"
        wait_quiet
        # The proxy's RSS every RSS_SAMPLE_MS during both downloads below; the peak minus
        # the RSS right before them is what streaming cost it.
        if [[ $t != direct && -n "$PY" ]]; then
            rss0=$(rss_kib "${PID[$t]}")
            rss_sampler_start "$t" "$TMP/rss-$t.peak" && sampling=1
        fi
        # (a) The speed: into /dev/null, so that only the transfer is measured.
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
        # (b) The bytes: the same download again, hashed while it arrives. Not timed:
        # hashing at ~1 GB/s on a core the proxy also needs would cap the direct run
        # and squeeze every ratio towards 1.
        sum=$(curl -s --max-time "$BIG_MAX_TIME" "${proxy[@]}" -w '%{stderr}%{http_code} %{size_download}' \
            "$BIG_URL" 2> "$TMP/logs/big-hash-$t.txt" | sha256_stdin)
        rc=$?
        if (( rc != 0 )); then BIG_SHA[$t]="n/a (curl exit $rc: $(cat "$TMP/logs/big-hash-$t.txt"))"
        elif [[ "$sum" == "$BIG_SHA256" ]]; then BIG_SHA[$t]="ok"
        else BIG_SHA[$t]="MISMATCH ($(cat "$TMP/logs/big-hash-$t.txt"), sha256 ${sum:0:12}…)"
        fi
        if (( sampling )); then
            stop_named rss-sampler      # it writes its final peak on SIGTERM
            read -r peak samples < "$TMP/rss-$t.peak"
            BIG_PEAK[$t]=$(( peak - rss0 ))
        fi
        log "$(printf '%-15s 1 GiB: %5s MB/s  sha256 %s  peak RSS growth %s KiB (%s samples)  other load %3s%%  %s' \
            "$t" "${BIG_MBS[$t]}" "${BIG_SHA[$t]}" "${BIG_PEAK[$t]:--}" "${samples:--}" "${BIG_OTHER[$t]}" "${BIG_NOTE[$t]:-}")"
        [[ $t != direct ]] && alive "$t" && RSS_BIG[$t]=$(rss_kib "${PID[$t]}")
    done
fi

# ---------------------------------------------------------------------------
# 7. System calls per request: strace -f -c on the proxy's processes during a short
# wrk run on kept-alive connections. strace slows the proxy down a lot; the count per
# request is what matters. Attach and detach moments add a few idle syscalls.
# ---------------------------------------------------------------------------
declare -A SYS_REQS=() SYS_TOTAL=() SYS_TOP=() SYS_NOTE=()
strace_target() {        # strace_target TARGET
    local t=$1 p i n=0 attached
    local out="$TMP/logs/strace-$t.txt" e="$TMP/logs/strace-$t.err"
    local -a args=()
    for p in $(descendants "${PID[$t]}"); do args+=(-p "$p"); n=$((n + 1)); done
    # -f with -p: every thread of each process. timeout bounds it whatever happens.
    start_bg strace "$e" timeout $((STRACE_DURATION + 60)) strace -f -c -S calls -o "$out" "${args[@]}"
    for ((i = 0; i < 100; i++)); do        # one "attached" line per process
        attached=$(grep -c 'attached' "$e" 2>/dev/null)
        (( ${attached:-0} >= n )) && break
        kill -0 "${PID[strace]}" 2>/dev/null || break
        sleep 0.1
    done
    sleep 0.2
    wrk_run "$t" "$STRACE_CONN" 1k "$STRACE_DURATION" "$TMP/logs/wrk-strace-$t.txt"
    # TERM makes strace detach and write its table (timeout passes the signal on).
    kill -TERM "${PID[strace]}" 2>/dev/null
    for ((i = 0; i < 100; i++)); do kill -0 "${PID[strace]}" 2>/dev/null || break; sleep 0.1; done
    stop_named strace
    if ! wrk_parse "$TMP/logs/wrk-strace-$t.txt" || (( ${WR[requests]:-0} == 0 )); then
        SYS_NOTE[$t]="n/a (wrk under strace completed no requests)"; return 1
    fi
    SYS_REQS[$t]=${WR[requests]}
    # strace -c: "% time seconds usecs/call calls [errors] syscall"; the last line is the total.
    SYS_TOTAL[$t]=$(awk '$NF == "total" { print $4 }' "$out" 2>/dev/null)
    [[ -n "${SYS_TOTAL[$t]}" ]] || { SYS_NOTE[$t]="n/a (no strace summary; see strace-$t.err)"; return 1; }
    SYS_TOP[$t]=$(awk -v n="${WR[requests]}" '
        /^-/ { body = 1; next }
        body && $NF != "total" && $4 ~ /^[0-9]+$/ && k < 6 { printf "%s%s %.2f", (k++ ? ", " : ""), $NF, $4 / n }' "$out")
    log "$(printf '%-15s syscalls: %s in %s requests = %s per request (%s)' "$t" "${SYS_TOTAL[$t]}" "${SYS_REQS[$t]}" \
        "$(awk -v a="${SYS_TOTAL[$t]}" -v b="${SYS_REQS[$t]}" 'BEGIN { printf "%.2f", a / b }')" "${SYS_TOP[$t]}")"
}
if [[ "$STRACE" == 1 ]]; then
    for t in "${ACTIVE[@]}"; do
        [[ $t == direct ]] && continue
        alive "$t" || continue
        sleep "$PAUSE"
        strace_target "$t"
    done
fi

# ---------------------------------------------------------------------------
# 8. Instructions per request: Sluice (workers: 1) under callgrind, N1 and N2
# sequential requests on one kept-alive connection; (Ir(N2) - Ir(N1)) / (N2 - N1).
# ---------------------------------------------------------------------------
declare -A CG_IR=() CG_NOTE=()
demangle() { if command -v swift-demangle >/dev/null; then swift-demangle --simplified; else cat; fi; }
cg_top() {               # cg_top FILE [callgrind_annotate options]: the 15 costliest functions
    callgrind_annotate "${@:2}" "$1" 2>/dev/null \
        | awk 'found && /^ *[0-9][0-9,]* / { print; if (++n == 15) exit } /file:function/ { found = 1 }' | demangle
}
callgrind_run() {        # callgrind_run VARIANT N: total Ir of a Sluice that served N requests
    local v=$1 n=$2 d="$TMP/callgrind" out vp i got rc
    out="$d/callgrind.$v.$n.out"
    start_bg callgrind "$TMP/logs/callgrind-$v-$n.log" valgrind --tool=callgrind \
        --callgrind-out-file="$out" "$CG_BIN" run --config "$d/$v.yaml"
    vp=${PID[callgrind]}
    if ! wait_port "$CG_PORT" "$vp" 60; then
        CG_NOTE[$v]="n/a (Sluice under valgrind did not open its port within 60 s: $(grep -m1 -iE 'error|fatal|valgrind:' "$TMP/logs/callgrind-$v-$n.log" | cut -c1-120))"
        stop_named callgrind; return 1
    fi
    got=$(timeout 900 "$PY" "$TMP/benchclient.py" seq "$CG_PORT" "$n" "$SMALL_URL" "$UP_AUTH" 840 2>&1)
    rc=$?
    # SIGTERM: Sluice drains (nothing is in flight) and exits; callgrind then writes its file.
    kill -TERM "$vp" 2>/dev/null
    for ((i = 0; i < 1200; i++)); do kill -0 "$vp" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$vp" 2>/dev/null && warn "callgrind $v/$n: no exit 120 s after SIGTERM; killing it"
    stop_named callgrind
    if (( rc != 0 )); then CG_NOTE[$v]="n/a (client: ${got:0:120})"; return 1; fi
    CG_IR[$v|$n]=$(awk '$1 == "totals:" { print $2; found = 1; exit } $1 == "summary:" { s = $2 } END { if (!found && s != "") print s }' "$out" 2>/dev/null)
    [[ -n "${CG_IR[$v|$n]}" ]] || { CG_NOTE[$v]="n/a (no callgrind totals; see callgrind-$v-$n.log)"; return 1; }
    log "$(printf '%-15s callgrind: %s requests, %s instructions in all' "$v" "$n" "${CG_IR[$v|$n]}")"
}
if [[ "$CALLGRIND" == 1 ]]; then
    mkdir -p "$TMP/callgrind"
    # valgrind 3.19 cannot read the DWARF 5 forms of Swift's toolchain and gives up
    # ("Possibly corrupted debuginfo file"); a copy without debug info keeps the symbol
    # table, so the profile still names functions.
    CG_BIN="$TMP/callgrind/sluice"
    if command -v objcopy >/dev/null; then
        objcopy --strip-debug "$SLUICE_BIN" "$CG_BIN" 2>/dev/null || cp "$SLUICE_BIN" "$CG_BIN"
    else
        cp "$SLUICE_BIN" "$CG_BIN"
    fi
    for v in sluice sluice-pipeline sluice-curl; do
        [[ " ${ACTIVE[*]} " == *" $v "* ]] || continue
        case $v in
            sluice) extra=$SLUICE_EXTRA_YAML ;;
            sluice-pipeline) extra=$(pipeline_yaml "$TMP/callgrind") ;;
            sluice-curl) extra=$(curl_yaml "$TMP/callgrind") ;;
        esac
        sluice_yaml "$CG_PORT" 1 "$extra" > "$TMP/callgrind/$v.yaml"
        log "callgrind: $v, $CALLGRIND_N1 and $CALLGRIND_N2 requests (valgrind is slow)"
        callgrind_run "$v" "$CALLGRIND_N1" && callgrind_run "$v" "$CALLGRIND_N2" || continue
        # The costliest functions of the longer run, for engineers (progress output and
        # logs, not the report).
        top="$TMP/logs/callgrind-$v-top.txt"
        {
            echo "# $v, $CALLGRIND_N2 requests: top 15 functions by self Ir"
            cg_top "$TMP/callgrind/callgrind.$v.$CALLGRIND_N2.out"
            echo
            echo "# $v, $CALLGRIND_N2 requests: top 15 functions by inclusive Ir"
            cg_top "$TMP/callgrind/callgrind.$v.$CALLGRIND_N2.out" --inclusive=yes
        } > "$top"
        log "callgrind profile of $v ($TMP/logs/callgrind-$v-top.txt):"
        cut -c1-220 "$top" >&2
    done
fi

# ---------------------------------------------------------------------------
# 9. Report (stdout)
# ---------------------------------------------------------------------------
fmt_us() {               # microseconds -> "123 µs" / "1.23 ms"
    awk -v u="$1" 'BEGIN { if (u < 1000) printf "%d µs", u; else if (u < 100000) printf "%.2f ms", u / 1000; else printf "%.0f ms", u / 1000 }'
}
ratio() {                # ratio A B with two decimals, or n/a
    awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || b + 0 == 0) print "n/a"; else printf "%.2f", a / b }'
}
mib() { awk -v k="$1" 'BEGIN { if (k == "") print "n/a"; else printf "%.1f MiB", k / 1024 }'; }
or_na() { if [[ -n "$1" ]]; then printf '%s%s' "$1" "${2:-}"; else printf 'n/a'; fi; }
per_req() {              # per_req A B: A / B with two decimals, or empty
    awk -v a="$1" -v b="$2" 'BEGIN { if (a != "" && b + 0 > 0) printf "%.2f", a / b }'
}
sys_per_req() { per_req "${SYS_TOTAL[$1]:-}" "${SYS_REQS[$1]:-}"; }
idle_growth() { [[ -n "${IDLE_AFTER[$1]:-}" ]] && echo $(( IDLE_AFTER[$1] - IDLE_BEFORE[$1] )); }
ir_per_req() {
    local v=$1
    [[ -n "${CG_IR[$v|$CALLGRIND_N1]:-}" && -n "${CG_IR[$v|$CALLGRIND_N2]:-}" ]] || return 0
    awk -v a="${CG_IR[$v|$CALLGRIND_N1]}" -v b="${CG_IR[$v|$CALLGRIND_N2]}" -v n=$((CALLGRIND_N2 - CALLGRIND_N1)) \
        'BEGIN { printf "%.0f", (b - a) / n }'
}
sha_short() {            # ok / MISMATCH / n/a for the tables
    case "${BIG_SHA[$1]:-}" in ok) echo ok ;; MISMATCH*) echo "**MISMATCH**" ;; *) echo "n/a" ;; esac
}
active() { [[ " ${ACTIVE[*]} " == *" $1 "* ]]; }

sluice_rev=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo "no commit")
git -C "$REPO" diff --quiet HEAD -- Sources Package.swift 2>/dev/null || sluice_rev+=" (+ uncommitted changes)"
ver() { "$@" 2>&1 | head -n1; }
peers=""
command -v haproxy >/dev/null && want haproxy && peers+="; $(ver haproxy -v | awk '{ print "haproxy", $3 }')"
peers+="; $(ver nginx -v | sed 's/^nginx version: //')"
want trafficserver && command -v traffic_server >/dev/null && peers+="; trafficserver $(traffic_server --version 2>/dev/null \
    | awk '/^Traffic Server/ { print $3; exit }') (package $(dpkg-query -W -f='${Version}' trafficserver 2>/dev/null || echo '?'))"
want squid && command -v squid >/dev/null && peers+="; $(ver squid -v | sed 's/Squid Cache: Version /squid /')"
want tinyproxy && command -v tinyproxy >/dev/null && peers+="; $(ver tinyproxy -v)"

echo "# Sluice benchmark"
echo
echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC'); host: $(nproc) cores, $(uname -sr), $(. /etc/os-release 2>/dev/null; echo "${PRETTY_NAME:-?}")"
echo "- sluice: ${SLUICE_BIN#"$REPO"/} @ $sluice_rev; $(ver wrk -v | awk '{print $1, $2}')$peers"
echo "- wrk: ${DURATION}s per run, $ROUNDS round(s) per cell, median shown; 2 threads (1 for 1 connection); targets interleaved per connection count and round; all on 127.0.0.1, wrk, upstream nginx and proxy share the cores"

proxies=()
for t in $TARGETS; do [[ $t == direct ]] || proxies+=("$t"); done

echo
echo "## Summary"
echo
echo "Ratios are of the median req/s (or MB/s) to direct's in the same run."
echo
echo "| target | 1 KiB c1 | c64 | c256 | 64 KiB c$MEDIUM_CONN | CPU/req c$CPU_CONN | 1 GiB | sha256 | peak RSS growth streaming | idle RSS | +$IDLE_CLIENTS idle clients | syscalls/req | ratio to haproxy at c64 |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | :---: | ---: | ---: | ---: | ---: | ---: |"
for t in "${proxies[@]}"; do
    printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$t" \
        "$(ratio "${RPS[$t|1k|1]:-}" "${RPS[direct|1k|1]:-}")" \
        "$(ratio "${RPS[$t|1k|64]:-}" "${RPS[direct|1k|64]:-}")" \
        "$(ratio "${RPS[$t|1k|256]:-}" "${RPS[direct|1k|256]:-}")" \
        "$(ratio "${RPS[$t|64k|$MEDIUM_CONN]:-}" "${RPS[direct|64k|$MEDIUM_CONN]:-}")" \
        "$(or_na "${CPU_US[$t|1k|$CPU_CONN]:-}" " µs")" \
        "$(ratio "${BIG_MBS[$t]:-}" "${BIG_MBS[direct]:-}")" \
        "$(sha_short "$t")" \
        "$(mib "${BIG_PEAK[$t]:-}")" \
        "$(mib "${RSS_IDLE[$t]:-}")" \
        "$(mib "$(idle_growth "$t")")" \
        "$(or_na "$(sys_per_req "$t")")" \
        "$(ratio "${RPS[$t|1k|64]:-}" "${RPS[haproxy|1k|64]:-}")"
done
echo
echo "- CPU/req: utime+stime of the proxy's processes over the median $CPU_CONN-connection run / requests completed."
echo "- 1 GiB: MB/s into /dev/null; sha256: a second download hashed as it arrives, against the file's; peak RSS growth: max of the proxy's RSS (sampled every ${RSS_SAMPLE_MS} ms during both downloads) minus its RSS right before."
echo "- idle RSS: right after start and one request; +$IDLE_CLIENTS idle clients: RSS with that many kept-alive connections, each after one 1 KiB response, minus RSS just before (after the warm-up)."
echo "- syscalls/req: strace -f -c of every thread of the proxy during a ${STRACE_DURATION}s wrk run at $STRACE_CONN connections, all syscalls / requests completed."
echo "- RSS: VmRSS summed over the proxy's processes (nginx: master + workers; trafficserver: traffic_server + its crash-log helper), so pages they share are counted more than once."

if active sluice-pipeline; then
    t=sluice-pipeline
    goal() {             # goal LABEL TARGET_TEXT MEASURED_TEXT VALUE OP LIMIT
        local met
        met=$(awk -v v="$4" -v op="$5" -v l="$6" 'BEGIN {
            if (v == "") { print "n/a"; exit }
            ok = (op == ">=") ? (v + 0 >= l + 0) : (v + 0 <= l + 0)
            print (ok ? "met" : "**not met**") }')
        printf '| %s | %s | %s | %s |\n' "$1" "$2" "$3" "$met"
    }
    exact_ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a != "" && b != "" && b + 0 > 0) printf "%.4f", a / b }'; }
    r64=$(exact_ratio "${RPS[$t|1k|64]:-}" "${RPS[direct|1k|64]:-}")
    h64=$(exact_ratio "${RPS[$t|1k|64]:-}" "${RPS[haproxy|1k|64]:-}")
    r1=$(exact_ratio "${RPS[$t|1k|1]:-}" "${RPS[direct|1k|1]:-}")
    r256=$(exact_ratio "${RPS[$t|1k|256]:-}" "${RPS[direct|1k|256]:-}")
    rmed=$(exact_ratio "${RPS[$t|64k|$MEDIUM_CONN]:-}" "${RPS[direct|64k|$MEDIUM_CONN]:-}")
    rbig=$(exact_ratio "${BIG_MBS[$t]:-}" "${BIG_MBS[direct]:-}")
    sha_ok=""; [[ -n "${BIG_SHA[$t]:-}" ]] && { [[ "${BIG_SHA[$t]}" == ok ]] && sha_ok=1 || sha_ok=0; }
    sys=$(sys_per_req "$t")
    echo
    echo "## Targets of the engine rework (sluice-pipeline)"
    echo
    echo "| measure | target | measured | result |"
    echo "| --- | --- | ---: | --- |"
    goal "1 KiB at 64 connections" "≥ 0.55 of direct" "$(ratio "${RPS[$t|1k|64]:-}" "${RPS[direct|1k|64]:-}")" "$r64" ">=" 0.55
    goal "1 KiB at 64 connections" "≥ 0.85 of haproxy" "$(ratio "${RPS[$t|1k|64]:-}" "${RPS[haproxy|1k|64]:-}")" "$h64" ">=" 0.85
    goal "1 KiB at 1 connection" "≥ 0.45 of direct" "$(ratio "${RPS[$t|1k|1]:-}" "${RPS[direct|1k|1]:-}")" "$r1" ">=" 0.45
    goal "1 KiB at 256 connections" "≥ 0.45 of direct" "$(ratio "${RPS[$t|1k|256]:-}" "${RPS[direct|1k|256]:-}")" "$r256" ">=" 0.45
    goal "CPU per request (64 connections)" "≤ 35 µs" "$(or_na "${CPU_US[$t|1k|64]:-}" " µs")" "${CPU_US[$t|1k|64]:-}" "<=" 35
    goal "64 KiB at $MEDIUM_CONN connections" "≥ 0.45 of direct" "$(ratio "${RPS[$t|64k|$MEDIUM_CONN]:-}" "${RPS[direct|64k|$MEDIUM_CONN]:-}")" "$rmed" ">=" 0.45
    goal "1 GiB download" "≥ 0.45 of direct" "$(ratio "${BIG_MBS[$t]:-}" "${BIG_MBS[direct]:-}")" "$rbig" ">=" 0.45
    goal "1 GiB download: sha256" "equal to the file's" "$(sha_short "$t")" "$sha_ok" ">=" 1
    goal "1 GiB download: peak RSS growth" "≤ 16 MiB" "$(mib "${BIG_PEAK[$t]:-}")" "${BIG_PEAK[$t]:-}" "<=" $((16 * 1024))
    goal "RSS idle" "≤ 20 MiB" "$(mib "${RSS_IDLE[$t]:-}")" "${RSS_IDLE[$t]:-}" "<=" $((20 * 1024))
    goal "RSS growth with $IDLE_CLIENTS idle clients" "≤ 4 MiB" "$(mib "$(idle_growth "$t")")" "$(idle_growth "$t")" "<=" $((4 * 1024))
    goal "syscalls per request" "≤ 6" "$(or_na "$sys")" "$sys" "<=" 6
fi

if active sluice-metrics && active sluice-pipeline; then
    echo
    echo "## The metrics monitor (target: within 5 % of the same run without it)"
    echo
    echo "| connections | sluice-pipeline req/s | sluice-metrics req/s | ratio | CPU µs/req without | with |"
    echo "| ---: | ---: | ---: | ---: | ---: | ---: |"
    for c in $CONNECTIONS; do
        printf '| %s | %s | %s | %s | %s | %s |\n' "$c" "${RPS[sluice-pipeline|1k|$c]:-n/a}" "${RPS[sluice-metrics|1k|$c]:-n/a}" \
            "$(ratio "${RPS[sluice-metrics|1k|$c]:-}" "${RPS[sluice-pipeline|1k|$c]:-}")" \
            "$(or_na "${CPU_US[sluice-pipeline|1k|$c]:-}")" "$(or_na "${CPU_US[sluice-metrics|1k|$c]:-}")"
    done
    if command -v curl >/dev/null; then
        echo
        echo "Requests the metrics monitor counted during the run (sluice_requests_total, summed): $(curl -s "http://127.0.0.1:$METRICS_ADMIN_PORT/metrics" | awk '/^sluice_requests_total/ { n += $2 } END { print n + 0 }')"
    fi
fi

if [[ "$CALLGRIND" == 1 ]] && { active sluice || active sluice-pipeline || active sluice-curl; }; then
    echo
    echo "## Instructions per request (callgrind)"
    echo
    echo "| target | Ir, $CALLGRIND_N1 requests | Ir, $CALLGRIND_N2 requests | instructions per request |"
    echo "| --- | ---: | ---: | ---: |"
    for v in sluice sluice-pipeline sluice-curl; do
        active "$v" || continue
        printf '| %s | %s | %s | %s |\n' "$v" "$(or_na "${CG_IR[$v|$CALLGRIND_N1]:-}")" \
            "$(or_na "${CG_IR[$v|$CALLGRIND_N2]:-}")" "$(or_na "$(ir_per_req "$v")")"
    done
    echo
    echo "Sluice with \`workers: 1\` under \`valgrind --tool=callgrind\` (debug info stripped), $CALLGRIND_N1 and then $CALLGRIND_N2 sequential 1 KiB GETs on one kept-alive connection from a python client, stopped with SIGTERM; (Ir($CALLGRIND_N2) − Ir($CALLGRIND_N1)) / $((CALLGRIND_N2 - CALLGRIND_N1)), so start-up and shutdown cancel out. The top functions are in the progress output (and logs/callgrind-*-top.txt with KEEP_LOGS=1)."
fi

echo
echo "## 1 KiB GET (wrk)"
echo
echo "| target | connections | req/s | p50 | p99 | ratio to direct | ratio to haproxy | proxy CPU/req | other load | errors | req/s of each round |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |"
table_rows() {           # table_rows OBJECT CONNECTIONS
    local obj=$1 c=$2 t k cpu
    for t in $TARGETS; do
        k="$t|$obj|$c"
        if [[ -n "${RPS[$k]:-}" ]]; then
            cpu=${CPU_US[$k]:-}; [[ -n "$cpu" ]] && cpu="$cpu µs" || cpu="–"
            printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s%% | %s | %s |\n' "$t" "$c" "${RPS[$k]}" \
                "$(fmt_us "${P50[$k]}")" "$(fmt_us "${P99[$k]}")" \
                "$(ratio "${RPS[$k]}" "${RPS[direct|$obj|$c]:-}")" "$(ratio "${RPS[$k]}" "${RPS[haproxy|$obj|$c]:-}")" \
                "$cpu" "${OTHER[$k]}" "${ERRS[$k]}" "${ALL_R[$k]}"
        else
            printf '| %s | %s | n/a | n/a | n/a | n/a | n/a | n/a | | | |\n' "$t" "$c"
        fi
    done
}
for c in $CONNECTIONS; do table_rows 1k "$c"; done
echo
echo "- req/s, p50, p99, CPU/req, other load, errors: of the median round (by req/s) of $ROUNDS."
echo "- proxy CPU/req: utime+stime of the proxy's processes during the run / requests completed."
echo "- other load: share of the machine's CPU (all cores) used during the run by processes this script did not start (a build, a test suite); above a few % the row is noisy."
echo "- errors: wrk socket errors and HTTP statuses > 399 (status). A proxy that closes the connection after each response without sending \`Connection: close\` (tinyproxy) shows one read error per request: wrk finds the connection closed when it sends the next request and reconnects; the responses it counted were complete."
(( IDLE_BUSY > 5 )) && echo "- **warning:** other processes used ${IDLE_BUSY}% of the CPU just before the load started; the results are noisy."

if [[ "$MEDIUM" == 1 ]]; then
    echo
    echo "## 64 KiB GET (wrk, $MEDIUM_CONN connections)"
    echo
    echo "| target | connections | req/s | p50 | p99 | ratio to direct | ratio to haproxy | proxy CPU/req | other load | errors | req/s of each round |"
    echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |"
    table_rows 64k "$MEDIUM_CONN"
    echo
    echo "65,536-byte body; MB/s = req/s × 0.066."
fi

if [[ "$BIG" == 1 ]]; then
    echo
    echo "## 1 GiB download (curl)"
    echo
    echo "| target | MB/s | ratio to direct | sha256 | peak RSS growth | other load | note |"
    echo "| --- | ---: | ---: | :---: | ---: | ---: | --- |"
    for t in $TARGETS; do
        if [[ -n "${BIG_MBS[$t]:-}" ]]; then
            peak="–"; [[ $t != direct ]] && peak=$(mib "${BIG_PEAK[$t]:-}")
            note=${BIG_NOTE[$t]:-}
            [[ "${BIG_SHA[$t]:-ok}" != ok ]] && note+="${note:+; }sha256: ${BIG_SHA[$t]}"
            printf '| %s | %s | %s | %s | %s | %s%% | %s |\n' "$t" "${BIG_MBS[$t]}" \
                "$(ratio "${BIG_MBS[$t]}" "${BIG_MBS[direct]:-}")" "$(sha_short "$t")" "$peak" "${BIG_OTHER[$t]}" "$note"
        else
            printf '| %s | n/a | n/a | n/a | n/a | | |\n' "$t"
        fi
    done
    echo
    echo "MB/s: one download per target, \`curl -s -o /dev/null\` (through the proxy with \`-x\`), the file in the page cache; MB = 10^6 bytes; curl shares the cores too. sha256: a second download piped into \`openssl dgst -sha256\` (not timed: hashing would cap the direct run), against the file's sha256 kept in CACHE_DIR. Peak RSS growth: the proxy's RSS sampled every ${RSS_SAMPLE_MS} ms during both downloads (the hashed one reads slower, so a proxy that does not push back on its upstream shows it), maximum minus the RSS right before."
fi

if [[ "$IDLE" == 1 || "$STRACE" == 1 ]]; then
    echo
    echo "## Idle connections and system calls"
    echo
    echo "| proxy | RSS before | RSS with $IDLE_CLIENTS idle clients | growth | per client | syscalls/req | requests under strace | top syscalls per request |"
    echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
    for t in "${proxies[@]}"; do
        g=$(idle_growth "$t")
        printf '| %s | %s | %s | %s | %s | %s | %s | %s |\n' "$t" "$(mib "${IDLE_BEFORE[$t]:-}")" "$(mib "${IDLE_AFTER[$t]:-}")" \
            "$(mib "$g")" "$(awk -v g="$g" -v n="$IDLE_CLIENTS" 'BEGIN { if (g == "") print "n/a"; else printf "%.1f KiB", g / n }')" \
            "$(or_na "$(sys_per_req "$t")")" "$(or_na "${SYS_REQS[$t]:-}")" "$(or_na "${SYS_TOP[$t]:-}")"
    done
    echo
    echo "Idle clients: a python client opens $IDLE_CLIENTS connections, sends one 1 KiB GET on each, reads every response and keeps the connections open; RSS is read 1 s later. Syscalls: counted by \`strace -f -c\` (which slows the proxy a lot; the count is what matters) over a ${STRACE_DURATION}s wrk run at $STRACE_CONN kept-alive connections, divided by the requests wrk completed; attaching and detaching add a few."
    for t in "${proxies[@]}"; do
        [[ -n "${IDLE_NOTE[$t]:-}" ]] && echo "- $t, idle clients: ${IDLE_NOTE[$t]}"
    done
fi

echo
echo "## Proxy resources"
echo
big_col=""; big_sep=""
[[ "$BIG" == 1 ]] && { big_col=" RSS after 1 GiB |"; big_sep=" ---: |"; }
echo "| proxy | CPU per request (at $CPU_CONN conns) | RSS idle | RSS after wrk |$big_col"
echo "| --- | ---: | ---: | ---: |$big_sep"
for t in "${proxies[@]}"; do
    printf '| %s | %s | %s | %s |' "$t" "$(or_na "${CPU_US[$t|1k|$CPU_CONN]:-}" " µs")" "$(mib "${RSS_IDLE[$t]:-}")" "$(mib "${RSS_LOAD[$t]:-}")"
    [[ "$BIG" == 1 ]] && printf ' %s |' "$(mib "${RSS_BIG[$t]:-}")"
    echo
done
echo
echo "CPU: utime+stime of the proxy's processes (/proc/PID/stat, ${CLK_TCK} Hz ticks) over the median $CPU_CONN-connection run, divided by the requests wrk completed. RSS: VmRSS summed over the proxy's processes (nginx: master + workers; squid: master, coordinator, workers), so pages they share are counted more than once."

if active sluice; then
    echo
    echo "## Sluice against its goals"
    echo
    echo "| goal | target | measured |"
    echo "| --- | --- | --- |"
    echo "| throughput at 64 connections | ≥ 0.70 of direct | $(ratio "${RPS[sluice|1k|64]:-}" "${RPS[direct|1k|64]:-}") |"
    echo "| CPU per request | ≤ 12 µs | $(or_na "${CPU_US[sluice|1k|$CPU_CONN]:-}" " µs") |"
    echo "| 1 GiB streaming | ≥ 0.55 of direct | $(ratio "${BIG_MBS[sluice]:-}" "${BIG_MBS[direct]:-}") |"
    echo "| RSS idle | ≤ 20 MiB | $(mib "${RSS_IDLE[sluice]:-}") |"
fi

for t in "${proxies[@]}"; do
    [[ -n "${SYS_NOTE[$t]:-}" ]] && NOTES+=("$t, syscalls per request: ${SYS_NOTE[$t]}")
done
for v in sluice sluice-pipeline sluice-curl; do
    [[ -n "${CG_NOTE[$v]:-}" ]] && NOTES+=("$v, instructions per request: ${CG_NOTE[$v]}")
done
na=${#NOTES[@]}
for t in $TARGETS; do [[ -n "${STATUS[$t]:-}" ]] && na=1; done
if (( na )); then
    echo
    echo "## Not measured"
    echo
    for t in $TARGETS; do [[ -n "${STATUS[$t]:-}" ]] && echo "- $t: ${STATUS[$t]}"; done
    for n in "${NOTES[@]}"; do echo "- $n"; done
fi
exit 0
