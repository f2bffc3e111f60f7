#!/usr/bin/env bash
# Runs the whole test suite: set-up, build, every test. Prints how long each stage took.
#   tools/test.sh [extra bazel test args]
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
}
trap report EXIT

stage "setup (apt packages)" tools/setup.sh
stage "build //..." bazel build //...
stage "test //..." bazel test //... "$@"
# The C++ suite again under AddressSanitizer + UndefinedBehaviorSanitizer (.bazelrc: asan).
stage "test //... (asan+ubsan)" bazel test --config=asan //... "$@"
