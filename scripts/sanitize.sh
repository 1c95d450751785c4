#!/usr/bin/env bash
# Builds sluice with a sanitizer and runs the e2e suite's core modules against it; fails when a
# test fails or the sanitizer wrote any report. Usage: scripts/sanitize.sh address|thread
#
# - Build: release (-O keeps the 1 GiB streaming tests inside their deadlines) with
#   `--sanitize=address|thread`, in a scratch path of its own (.build-asan, .build-tsan), so
#   .build/release/sluice, the binary `make test` runs, is left alone.
# - Reports: every sanitized sluice process writes what it finds to
#   $SANITIZE_DIR/<address|thread>/{asan,tsan}.<pid> (`log_path`); nothing is written for a
#   clean process. LeakSanitizer runs when a sluice exits (every test stops its sluice with
#   SIGTERM, which drains and returns from main). Reports do not stop the process
#   (`halt_on_error=0`), so one run lists them all.
# - Suppressions: scripts/sanitizers/{lsan,tsan}.supp, one entry per false positive inside an
#   uninstrumented C library, each with the reason it is one. Never a Sluice frame.
# - Tests: SLUICE_E2E_SANITIZER (Tests/e2e/support.py) widens the few time bounds a sanitized
#   binary's slower loop can miss, and the RSS budgets its allocator inflates; it never
#   tightens one. ASan's quarantine of freed memory is kept at 16 MiB so that the streaming
#   tests' RSS budgets still measure Sluice, not the quarantine.
# - More: PYTEST_ARGS (e.g. "-x" or "-k reload") is passed to pytest; ASAN_OPTIONS,
#   LSAN_OPTIONS and TSAN_OPTIONS already set are appended to the ones below (later wins),
#   e.g. ASAN_OPTIONS=fast_unwind_on_malloc=0 for allocation stacks through libcurl/OpenSSL,
#   which are built without frame pointers (much slower).
set -uo pipefail
sanitizer=${1:-address}
cd "$(dirname "$0")/.."
repo=$(pwd)

case "$sanitizer" in
  address) short=asan ;;
  thread)  short=tsan ;;
  *) echo "usage: $0 address|thread" >&2; exit 2 ;;
esac

SWIFT=${SWIFT:-swift}
scratch=.build-$short
bin=$repo/$scratch/release/sluice
reports=${SANITIZE_DIR:-$repo/test-artifacts/sanitize}/$sanitizer
supp=$repo/scripts/sanitizers
# The e2e modules that exercise the engine's core paths.
modules=(test_forward test_streaming test_connect test_intercept test_retry test_reload test_shutdown)

echo "== sanitize ($sanitizer): building $scratch"
t0=$(date +%s)
"$SWIFT" build -c release --sanitize="$sanitizer" --scratch-path "$scratch" --product sluice || exit 1
t1=$(date +%s)

rm -rf "$reports"
mkdir -p "$reports"
# The toolchain's llvm-symbolizer (reports name Swift functions, files and lines).
symbolizer=$(dirname "$(command -v "$SWIFT")")/llvm-symbolizer
[ -x "$symbolizer" ] || symbolizer=$(command -v llvm-symbolizer || true)
common="log_path=$reports/$short:halt_on_error=0:abort_on_error=0:symbolize=1:allocator_may_return_null=0"
export ASAN_SYMBOLIZER_PATH=$symbolizer TSAN_SYMBOLIZER_PATH=$symbolizer
export ASAN_OPTIONS="$common:detect_leaks=1:quarantine_size_mb=16:detect_stack_use_after_return=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
export TSAN_OPTIONS="$common:suppressions=$supp/tsan.supp:print_suppressions=0:second_deadlock_stack=1${TSAN_OPTIONS:+:$TSAN_OPTIONS}"
export SLUICE_BIN=$bin SLUICE_E2E_SANITIZER=$sanitizer

echo "== sanitize ($sanitizer): e2e ${modules[*]} (reports in $reports)"
files=()
for m in "${modules[@]}"; do files+=("Tests/e2e/$m.py"); done
python3 -m pytest "${files[@]}" -q -p no:cacheprovider ${PYTEST_ARGS:-}
tests_rc=$?
t2=$(date +%s)

shopt -s nullglob
found=("$reports"/$short.*)
for f in "${found[@]}"; do
  echo "---- $f ----"
  cat "$f"
done
echo "== sanitize ($sanitizer): build $((t1 - t0)) s, e2e $((t2 - t1)) s, pytest exit $tests_rc, ${#found[@]} report file(s)"
if [ ${#found[@]} -gt 0 ]; then
  echo "FAIL: $sanitizer sanitizer reports above (one file per sluice process that reported)" >&2
  exit 1
fi
[ "$tests_rc" -eq 0 ] || { echo "FAIL: e2e tests failed under the $sanitizer sanitizer" >&2; exit 1; }
echo "OK: no $sanitizer sanitizer reports"
