#!/usr/bin/env bash
# Runs the test suite: set-up, build, every test. Prints how long each stage took.
#   tools/test.sh [extra bazel test args]
# The default run is sized for 35 minutes on an idle 2-core machine; GOSSIPCC_FULL_SUITE=1 also
# runs what it leaves out:
# - backend Python tests: those tagged torch1_stage or torch2_stage (tests/torch_backend/BUILD.bazel)
#   run against one torch only, those tagged full_suite (PyTorch's own test suite on 4 ranks) not
#   at all; full: every test against torch 1.13 and torch 2.x;
# - the pip wheel: built and tested against torch 2.x only; full: against both;
# - the sanitizer stages share the C++ suites' parameters out (tests/comm/harness.h): rank sweeps
#   at n = 5..8 and process mode under ASan+UBSan, n = 1..4 in threads under TSan; suites
#   parameterised by launch mode in process mode under ASan, in threads under TSan; a few long
#   fault-tolerant and dead-peer cases under one of the two; full: both sanitizers run every
#   shared-out case;
# - the C++ tests run under the two sanitizers (the same assertions, with the sanitizers' checks);
#   full: also in the plain build, where every shared-out case runs.
set -euo pipefail
cd "$(dirname "$0")/.."

declare -a STAGES=()
stage() {  # stage NAME COMMAND...
  local name=$1; shift
  local start=$SECONDS
  echo "== ${name}"
  "$@"
  STAGES+=("$(printf '%-28s %5ds' "$name" $((SECONDS - start)))")
}
report() {
  echo "== stage timings"
  for s in "${STAGES[@]}"; do echo "  $s"; done
  # The target on an idle 2-core machine is 35 minutes (CI gives 90 on 2 cores).
  printf '  %-28s %5ds (%dm%02ds; target on an idle 2-core machine: 35m)\n' "total" "$SECONDS" \
    $((SECONDS / 60)) $((SECONDS % 60))
  echo "  load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
}
# The Debian roots the torch 2.x stages use are made in the background (start_background) and
# waited for by their stage (wait_background). Each job writes its exit status to a file when it
# ends: `wait PID` long after a job ended is unreliable, since bash forgets a finished job once a
# new child of the shell reuses its PID (pid_max is 32768 on small machines, and a run starts
# tens of thousands of processes).
bg_dir=$(mktemp -d /tmp/gossipcc-test-background.XXXXXX)
finish() {
  report
  # A root left half-made is removed and redone by the next tools/trixie_root.sh.
  local f
  for f in "$bg_dir"/*.pid; do
    [ -e "$f" ] || continue
    [ -s "${f%.pid}.status" ] && continue  # ended: its PID may belong to another process now
    pkill -TERM -P "$(cat "$f")" 2>/dev/null || true
    kill "$(cat "$f")" 2>/dev/null || true
  done
  rm -rf "$bg_dir"
}
trap finish EXIT
start_background() {  # start_background NAME COMMAND...
  local name=$1; shift
  ( set +e; "$@" >"$bg_dir/$name.log" 2>&1; echo $? >"$bg_dir/$name.status" ) &
  echo $! >"$bg_dir/$name.pid"
}
wait_background() {  # wait_background NAME: prints the job's output; fails if it failed
  local name=$1 waited=0
  # A safety net, far above the minutes a root takes on a fresh machine: the job was started
  # at the beginning of the run.
  while [ ! -s "$bg_dir/$name.status" ]; do
    if [ "$waited" -ge 3600 ]; then
      cat "$bg_dir/$name.log" >&2
      echo "tools/$name.sh has not ended after 3600 s more (its output above)" >&2
      return 1
    fi
    sleep 1
    waited=$((waited + 1))
  done
  if [ "$(cat "$bg_dir/$name.status")" != 0 ]; then
    cat "$bg_dir/$name.log" >&2
    echo "tools/$name.sh failed with status $(cat "$bg_dir/$name.status") (its output above)" >&2
    return 1
  fi
  cat "$bg_dir/$name.log"
}

# Tests at the same time: GOSSIPCC_TEST_JOBS (default: two per core; compiles stay at one per
# core whatever it is, since Bazel reserves a core for each). Much of the suite waits rather than
# computes (timeouts, dead peers, emulated links), so one test per core leaves the cores half idle.
TEST_JOBS=${GOSSIPCC_TEST_JOBS:-$(( $(nproc) * 2 ))}
PARALLEL_TESTS=(--jobs="$TEST_JOBS" --local_test_jobs="$TEST_JOBS")
FULL=${GOSSIPCC_FULL_SUITE:-0}
if [ "$FULL" = 1 ]; then
  PLAIN_TESTS="-gpu"; TORCH2_ONLY=""
else
  PLAIN_TESTS="python,-gpu,-torch2_stage,-full_suite"; TORCH2_ONLY=",-torch1_stage,-full_suite"
fi
# The C++ tests read it (tests/comm/harness.h, FullSuite); Bazel passes no variable unasked.
SANITIZER_SWEEP=(--test_env=GOSSIPCC_FULL_SUITE="$FULL")

stage "setup (apt packages)" tools/setup.sh
# The torch 2.x root (debootstrap, then trixie's packages: mostly download and unpack, minutes on
# a fresh machine, nothing once made) is made in the background while the stages below compile
# and test; the torch 2.x stage waits for it.
start_background trixie_root tools/trixie_root.sh
# The torch 2.14 root (Debian forky, tools/forky_root.sh) likewise, for the last stage.
start_background forky_root tools/forky_root.sh
stage "build //..." bazel build //...
stage "test Python (torch 1.13)" bazel test "${PARALLEL_TESTS[@]}" --test_tag_filters="$PLAIN_TESTS" //... "$@"
# The pip path (pyproject.toml): the wheel built by pip, installed into a fresh venv and tested
# from outside the source tree (tools/wheel_test.sh): against torch 2.x at the end, and here
# against torch 1.13 in the full suite.
if [ "$FULL" = 1 ]; then stage "pip wheel + venv (torch 1.13)" tools/wheel_test.sh; fi
# The CUDA/NCCL tests (tag "gpu") packed for a GPU machine without Bazel; here, without a GPU,
# run.sh runs the no-GPU cases and reports every GPU case skipped with its reason (it reuses the
# plain stage's objects; the sanitizer stages build into k8-opt-asan and k8-opt-tsan).
stage "GPU bundle (build + run.sh)" bash -c 'tools/gpu_bundle.sh && gpu_bundle/run.sh'
# The C++ suite again under AddressSanitizer + UndefinedBehaviorSanitizer (.bazelrc: asan);
# the Python extension and its tests (tag "python") run in the plain stages only. Only the
# tests and what they need are built (--build_tests_only): the benchmarks and examples that no
# test runs were compiled by the plain build already; the gpu tests, which no sanitizer stage
# runs, are not built either.
stage "test //... (asan+ubsan)" bazel test --config=asan "${PARALLEL_TESTS[@]}" "${SANITIZER_SWEEP[@]}" --build_tests_only --build_tag_filters=-python,-gpu \
  --test_tag_filters=-python,-gpu //... "$@"
# The C++ suite under ThreadSanitizer (.bazelrc: tsan; tools/tsan explains the Abseil shim).
# Tests tagged no_tsan (single-threaded ones, and one that races by design) and gpu are not
# built here. The two sanitizers share the rank sweeps and launch modes out (see the header).
stage "test C++ (tsan)" bazel test --config=tsan "${PARALLEL_TESTS[@]}" "${SANITIZER_SWEEP[@]}" --build_tests_only --build_tag_filters=-python,-no_tsan,-gpu \
  --test_tag_filters=-python,-no_tsan,-gpu \
  //tests/comm/... //tests/compression/... //tests/algorithms/... //tests/reliability/... \
  //tests/torch_backend:communicator_environment_test "$@"
# libFuzzer on the option/graph parsers, bounded (tools/fuzz.sh; installs clang on first use;
# two targets at a time, one core each).
stage "fuzz parsers (20 s each)" tools/fuzz.sh 20
# The c10d backend against torch 2.x: the same build and tests in a Debian trixie root.
stage "trixie root (torch 2.x), waited" wait_background trixie_root
stage "test backend (torch 2.x)" tools/in_trixie.sh bazel test "${PARALLEL_TESTS[@]}" --test_tag_filters="${TORCH2_ONLY#,}" \
  //torch_backend/... //tests/torch_backend/... "$@"
stage "pip wheel + venv (torch 2.x)" tools/in_trixie.sh tools/wheel_test.sh
# The newest torch of the matrix (2.14, Debian forky; Bazel 7 there): sharded models (FSDP,
# fully_shard) against gloo, what gloo accepts, the info tool; the full suite adds the
# collectives and DDP.
stage "forky root (torch 2.14), waited" wait_background forky_root
FORKY_TESTS=(//tests/torch_backend:fsdp_test //tests/torch_backend:gloo_parity_test //tests/torch_backend:info_test)
if [ "$FULL" = 1 ]; then FORKY_TESTS+=(//tests/torch_backend:collectives_test //tests/torch_backend:ddp_test); fi
stage "test backend (torch 2.14)" tools/in_forky.sh bazel test "${PARALLEL_TESTS[@]}" "${FORKY_TESTS[@]}" "$@"
