#!/usr/bin/env bash
# Builds Sluice's libFuzzer targets (Fuzz/) with -sanitize=fuzzer,address and runs each for
# FUZZ_TIME seconds (300 by default), FUZZ_JOBS at a time (2). Fails on any finding (crash,
# sanitizer report, leak, timeout, out-of-memory) and prints, per target, libFuzzer's final
# figures: executions, executions per second, coverage (cov: edges, ft: features) and corpus.
#
# The committed seeds in Fuzz/corpus/<target>/ are only read; what a run adds goes to
# .build-fuzz/runs/<target>/corpus, reused by the next run; findings to
# .build-fuzz/runs/<target>/findings/. FUZZ_MERGE=1 afterwards merges what the runs found
# into the committed corpus (only inputs that add coverage).
#
# Usage: scripts/fuzz.sh [target...]   (targets: the names below; default all; FUZZ_TIME=0 builds only)
set -euo pipefail
cd "$(dirname "$0")/.."

FUZZ_TIME=${FUZZ_TIME:-300}
FUZZ_JOBS=${FUZZ_JOBS:-2}
SWIFT=${SWIFT:-swift}
SCRATCH=.build-fuzz
RUNS=$SCRATCH/runs

# Longest input per target: heads well past the limits the targets set (request line 256 B,
# header section 2 KiB); a request target is one line; a configuration of 16 KiB has room
# for every section (wider ones only take longer under ASan: 8,000 unknown keys, 70 KiB,
# take 15 s).
declare -A MAX_LEN=([request-head]=16384 [chunked-body]=16384 [response-head]=16384 [response-parser]=16384
                    [request-target]=4096 [config]=16384)
ALL=(request-head chunked-body response-head response-parser request-target config)
targets=("${@:-${ALL[@]}}")
for t in "${targets[@]}"; do
  [ -n "${MAX_LEN[$t]:-}" ] || { echo "error: unknown fuzz target '$t' (${ALL[*]})" >&2; exit 2; }
done

# lld, not the system's gold: gold warns about every ASan check routine it cannot export.
# -enable-testing: the targets reach internal types with @testable import.
flags=(-c release --package-path Fuzz --scratch-path "$SCRATCH"
       -Xswiftc -sanitize=fuzzer,address -Xswiftc -enable-testing -Xswiftc -use-ld=lld
       -Xcc -fsanitize=fuzzer-no-link,address)
echo "fuzz: building the targets"
"$SWIFT" build "${flags[@]}"
bin=$("$SWIFT" build "${flags[@]}" --show-bin-path)
root=$PWD
# libFuzzer and ASan print the stack of a finding; the Swift runtime's own backtracer, run
# under ASan, reports a crash of its own on top.
export SWIFT_BACKTRACE=enable=no
[ "$FUZZ_TIME" -gt 0 ] || exit 0  # FUZZ_TIME=0: build only

run() {
  local t=$1 dir=$RUNS/$1 rc=0
  rm -rf "$dir/status" "$dir/findings"
  mkdir -p "$dir/corpus" "$dir/findings"
  # Run from the scratch directory: the config target reads the files an input names.
  # An empty environment: the config target resolves ${NAME} references, and libFuzzer would
  # learn this machine's variables (names and values) into the corpus.
  (cd "$dir" && exec env -i PATH=/usr/bin:/bin SWIFT_BACKTRACE=enable=no "$bin/fuzz-$t" corpus "$root/Fuzz/corpus/$t" \
     -max_total_time="$FUZZ_TIME" -max_len="${MAX_LEN[$t]}" -timeout=10 -rss_limit_mb=2048 \
     -print_final_stats=1 -artifact_prefix=findings/ ) >"$dir/log" 2>&1 || rc=$?
  echo "$rc" >"$dir/status"
}

for t in "${targets[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$FUZZ_JOBS" ]; do wait -n || true; done
  echo "fuzz: running $t for ${FUZZ_TIME}s"
  run "$t" &
done
wait
status=()
for t in "${targets[@]}"; do status+=("$(cat "$RUNS/$t/status" 2>/dev/null || echo 1)"); done

failed=0
printf '\n%-15s %12s %8s %6s %7s %7s  %s\n' target executions exec/s cov ft corpus result
for i in "${!targets[@]}"; do
  t=${targets[$i]} log=$RUNS/${targets[$i]}/log
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  last=$(grep -E '^#[0-9]+.*cov: ' "$log" | tail -1 || true)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  corp=$(sed -n 's/.* corp: \([0-9]*\)\/\([0-9]*[a-zA-Z]*\).*/\1 (\2)/p' <<<"$last")
  found=$(ls "$RUNS/$t/findings" | wc -l)
  if [ "${status[$i]}" -eq 0 ] && [ "$found" -eq 0 ]; then result=ok; else result="FINDING (exit ${status[$i]})"; failed=1; fi
  printf '%-15s %12s %8s %6s %7s %7s  %s\n' "$t" "${execs:--}" "${rate:--}" "${cov:--}" "${ft:--}" "${corp%% *}" "$result"
done
for i in "${!targets[@]}"; do
  t=${targets[$i]}
  if [ "${status[$i]}" -ne 0 ] || [ -n "$(ls "$RUNS/$t/findings")" ]; then
    echo; echo "==== $t: $RUNS/$t/log (last 60 lines); inputs in $RUNS/$t/findings/"
    tail -60 "$RUNS/$t/log"
    for f in "$RUNS/$t/findings"/*; do [ -f "$f" ] && { echo "-- $f (base64):"; head -c 4096 "$f" | base64; }; done
  fi
done

if [ "${FUZZ_MERGE:-0}" = 1 ] && [ "$failed" -eq 0 ]; then
  for t in "${targets[@]}"; do
    echo "fuzz: merging $RUNS/$t/corpus into Fuzz/corpus/$t"
    env -i PATH=/usr/bin:/bin "$bin/fuzz-$t" -merge=1 -max_len="${MAX_LEN[$t]}" "Fuzz/corpus/$t" "$RUNS/$t/corpus" \
      >"$RUNS/$t/merge.log" 2>&1
  done
fi
exit "$failed"
