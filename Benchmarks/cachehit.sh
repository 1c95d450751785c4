#!/usr/bin/env bash
# Benchmarks/cachehit.sh — shared-cache hits: Sluice against nginx proxy_cache and Squid's
# memory cache.
#
# Same run, same machine, interleaved rounds: wrk (1 KiB GET, CONN connections, DURATION
# seconds, absolute-form request lines) against the origin directly (reference) and through
# three caching proxies, each on its own copy of the object (/<target>/1k, `Cache-Control:
# max-age=3600`, so a run is all hits after the first request):
#   sluice  — `workers: WORKERS`, `cache_store: { memory: 64MiB }`, nothing else;
#   nginx   — `worker_processes WORKERS`, `proxy_cache` (keys_zone, files in the temp dir,
#             which the page cache holds), `proxy_cache_valid 200 1h`, upstream keep-alive;
#   squid   — `workers WORKERS` (SMP, shared memory cache), `cache_mem 64 MB`, no disk
#             cache, `refresh_pattern . 60 100% 3600`.
# All on 127.0.0.1; every load bounded in time. The origin is nginx (1 worker) with an access
# log: the script counts the requests that reached it for each target's object and checks
# each proxy answers with a hit before the runs (Cache-Status / X-Cache / X-Cache-Status) —
# a benchmark of misses would be worthless.
#
# Reported per target (median round): requests/s, p50/p99, CPU per request of the proxy's
# processes (utime+stime from /proc over the run, master and children, / requests), origin
# requests during the whole benchmark, and the ratios to nginx.
#
# Progress goes to stderr, the report (markdown) to stdout:  Benchmarks/cachehit.sh > hits.md
# Environment (all optional):
#   DURATION=8  CONN=64  THREADS=2  ROUNDS=1  WORKERS=2  PAUSE=1  WARMUP=2
#   TARGETS="direct sluice nginx squid"
#   SLUICE_BIN=.build/release/sluice   BASE_PORT=18280 (origin; proxies on +1 .. +3)
#   KEEP_LOGS=0  (1 keeps the temp dir)

set -uo pipefail
export LC_ALL=C
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"
unset http_proxy HTTP_PROXY https_proxy HTTPS_PROXY all_proxy ALL_PROXY no_proxy NO_PROXY

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
DURATION=${DURATION:-8}
CONN=${CONN:-64}
THREADS=${THREADS:-2}
ROUNDS=${ROUNDS:-1}
WORKERS=${WORKERS:-2}
PAUSE=${PAUSE:-1}
WARMUP=${WARMUP:-2}
TARGETS=${TARGETS:-"direct sluice nginx squid"}
BASE_PORT=${BASE_PORT:-18280}
SLUICE_BIN=${SLUICE_BIN:-.build/release/sluice}
[[ $SLUICE_BIN = /* ]] || SLUICE_BIN="$REPO/$SLUICE_BIN"
CLK_TCK=$(getconf CLK_TCK 2>/dev/null || echo 100)

for tool in wrk nginx squid curl; do
    command -v "$tool" >/dev/null || { echo "cachehit.sh: $tool is missing" >&2; exit 1; }
done
[[ -x $SLUICE_BIN ]] || { echo "cachehit.sh: no Sluice binary at $SLUICE_BIN (swift build -c release)" >&2; exit 1; }

TMP=$(mktemp -d /tmp/sluice-hit-bench.XXXXXX)
chmod 755 "$TMP"
declare -A PID=()
cleanup() {
    for p in "${PID[@]}"; do kill "$p" 2>/dev/null; done
    wait 2>/dev/null
    [[ ${KEEP_LOGS:-0} = 1 ]] && echo "logs kept in $TMP" >&2 || rm -rf "$TMP"
}
trap cleanup EXIT
log() { echo "[$(date -u +%H:%M:%S)] $*" >&2; }
wait_port() { for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done; return 1; }

cd "$TMP"
UP=$BASE_PORT
declare -A PORT=([direct]=$UP [sluice]=$((UP + 1)) [nginx]=$((UP + 2)) [squid]=$((UP + 3)))
user=""; [[ $(id -u) = 0 ]] && user="user root root;"
for t in direct sluice nginx squid; do mkdir -p "www/$t"; head -c 1024 /dev/urandom > "www/$t/1k"; done
chmod -R a+rX www

# ---- the origin: nginx, one worker, access log (the request count) -----------------------
cat > origin.conf <<NGINX
$user
worker_processes 1;
daemon off;
pid $TMP/origin.pid;
error_log $TMP/origin-error.log warn;
events { worker_connections 4096; }
http {
    log_format path '\$uri';
    access_log $TMP/origin-access.log path buffer=64k flush=1s;
    keepalive_requests 10000000;
    keepalive_timeout 120s;
    client_body_temp_path $TMP/o-cb; proxy_temp_path $TMP/o-px; fastcgi_temp_path $TMP/o-fc;
    uwsgi_temp_path $TMP/o-uw; scgi_temp_path $TMP/o-sc;
    server {
        listen 127.0.0.1:$UP;
        root $TMP/www;
        add_header Cache-Control "max-age=3600";
    }
}
NGINX
nginx -p "$TMP" -c "$TMP/origin.conf" 2>"$TMP/origin-stderr.log" &
PID[origin]=$!

# ---- Sluice --------------------------------------------------------------------------------
cat > sluice.yaml <<YAML
listen: ["127.0.0.1:${PORT[sluice]}"]
workers: $WORKERS
cache_store: { memory: 64MiB }
YAML
if [[ " $TARGETS " == *" sluice "* ]]; then
    "$SLUICE_BIN" run --config sluice.yaml >sluice.log 2>&1 &
    PID[sluice]=$!
fi

# ---- nginx proxy_cache ---------------------------------------------------------------------
mkdir -p nginx-cache
cat > nginx-proxy.conf <<NGINX
$user
worker_processes $WORKERS;
daemon off;
pid $TMP/nginx-proxy.pid;
error_log $TMP/nginx-proxy-error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    keepalive_requests 10000000;
    keepalive_timeout 120s;
    client_body_temp_path $TMP/p-cb; proxy_temp_path $TMP/p-px; fastcgi_temp_path $TMP/p-fc;
    uwsgi_temp_path $TMP/p-uw; scgi_temp_path $TMP/p-sc;
    proxy_cache_path $TMP/nginx-cache levels=1:2 keys_zone=hits:10m max_size=64m inactive=1h use_temp_path=off;
    upstream origin { server 127.0.0.1:$UP; keepalive 32; }
    server {
        listen 127.0.0.1:${PORT[nginx]};
        location / {
            proxy_pass http://origin;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_cache hits;
            proxy_cache_valid 200 1h;
            add_header X-Cache-Status \$upstream_cache_status;
        }
    }
}
NGINX
if [[ " $TARGETS " == *" nginx "* ]]; then
    nginx -p "$TMP" -c "$TMP/nginx-proxy.conf" 2>"$TMP/nginx-proxy-stderr.log" &
    PID[nginx]=$!
fi

# ---- Squid ---------------------------------------------------------------------------------
mkdir -p squid-run
[[ $(id -u) = 0 ]] && chown proxy:proxy squid-run 2>/dev/null
cat > squid.conf <<SQUID
http_port 127.0.0.1:${PORT[squid]}
workers $WORKERS
pid_filename $TMP/squid-run/squid.pid
cache_mem 64 MB
maximum_object_size_in_memory 1 MB
memory_cache_shared on
coredump_dir $TMP/squid-run
access_log stdio:$TMP/squid-run/access.log
cache_log $TMP/squid-run/cache.log
cache_store_log none
acl localnet src 127.0.0.0/8
acl Safe_ports port 1-65535
http_access allow localnet
http_access deny all
refresh_pattern . 60 100% 3600
via on
forwarded_for delete
shutdown_lifetime 1 seconds
SQUID
# Lines in the access log cost Squid little with stdio buffering, and they show the hits.
if [[ " $TARGETS " == *" squid "* ]]; then
    squid -f "$TMP/squid.conf" --foreground -d 1 >squid-stderr.log 2>&1 &
    PID[squid]=$!
fi

for t in $TARGETS; do wait_port "${PORT[$t]}" || { log "$t did not start"; cat "$TMP"/*stderr*.log "$TMP"/sluice.log >&2; exit 1; }; done
sleep 1

# ---- the object is a hit in every proxy ------------------------------------------------------
for t in $TARGETS; do
    [[ $t = direct ]] && continue
    url="http://127.0.0.1:$UP/$t/1k"
    for _ in 1 2 3; do
        curl -s -o /dev/null -D "$TMP/head-$t.txt" --max-time 5 -x "http://127.0.0.1:${PORT[$t]}" "$url"
    done
    status=$(grep -iE '^(cache-status|x-cache|x-cache-status):' "$TMP/head-$t.txt" | tr -d '\r' | tr '\n' ' ')
    log "$t: $status"
    grep -qiE '^(cache-status: sluice; hit|x-cache: hit|x-cache-status: hit)' "$TMP/head-$t.txt" \
        || { log "$t does not answer the object with a hit: $status"; exit 1; }
done

ticks() {  # utime+stime of a process and its children, in clock ticks
    local total=0 p s
    for p in "$1" $(pgrep -P "$1" 2>/dev/null); do
        s=$(cat "/proc/$p/stat" 2>/dev/null) || continue
        s=${s##*) }; read -r -a f <<< "$s"; total=$((total + f[11] + f[12]))
    done
    echo "$total"
}

declare -A RES=()
run() {  # target round [seconds]
    local t=$1 r=$2 d=${3:-$DURATION} out="$TMP/wrk-$1-$2.txt" s0 s1 pid
    pid=${PID[$t]:-${PID[origin]}}
    s0=$(ticks "$pid")
    BENCH_PATH="http://127.0.0.1:$UP/$t/1k" BENCH_HOST="127.0.0.1:$UP" \
        timeout $((d + 20)) wrk -t"$THREADS" -c"$CONN" -d"${d}s" --timeout 5s \
        -s "$HERE/absolute.lua" "http://127.0.0.1:${PORT[$t]}" > "$out" 2>&1
    s1=$(ticks "$pid")
    [[ $r = warm ]] && return
    local line; line=$(grep BENCH_RESULT "$out") || { log "wrk failed for $t: $(tail -3 "$out")"; return; }
    local req dur p50 p99 errs
    req=$(sed -E 's/.*requests=([0-9]+).*/\1/' <<< "$line"); dur=$(sed -E 's/.*duration_us=([0-9]+).*/\1/' <<< "$line")
    p50=$(sed -E 's/.*p50_us=([0-9]+).*/\1/' <<< "$line"); p99=$(sed -E 's/.*p99_us=([0-9]+).*/\1/' <<< "$line")
    errs=$(sed -E 's/.*err_connect=([0-9]+) err_read=([0-9]+) err_write=([0-9]+) err_status=([0-9]+) err_timeout=([0-9]+).*/\1+\2+\3+\4+\5/' <<< "$line")
    RES[$t,$r]="$req $dur $p50 $p99 $((errs)) $((s1 - s0))"
    log "$t round $r: $req requests, $((errs)) errors"
}

if (( WARMUP > 0 )); then
    log "warm-up"
    for t in $TARGETS; do run "$t" warm "$WARMUP"; done
fi
for r in $(seq "$ROUNDS"); do
    for t in $TARGETS; do sleep "$PAUSE"; run "$t" "$r"; done
done
sleep 1.5  # the origin's access log flushes every second
origin_count() { grep -c "^/$1/1k\$" "$TMP/origin-access.log" 2>/dev/null; }
squid_hits() { grep -cE 'TCP_(MEM_)?HIT' "$TMP/squid-run/access.log" 2>/dev/null; }

# ---- report ----------------------------------------------------------------------------------
median_round() {
    local t=$1
    for r in $(seq "$ROUNDS"); do echo "${RES[$t,$r]%% *} $r"; done | sort -n | awk '{ a[NR] = $2 } END { print a[int((NR + 1) / 2)] }'
}
echo "## Cache hits ($(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null))"
echo
echo "1 KiB GET (\`max-age=3600\`), wrk $CONN connections × ${DURATION} s, $WORKERS workers per proxy; median of"
echo "$ROUNDS round(s). CPU per request = the proxy's processes' utime+stime over the run / requests"
echo "(for \"direct\": the origin nginx's). Origin requests: every request for that target's object"
echo "that reached the origin during the whole benchmark (warm-up, checks and runs)."
echo
echo "| target | req/s | p50 ms | p99 ms | errors | CPU µs/req | origin requests |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
declare -A RPS=() CPU=()
for t in $TARGETS; do
    r=$(median_round "$t")
    [[ -n ${RES[$t,$r]:-} ]] || { echo "| $t | n/a | | | | | |"; continue; }
    read -r req dur p50 p99 errs ticks_ <<< "${RES[$t,$r]}"
    RPS[$t]=$(awk -v n="$req" -v d="$dur" 'BEGIN { printf "%.0f", n / (d / 1e6) }')
    CPU[$t]=$(awk -v t="$ticks_" -v n="$req" -v hz="$CLK_TCK" 'BEGIN { printf "%.1f", t / hz * 1e6 / n }')
    name=$t
    case $t in
        direct) name="direct (origin nginx, reference)" ;;
        sluice) name="Sluice (cache_store, memory)" ;;
        nginx) name="nginx proxy_cache" ;;
        squid) name="Squid (cache_mem)" ;;
    esac
    printf '| %s | %s | %.2f | %.2f | %s | %s | %s |\n' "$name" "${RPS[$t]}" \
        "$(awk -v v="$p50" 'BEGIN { print v / 1000 }')" "$(awk -v v="$p99" 'BEGIN { print v / 1000 }')" \
        "$errs" "${CPU[$t]}" "$(origin_count "$t")"
done
echo
[[ " $TARGETS " == *" squid "* ]] && echo "Squid access log: $(squid_hits) TCP_HIT/TCP_MEM_HIT lines."
if [[ -n ${RPS[sluice]:-} && -n ${RPS[nginx]:-} ]]; then
    awk -v a="${RPS[sluice]}" -v b="${RPS[nginx]}" -v c="${CPU[sluice]}" -v d="${CPU[nginx]}" \
        'BEGIN { printf "Ratios Sluice / nginx: throughput %.2f, CPU per request %.2f\n", a / b, c / d }'
fi
if [[ -n ${RPS[sluice]:-} && -n ${RPS[squid]:-} ]]; then
    awk -v a="${RPS[sluice]}" -v b="${RPS[squid]}" -v c="${CPU[sluice]}" -v d="${CPU[squid]}" \
        'BEGIN { printf "Ratios Sluice / Squid: throughput %.2f, CPU per request %.2f\n", a / b, c / d }'
fi
