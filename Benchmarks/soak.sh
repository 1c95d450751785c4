#!/usr/bin/env bash
# Benchmarks/soak.sh — Sluice's memory and descriptors over time. Not in CI.
#
#   Benchmarks/soak.sh soak    constant load through Sluice to a local nginx (wrk at a fixed
#                              rate: every connection waits between its requests), sampling
#                              Sluice's VmRSS and open descriptors every SAMPLE seconds; after
#                              WARMUP, reports the growth: pass when RSS grows <= 2 MiB and
#                              the descriptor count does not grow.
#   Benchmarks/soak.sh idle    IDLE_CLIENTS (10000) kept-alive clients, each after one 1 KiB
#                              response, held idle for HOLD seconds: RSS growth over the RSS
#                              before them (after a warm-up); pass when <= 40 MiB.
#   Benchmarks/soak.sh both    (the default) idle, then soak.
#
# Everything on 127.0.0.1 (the idle clients also from 127.0.0.2-4, so ephemeral ports do not
# run short); every load is bounded in time (DURATION <= 600 s) and count. Raises the
# open-file limit to NOFILE (as root; Sluice and the clients inherit it) and sets
# timeouts.client_idle long enough for the idle clients. Progress on stderr, the report
# (markdown) on stdout. Needs wrk, nginx, python3 and a release build of Sluice.
#
# Environment (all optional):
#   DURATION=120        seconds of soak load (at most 600); WARMUP=30 of them come first
#   SAMPLE=5            seconds between samples
#   RATE=2000           requests per second in total; CONNECTIONS=32 kept-alive connections
#   IDLE_CLIENTS=10000  HOLD=10 (seconds the idle clients are held and sampled)
#   WORKERS=auto        Sluice's workers
#   SLUICE_BIN=.build/release/sluice   SLUICE_EXTRA_YAML= (appended to Sluice's config)
#   BASE_PORT=19080     nginx on BASE_PORT, Sluice on BASE_PORT+1
#   NOFILE=65536        KEEP_LOGS=0 (1 keeps the temp dir)
set -uo pipefail
export LC_ALL=C
unset http_proxy HTTP_PROXY https_proxy HTTPS_PROXY all_proxy ALL_PROXY no_proxy NO_PROXY

MODE=${1:-both}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
DURATION=${DURATION:-120}
WARMUP=${WARMUP:-30}
SAMPLE=${SAMPLE:-5}
RATE=${RATE:-2000}
CONNECTIONS=${CONNECTIONS:-32}
IDLE_CLIENTS=${IDLE_CLIENTS:-10000}
HOLD=${HOLD:-10}
WORKERS=${WORKERS:-auto}
SLUICE_BIN=${SLUICE_BIN:-.build/release/sluice}
SLUICE_EXTRA_YAML=${SLUICE_EXTRA_YAML:-}
BASE_PORT=${BASE_PORT:-19080}
NOFILE=${NOFILE:-65536}
KEEP_LOGS=${KEEP_LOGS:-0}
case "$SLUICE_BIN" in /*) ;; *) SLUICE_BIN="$REPO/$SLUICE_BIN" ;; esac

log()  { printf '== [%4ds] %s\n' "$SECONDS" "$*" >&2; }
die()  { printf '!! fatal: %s\n' "$*" >&2; exit 1; }
case "$MODE" in soak|idle|both) ;; *) die "mode must be soak, idle or both" ;; esac
for v in DURATION WARMUP SAMPLE RATE CONNECTIONS IDLE_CLIENTS HOLD; do
    [[ "${!v}" =~ ^[0-9]+$ && "${!v}" -ge 1 ]] || die "$v must be a whole number >= 1"
done
(( DURATION <= 600 )) || die "DURATION is at most 600 seconds (10 minutes)"
(( WARMUP < DURATION )) || die "WARMUP must be shorter than DURATION"
for c in wrk nginx python3 curl; do command -v "$c" >/dev/null || die "$c is not installed"; done
[[ -x "$SLUICE_BIN" ]] || die "no Sluice binary at $SLUICE_BIN (swift build -c release)"

ulimit -n "$NOFILE" 2>/dev/null || ulimit -n "$(ulimit -Hn)"
NOFILE=$(ulimit -n)
UP_PORT=$BASE_PORT
PX_PORT=$((BASE_PORT + 1))
TMP=$(mktemp -d /tmp/sluice-soak.XXXXXX) || die "mktemp failed"
chmod 755 "$TMP"
mkdir -p "$TMP/www" "$TMP/nginx"
head -c 1024 /dev/urandom | base64 -w 0 | head -c 1024 > "$TMP/www/1k"
chmod 644 "$TMP/www/1k"
declare -A PID=()

cleanup() {
    local n
    for n in "${!PID[@]}"; do
        kill -TERM "${PID[$n]}" 2>/dev/null
    done
    sleep 0.5
    for n in "${!PID[@]}"; do
        kill -KILL "${PID[$n]}" 2>/dev/null
        wait "${PID[$n]}" 2>/dev/null
    done
    if [[ "$KEEP_LOGS" == 1 ]]; then log "logs kept in $TMP"; else rm -rf "$TMP"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
wait_port() {
    local i
    for ((i = 0; i < 150; i++)); do
        port_open "$1" && return 0
        kill -0 "$2" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}
rss_kib() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status" 2>/dev/null; }
fd_count() { ls "/proc/$1/fd" 2>/dev/null | wc -l; }
other_cpu() {           # % of the machine's CPU used by processes other than ours over a window
    local a b; a=($(head -1 /proc/stat)); sleep "${1:-1}"; b=($(head -1 /proc/stat))
    awk -v i0="${a[4]}" -v i1="${b[4]}" -v t0="$(( a[1]+a[2]+a[3]+a[4]+a[5]+a[6]+a[7] ))" \
        -v t1="$(( b[1]+b[2]+b[3]+b[4]+b[5]+b[6]+b[7] ))" 'BEGIN { printf "%.0f", 100 * (1 - (i1 - i0) / (t1 - t0)) }'
}

cat > "$TMP/nginx/nginx.conf" <<EOF
worker_processes 1;
daemon off;
pid $TMP/nginx/nginx.pid;
error_log $TMP/nginx/error.log warn;
worker_rlimit_nofile $NOFILE;
events { worker_connections 16384; }
http {
    access_log off;
    client_body_temp_path $TMP/nginx/body;
    proxy_temp_path $TMP/nginx/proxy;
    fastcgi_temp_path $TMP/nginx/fastcgi;
    uwsgi_temp_path $TMP/nginx/uwsgi;
    scgi_temp_path $TMP/nginx/scgi;
    keepalive_requests 1000000;
    keepalive_timeout 600s;
    server { listen 127.0.0.1:$UP_PORT backlog=4096; root $TMP/www; }
}
EOF
nginx -e "$TMP/nginx/error.log" -p "$TMP/nginx" -c "$TMP/nginx/nginx.conf" > "$TMP/nginx.log" 2>&1 &
PID[nginx]=$!
wait_port "$UP_PORT" "${PID[nginx]}" || die "nginx did not start: $(cat "$TMP/nginx.log" "$TMP/nginx/error.log" 2>/dev/null)"

# max_connections: auto is (open files - 64) / 2; when that is below what the idle clients
# need, the limit is set to fit them (and said so in the report).
LIMITS=""
AUTO_MAX=$(( (NOFILE - 64) / 2 ))
NEED=$(( IDLE_CLIENTS + CONNECTIONS + 16 ))
if [[ "$MODE" != soak ]] && (( AUTO_MAX < NEED )); then
    (( NEED + 1100 < NOFILE )) || die "open-file limit $NOFILE is too low for $IDLE_CLIENTS idle clients"
    LIMITS="limits: { max_connections: $NEED }"
fi
cat > "$TMP/sluice.yaml" <<EOF
# generated by Benchmarks/soak.sh
listen: ["127.0.0.1:$PX_PORT"]
workers: $WORKERS
timeouts: { client_idle: 30m }
$LIMITS
$SLUICE_EXTRA_YAML
EOF
"$SLUICE_BIN" run --config "$TMP/sluice.yaml" > "$TMP/sluice.log" 2>&1 &
PID[sluice]=$!
SPID=${PID[sluice]}
wait_port "$PX_PORT" "$SPID" || die "sluice did not start: $(cat "$TMP/sluice.log")"
URL="http://127.0.0.1:$UP_PORT/1k"
[[ $(curl -s -o /dev/null -w '%{http_code}' -x "http://127.0.0.1:$PX_PORT" "$URL") == 200 ]] || die "no 200 through sluice"
log "nginx on $UP_PORT, sluice on $PX_PORT (pid $SPID, $WORKERS workers), open files $NOFILE, $(nproc) cores"

# wrk at a fixed rate: each connection waits CONNECTIONS*1000/RATE ms between its requests.
# wrk connects to Sluice and sends absolute-form request lines (a forward proxy's).
DELAY_MS=$(( CONNECTIONS * 1000 / RATE ))
PX_URL="http://127.0.0.1:$PX_PORT/"
cat > "$TMP/rate.lua" <<EOF
wrk.path = "$URL"
wrk.headers["Host"] = "127.0.0.1:$UP_PORT"
function delay() return $DELAY_MS end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("WRK %d %d %d %d %d %d %.0f\n", summary.requests, e.connect, e.read, e.write,
    e.status, e.timeout, latency:percentile(99)))
end
EOF
warm() {                # warm SECONDS: unmeasured load
    wrk -t1 -c "$CONNECTIONS" -d "${1}s" -s "$TMP/rate.lua" "$PX_URL" > "$TMP/warm.txt" 2>&1 || true
    grep -q '^WRK [1-9]' "$TMP/warm.txt" || die "the warm-up load did not get through: $(cat "$TMP/warm.txt")"
}

cat > "$TMP/idle.py" <<'PYEOF'
"""N kept-alive connections from several 127.0.0.x addresses, one 1 KiB GET each, every
response read; then held until SIGTERM or MAX_S. READY gets "OK FAILED FIRST_ERROR"."""
import resource, selectors, signal, socket, sys, time
port, n, url, host, ready, max_s = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], float(sys.argv[6])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
stop = False
def on_term(*_):
    global stop
    stop = True
signal.signal(signal.SIGTERM, on_term)
deadline = time.monotonic() + max_s
req = ("GET %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (url, host)).encode()
sources = ["127.0.0.%d" % i for i in range(1, 5)]
sel = selectors.DefaultSelector()
conns, failed, first = [], 0, ""
# In batches of 500: connect, send, read every response (Content-Length) before the next batch.
for start in range(0, n, 500):
    batch = []
    for i in range(start, min(n, start + 500)):
        if time.monotonic() > deadline:
            break
        try:
            s = socket.socket()
            s.bind((sources[i % len(sources)], 0))
            s.settimeout(10)
            s.connect(("127.0.0.1", port))
            s.sendall(req)
            s.setblocking(False)
            batch.append(s)
        except OSError as e:
            failed += 1
            first = first or "connect/send: %s" % e
    bufs = {s: b"" for s in batch}
    for s in batch:
        sel.register(s, selectors.EVENT_READ)
    pending = set(batch)
    while pending and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=1):
            s = key.fileobj
            try:
                d = s.recv(65536)
            except OSError as e:
                d = b""
                first = first or "read: %s" % e
            if not d:
                failed += 1
                first = first or "closed before the response"
                pending.discard(s); sel.unregister(s); s.close()
                continue
            bufs[s] += d
            head, sep, body = bufs[s].partition(b"\r\n\r\n")
            if sep:
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    k, _, v = line.partition(b":")
                    if k.strip().lower() == b"content-length":
                        length = int(v)
                if len(body) >= length:
                    status = int(head.split()[1])
                    pending.discard(s); sel.unregister(s)
                    if status == 200:
                        conns.append(s)
                    else:
                        failed += 1
                        first = first or "HTTP %d" % status
                        s.close()
    for s in pending:
        failed += 1
        first = first or "no response in time"
        sel.unregister(s); s.close()
with open(ready + ".tmp", "w") as f:
    f.write("%d %d %s\n" % (len(conns), failed, first.replace(" ", "_")))
import os
os.replace(ready + ".tmp", ready)
while not stop and time.monotonic() < deadline:
    time.sleep(0.2)
# Are they still held? One byte of a new request on a sample would start a request; instead
# peek: a closed connection reads EOF.
alive = 0
for s in conns[:: max(1, len(conns) // 100)]:
    try:
        d = s.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        alive += 0 if d == b"" else 1
    except BlockingIOError:
        alive += 1
    except OSError:
        pass
print("sampled_alive %d of %d" % (alive, len(conns[:: max(1, len(conns) // 100)])))
for s in conns:
    s.close()
PYEOF

echo "# Sluice soak ($(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo '?'))"
echo
echo "- host: $(nproc) cores, $(uname -r); sluice workers: $WORKERS; open-file limit $NOFILE"
[[ -n "$LIMITS" ]] && echo "- max_connections set to $NEED (auto would be $AUTO_MAX with $NOFILE open files)"

IDLE_RESULT=0 SOAK_RESULT=0
if [[ "$MODE" == idle || "$MODE" == both ]]; then
    log "idle: warm-up (5 s of load), then $IDLE_CLIENTS idle kept-alive clients"
    warm 5
    sleep 2
    before=$(rss_kib "$SPID"); fds_before=$(fd_count "$SPID")
    rm -f "$TMP/idle.ready"
    t0=$SECONDS
    python3 "$TMP/idle.py" "$PX_PORT" "$IDLE_CLIENTS" "$URL" "127.0.0.1:$UP_PORT" "$TMP/idle.ready" $(( HOLD + 240 )) > "$TMP/idle.log" 2>&1 &
    PID[idle]=$!
    for ((i = 0; i < 2400; i++)); do
        [[ -s "$TMP/idle.ready" ]] && break
        kill -0 "${PID[idle]}" 2>/dev/null || break
        sleep 0.1
    done
    [[ -s "$TMP/idle.ready" ]] || die "the idle clients did not report: $(cat "$TMP/idle.log")"
    read -r ok failed first < "$TMP/idle.ready"
    log "idle: $ok held, $failed failed (${first:-none}) after $(( SECONDS - t0 )) s"
    sleep 2
    after=$(rss_kib "$SPID"); fds_after=$(fd_count "$SPID")
    peak=$after
    for ((i = 0; i < HOLD; i++)); do
        sleep 1; r=$(rss_kib "$SPID"); (( r > peak )) && peak=$r
    done
    held_rss=$(rss_kib "$SPID")
    kill -TERM "${PID[idle]}" 2>/dev/null; wait "${PID[idle]}" 2>/dev/null; unset 'PID[idle]'
    alive_line=$(grep sampled_alive "$TMP/idle.log")
    sleep 3
    released=$(rss_kib "$SPID"); fds_released=$(fd_count "$SPID")
    growth=$(( peak - before ))
    verdict=pass; (( growth > 40 * 1024 || ok < IDLE_CLIENTS )) && { verdict=FAIL; IDLE_RESULT=1; }
    echo
    echo "## $IDLE_CLIENTS idle kept-alive clients"
    echo
    echo "| clients held | RSS before | with the clients | peak while held ${HOLD} s | growth | per client | descriptors before / with / after | RSS after they left | target | result |"
    echo "| ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | --- | --- |"
    printf '| %s | %.1f MiB | %.1f MiB | %.1f MiB | %.1f MiB | %.2f KiB | %s / %s / %s | %.1f MiB | growth ≤ 40 MiB | %s |\n' \
        "$ok" "$(bc -l <<< "$before/1024")" "$(bc -l <<< "$after/1024")" "$(bc -l <<< "$peak/1024")" \
        "$(bc -l <<< "$growth/1024")" "$(bc -l <<< "$growth/($ok+0.0001)")" "$fds_before" "$fds_after" "$fds_released" \
        "$(bc -l <<< "$released/1024")" "$verdict"
    echo
    echo "- each client: one GET of 1 KiB on a kept-alive connection (from 127.0.0.1-4), response read, then idle; still open at the end: ${alive_line#sampled_alive } sampled; RSS at the end of the hold: $(( held_rss / 1024 )) MiB"
fi

if [[ "$MODE" == soak || "$MODE" == both ]]; then
    log "soak: $DURATION s at $RATE req/s over $CONNECTIONS connections (first $WARMUP s are warm-up), a sample every $SAMPLE s"
    : > "$TMP/samples"
    wrk -t1 -c "$CONNECTIONS" -d "${DURATION}s" --timeout 5s -s "$TMP/rate.lua" "$PX_URL" > "$TMP/wrk.txt" 2>&1 &
    PID[wrk]=$!
    start=$SECONDS
    while kill -0 "${PID[wrk]}" 2>/dev/null && (( SECONDS - start < DURATION + 30 )); do
        t=$(( SECONDS - start ))
        printf '%d %s %s %s\n' "$t" "$(rss_kib "$SPID")" "$(fd_count "$SPID")" "$(other_cpu 1)" >> "$TMP/samples"
        sleep $(( SAMPLE > 1 ? SAMPLE - 1 : 0 ))
    done
    wait "${PID[wrk]}" 2>/dev/null; unset 'PID[wrk]'
    read -r _ reqs e_conn e_read e_write e_status e_timeout p99 < <(grep '^WRK' "$TMP/wrk.txt")
    # After the warm-up: the median of the first three samples against the median of the last three.
    read -r base_rss base_fd end_rss end_fd min_rss max_rss max_fd n other < <(awk -v w="$WARMUP" '
        $1 >= w { n++; t[n] = $1; r[n] = $2; f[n] = $3; o += $4 }
        function med(a, b, c) { return a < b ? (b < c ? b : (a < c ? c : a)) : (a < c ? a : (b < c ? c : b)) }
        END {
            if (n < 6) { print "0 0 0 0 0 0 0", n, 0; exit }
            mn = r[1]; mx = r[1]; mf = f[1]
            for (i = 1; i <= n; i++) { if (r[i] < mn) mn = r[i]; if (r[i] > mx) mx = r[i]; if (f[i] > mf) mf = f[i] }
            print med(r[1], r[2], r[3]), med(f[1], f[2], f[3]), med(r[n-2], r[n-1], r[n]), med(f[n-2], f[n-1], f[n]), mn, mx, mf, n, o / n
        }' "$TMP/samples")
    (( n >= 6 )) || die "too few samples after the warm-up ($n): make DURATION longer"
    # The load went through Sluice: its client connections were open while it ran.
    (( base_fd >= CONNECTIONS )) || die "Sluice had $base_fd descriptors under load: the load did not go through it"
    rss_growth=$(( end_rss - base_rss )); fd_growth=$(( end_fd - base_fd ))
    verdict=pass; (( rss_growth > 2048 || fd_growth > 0 )) && { verdict=FAIL; SOAK_RESULT=1; }
    echo
    echo "## Soak: $DURATION s at $RATE req/s ($CONNECTIONS kept-alive connections, 1 KiB GET)"
    echo
    echo "| requests | errors (connect/read/write/status/timeout) | p99 | RSS after warm-up | RSS at the end | growth | min / max RSS after warm-up | descriptors after warm-up / end / max | other load | target | result |"
    echo "| ---: | --- | ---: | ---: | ---: | ---: | --- | --- | ---: | --- | --- |"
    printf '| %s | %s/%s/%s/%s/%s | %.1f ms | %.1f MiB | %.1f MiB | %+d KiB | %.1f / %.1f MiB | %s / %s / %s | %.0f %% | RSS ≤ +2 MiB, descriptors +0 | %s |\n' \
        "$reqs" "$e_conn" "$e_read" "$e_write" "$e_status" "$e_timeout" "$(bc -l <<< "${p99:-0}/1000")" \
        "$(bc -l <<< "$base_rss/1024")" "$(bc -l <<< "$end_rss/1024")" "$rss_growth" \
        "$(bc -l <<< "$min_rss/1024")" "$(bc -l <<< "$max_rss/1024")" "$base_fd" "$end_fd" "$max_fd" "$other" "$verdict"
    echo
    echo "- growth: the median of the last three samples minus the median of the first three after the ${WARMUP} s warm-up; $n samples every ${SAMPLE} s. Other load: CPU used by the whole machine during each 1 s sample window (wrk, nginx, Sluice and other users' builds), averaged."
    echo "- samples (seconds, VmRSS KiB, descriptors): $(awk -v w="$WARMUP" '{ printf "%s%d:%d/%d", (NR > 1 ? " " : ""), $1, $2, $3 }' "$TMP/samples")"
fi
exit $(( IDLE_RESULT | SOAK_RESULT ))
