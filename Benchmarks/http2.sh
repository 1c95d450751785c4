#!/usr/bin/env bash
# Benchmarks/http2.sh — HTTP/2 against HTTP/1.1 to an https origin.
#
# Same run, same machine, interleaved rounds: wrk (1 KiB GET, CONN connections, DURATION
# seconds) through two Sluice processes that differ only in the origin host's
# `upstream.http2` (auto: ALPN h2; off: HTTP/1.1). Clients speak plain HTTP/1.1 to Sluice;
# Sluice speaks TLS to nginx (`listen ssl http2`, a throwaway CA made with openssl). All on
# 127.0.0.1, every load bounded in time.
#
# Reported per target (median round): requests/s, p50/p99 latency, CPU per request of the
# Sluice process and of nginx (utime+stime from /proc/PID/stat over the run, divided by the
# requests wrk completed), and the Sluice process's TLS connections to nginx open at the end
# of the run (`ss -p`: run as root to see them), then the ratios h2 / HTTP/1.1.
#
# Progress goes to stderr, the report (markdown) to stdout:  Benchmarks/http2.sh > h2.md
# Environment (all optional):
#   DURATION=10  CONN=64  THREADS=2  ROUNDS=1  WORKERS=2 (Sluice workers)  PAUSE=1
#   SLUICE_BIN=.build/release/sluice   BASE_PORT=18180 (nginx; Sluice on +1 and +2)
#   KEEP_LOGS=0  (1 keeps the temp dir)

set -uo pipefail
export LC_ALL=C
unset http_proxy HTTP_PROXY https_proxy HTTPS_PROXY all_proxy ALL_PROXY no_proxy NO_PROXY

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
DURATION=${DURATION:-10}
CONN=${CONN:-64}
THREADS=${THREADS:-2}
ROUNDS=${ROUNDS:-1}
WORKERS=${WORKERS:-2}
PAUSE=${PAUSE:-1}
BASE_PORT=${BASE_PORT:-18180}
SLUICE_BIN=${SLUICE_BIN:-.build/release/sluice}
[[ $SLUICE_BIN = /* ]] || SLUICE_BIN="$REPO/$SLUICE_BIN"
CLK_TCK=$(getconf CLK_TCK 2>/dev/null || echo 100)

for tool in wrk nginx openssl ss; do
    command -v "$tool" >/dev/null || PATH="$PATH:/usr/sbin:/sbin"
    command -v "$tool" >/dev/null || { echo "http2.sh: $tool is missing" >&2; exit 1; }
done
[[ -x $SLUICE_BIN ]] || { echo "http2.sh: no Sluice binary at $SLUICE_BIN (swift build -c release)" >&2; exit 1; }

TMP=$(mktemp -d /tmp/sluice-h2-bench.XXXXXX)
declare -A PID=()
cleanup() {
    for p in "${PID[@]}"; do kill "$p" 2>/dev/null; done
    wait 2>/dev/null
    [[ ${KEEP_LOGS:-0} = 1 ]] && echo "logs kept in $TMP" >&2 || rm -rf "$TMP"
}
trap cleanup EXIT
log() { echo "[$(date -u +%H:%M:%S)] $*" >&2; }

# ---- PKI and nginx ---------------------------------------------------------------------
cd "$TMP"
ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
openssl req -x509 "${ec[@]}" -keyout ca.key -out ca.pem -days 2 -subj "/CN=h2 bench CA" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign 2>/dev/null
openssl req -new "${ec[@]}" -keyout leaf.key -out leaf.csr -subj "/CN=127.0.0.1" 2>/dev/null
printf 'basicConstraints=critical,CA:FALSE\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1\n' > leaf.ext
openssl x509 -req -in leaf.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out leaf.pem -days 2 \
    -extfile leaf.ext 2>/dev/null
mkdir -p www && head -c 1024 /dev/urandom > www/1k
UP=$BASE_PORT
user=""; [[ $(id -u) = 0 ]] && user="user root root;"
cat > nginx.conf <<NGINX
$user
worker_processes 1;
daemon off;
pid $TMP/nginx.pid;
error_log $TMP/nginx-error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    keepalive_requests 10000000;
    keepalive_timeout 120s;
    client_body_temp_path $TMP/cb; proxy_temp_path $TMP/px; fastcgi_temp_path $TMP/fc;
    uwsgi_temp_path $TMP/uw; scgi_temp_path $TMP/sc;
    server {
        listen 127.0.0.1:$UP ssl http2;
        ssl_certificate $TMP/leaf.pem;
        ssl_certificate_key $TMP/leaf.key;
        root $TMP/www;
    }
}
NGINX
nginx -p "$TMP" -c "$TMP/nginx.conf" 2>"$TMP/nginx-stderr.log" &
PID[nginx]=$!

# ---- two Sluice processes: http2 auto and off --------------------------------------------
declare -A PORT=([h2]=$((BASE_PORT + 1)) [http1]=$((BASE_PORT + 2)))
for t in h2 http1; do
    mode=auto; [[ $t = http1 ]] && mode='"off"'
    cat > "sluice-$t.yaml" <<YAML
listen: ["127.0.0.1:${PORT[$t]}"]
workers: $WORKERS
tls: { ca_file: $TMP/ca.pem }
policies:
  127.0.0.1:
    upstream: { scheme: https, port: $UP, http2: $mode }
YAML
    "$SLUICE_BIN" run --config "sluice-$t.yaml" >"sluice-$t.log" 2>&1 &
    PID[$t]=$!
done
for p in "$UP" "${PORT[h2]}" "${PORT[http1]}"; do
    for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null && break; sleep 0.1; done
done

ticks() {  # utime+stime of a process and its children (nginx's master and worker), in clock ticks
    local total=0 p s
    for p in "$1" $(pgrep -P "$1" 2>/dev/null); do
        s=$(cat "/proc/$p/stat" 2>/dev/null) || continue
        s=${s##*) }; read -r -a f <<< "$s"; total=$((total + f[11] + f[12]))
    done
    echo "$total"
}

declare -A RES=()
run() {  # target round
    local t=$1 r=$2 out="$TMP/wrk-$1-$2.txt" s0 s1 n0 n1
    s0=$(ticks "${PID[$t]}"); n0=$(ticks "${PID[nginx]}")
    BENCH_PATH="http://127.0.0.1:$UP/1k" BENCH_HOST="127.0.0.1:$UP" \
        timeout $((DURATION + 20)) wrk -t"$THREADS" -c"$CONN" -d"${DURATION}s" --timeout 5s \
        -s "$HERE/absolute.lua" "http://127.0.0.1:${PORT[$t]}" > "$out" 2>&1
    s1=$(ticks "${PID[$t]}"); n1=$(ticks "${PID[nginx]}")
    local conns
    conns=$(ss -Htnp state established "( dport = :$UP )" 2>/dev/null | grep -c "pid=${PID[$t]},")
    local line; line=$(grep BENCH_RESULT "$out") || { log "wrk failed for $t: $(tail -3 "$out")"; return; }
    local req dur p50 p99 errs
    req=$(sed -E 's/.*requests=([0-9]+).*/\1/' <<< "$line"); dur=$(sed -E 's/.*duration_us=([0-9]+).*/\1/' <<< "$line")
    p50=$(sed -E 's/.*p50_us=([0-9]+).*/\1/' <<< "$line"); p99=$(sed -E 's/.*p99_us=([0-9]+).*/\1/' <<< "$line")
    errs=$(sed -E 's/.*err_connect=([0-9]+) err_read=([0-9]+) err_write=([0-9]+) err_status=([0-9]+) err_timeout=([0-9]+).*/\1+\2+\3+\4+\5/' <<< "$line")
    RES[$t,$r]="$req $dur $p50 $p99 $((errs)) $((s1 - s0)) $((n1 - n0)) $conns"
    log "$t round $r: $req requests, $((errs)) errors, $conns upstream connections"
}

log "warm-up"
for t in h2 http1; do
    BENCH_PATH="http://127.0.0.1:$UP/1k" BENCH_HOST="127.0.0.1:$UP" timeout 20 wrk -t"$THREADS" -c"$CONN" -d2s \
        -s "$HERE/absolute.lua" "http://127.0.0.1:${PORT[$t]}" >/dev/null 2>&1
done
for r in $(seq "$ROUNDS"); do
    for t in h2 http1; do sleep "$PAUSE"; run "$t" "$r"; done
done

# ---- report ----------------------------------------------------------------------------
median_round() {  # target -> the round with the median requests
    local t=$1
    for r in $(seq "$ROUNDS"); do echo "${RES[$t,$r]%% *} $r"; done | sort -n | awk '{ a[NR] = $2 } END { print a[int((NR + 1) / 2)] }'
}
echo "## HTTP/2 vs HTTP/1.1 to an https origin ($(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null))"
echo
echo "1 KiB GET, wrk $CONN connections × ${DURATION} s, Sluice workers: $WORKERS, nginx 1 worker (TLS, http2);"
echo "median of $ROUNDS round(s). CPU per request = the process's utime+stime over the run / requests."
echo
echo "| upstream | req/s | p50 ms | p99 ms | errors | Sluice CPU µs/req | nginx CPU µs/req | upstream connections |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
declare -A RPS=() SCPU=() NCPU_=()
for t in h2 http1; do
    r=$(median_round "$t")
    read -r req dur p50 p99 errs st nt conns <<< "${RES[$t,$r]}"
    RPS[$t]=$(awk -v n="$req" -v d="$dur" 'BEGIN { printf "%.0f", n / (d / 1e6) }')
    SCPU[$t]=$(awk -v t="$st" -v n="$req" -v hz="$CLK_TCK" 'BEGIN { printf "%.1f", t / hz * 1e6 / n }')
    NCPU_[$t]=$(awk -v t="$nt" -v n="$req" -v hz="$CLK_TCK" 'BEGIN { printf "%.1f", t / hz * 1e6 / n }')
    name="HTTP/2 (http2: auto)"; [[ $t = http1 ]] && name="HTTP/1.1 (http2: off)"
    printf '| %s | %s | %.2f | %.2f | %s | %s | %s | %s |\n' "$name" "${RPS[$t]}" \
        "$(awk -v v="$p50" 'BEGIN { print v / 1000 }')" "$(awk -v v="$p99" 'BEGIN { print v / 1000 }')" \
        "$errs" "${SCPU[$t]}" "${NCPU_[$t]}" "$conns"
done
echo
awk -v a="${RPS[h2]}" -v b="${RPS[http1]}" -v c="${SCPU[h2]}" -v d="${SCPU[http1]}" -v e="${NCPU_[h2]}" -v f="${NCPU_[http1]}" \
    'BEGIN { printf "Ratios h2 / HTTP/1.1: throughput %.2f, Sluice CPU per request %.2f, nginx CPU per request %.2f\n", a / b, c / d, e / f }'
