#!/usr/bin/env bash
# Fuzzes gossipcc's string parsers and the packed ring's decoder with libFuzzer (clang from
# Debian) for a bounded time each.
#   tools/fuzz.sh [seconds_per_target]      default 30
# Targets (sources in tests/fuzz/, corpus in tests/fuzz/corpus/<target>/):
#   power_sgd_options  compression::ParsePowerSGDOptions
#   allreduce_policy   torch_backend::AllreducePolicy::Parse
#   peer_graph         MakePeerGraph (graph specs and user edge lists)
#   float32_packing    UnpackFloat32 on bytes from the wire, PackFloat32 round trips
# Each target is compiled straight with clang++ -fsanitize=fuzzer,address,undefined (Bazel's
# toolchain here is g++), then run with -max_total_time on the committed corpus. New inputs
# libFuzzer finds go to a scratch directory; FUZZ_MERGE=1 merges the coverage-increasing ones
# into the committed corpus. A finding (crash, sanitizer report, unexpected exception, failed
# round trip, timeout, out-of-memory) leaves its input under $FUZZ_DIR/artifacts and makes the
# script exit non-zero. Env: FUZZ_DIR (default /tmp/gossipcc-fuzz), FUZZ_TARGETS (subset),
# FUZZ_MERGE=1, FUZZ_JOBS (targets run side by side, default 2).
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_PER_TARGET=${1:-30}
FUZZ_DIR=${FUZZ_DIR:-/tmp/gossipcc-fuzz}
TARGETS=(${FUZZ_TARGETS:-power_sgd_options allreduce_policy peer_graph float32_packing})

# clang, libFuzzer and the sanitizer runtimes come from the project's one set-up script.
tools/setup.sh

sources() {  # the parser under test and what it compiles with (headers come from -I.)
  case $1 in
    power_sgd_options) echo compression/power_sgd_options.cc ;;
    allreduce_policy) echo torch_backend/allreduce_policy.cc compression/power_sgd_options.cc ;;
    peer_graph) echo algorithms/peer_graph.cc ;;
    float32_packing) echo comm/gloo/float32_packing.cc ;;
    *) echo "fuzz: unknown target $1" >&2; return 1 ;;
  esac
}

CXXFLAGS=(-std=c++17 -g -O1 -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined
          -fno-sanitize-recover=all -I.)
ABSL_LIBS=$(pkg-config --libs absl_strings absl_status)
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

mkdir -p "$FUZZ_DIR/bin" "$FUZZ_DIR/artifacts"
# fuzz_one TARGET: builds and runs one target; writes its summary line to $FUZZ_DIR/TARGET.summary
# and returns non-zero on a finding. Targets run FUZZ_JOBS at a time (default 2, this machine's
# cores): each libFuzzer run is one process on one core, so running two side by side gives each
# the same -max_total_time of fuzzing in half the wall-clock time of running them one by one.
fuzz_one() {
  local t=$1 srcs bin start build_s corpus scratch log rc run_s execs per_s new cov verdict line
  srcs=$(sources "$t")
  bin="$FUZZ_DIR/bin/${t}_fuzz"
  start=$SECONDS
  # shellcheck disable=SC2086
  clang++ "${CXXFLAGS[@]}" "tests/fuzz/${t}_fuzz.cc" $srcs $ABSL_LIBS -o "$bin"
  build_s=$((SECONDS - start))

  corpus="tests/fuzz/corpus/$t"
  scratch="$FUZZ_DIR/new_corpus/$t"
  mkdir -p "$corpus" "$scratch"
  log="$FUZZ_DIR/$t.log"
  rm -f "$FUZZ_DIR/artifacts/$t-"*
  start=$SECONDS
  rc=0
  "$bin" -max_total_time="$SECONDS_PER_TARGET" -max_len=256 -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$FUZZ_DIR/artifacts/$t-" "$scratch" "$corpus" >"$log" 2>&1 || rc=$?
  run_s=$((SECONDS - start))
  stat() { sed -n "s/^stat::$1: *//p" "$log" | tail -1 || true; }
  execs=$(stat number_of_executed_units); per_s=$(stat average_exec_per_sec); new=$(stat new_units_added)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2 || true)
  if [ "$rc" -eq 0 ]; then verdict=ok; else verdict="FINDING (rc $rc)"; fi
  line=$(printf 'fuzz: %-18s build %3ds  run %3ds  %9s execs  %6s exec/s  cov %4s  new units %3s  seeds %3d  %s' \
    "$t" "$build_s" "$run_s" "${execs:-?}" "${per_s:-?}" "${cov:-?}" "${new:-?}" "$(ls "$corpus" | wc -l)" "$verdict")
  echo "$line" > "$FUZZ_DIR/$t.summary"
  if [ "$rc" -ne 0 ]; then
    {
      echo "---- $log (last 40 lines)"
      tail -40 "$log"
      echo "---- crashing input(s): $(ls "$FUZZ_DIR/artifacts/$t-"* 2>/dev/null | tr '\n' ' ')"
    } > "$FUZZ_DIR/$t.finding"
    return 1
  elif [ "${FUZZ_MERGE:-0}" = 1 ]; then
    "$bin" -merge=1 -max_len=256 "$corpus" "$scratch" >"$FUZZ_DIR/$t.merge.log" 2>&1
    echo "fuzz: $t corpus now $(ls "$corpus" | wc -l) files (merged from $scratch)" >> "$FUZZ_DIR/$t.summary"
  fi
}

JOBS=${FUZZ_JOBS:-2}
failed=()
declare -A PIDS=()
for t in "${TARGETS[@]}"; do
  sources "$t" >/dev/null  # an unknown target fails here, before anything runs
  rm -f "$FUZZ_DIR/$t.summary" "$FUZZ_DIR/$t.finding"
done
i=0
while [ "$i" -lt "${#TARGETS[@]}" ]; do
  batch=("${TARGETS[@]:i:JOBS}")
  for t in "${batch[@]}"; do fuzz_one "$t" & PIDS[$t]=$!; done
  for t in "${batch[@]}"; do
    wait "${PIDS[$t]}" || failed+=("$t")
    cat "$FUZZ_DIR/$t.summary" 2>/dev/null || echo "fuzz: $t: no summary (the build failed?)"
    if [ -f "$FUZZ_DIR/$t.finding" ]; then cat "$FUZZ_DIR/$t.finding" >&2; fi
  done
  i=$((i + JOBS))
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: findings in: ${failed[*]} (inputs under $FUZZ_DIR/artifacts)" >&2
  exit 1
fi
echo "fuzz: no findings (${SECONDS_PER_TARGET}s per target)"
