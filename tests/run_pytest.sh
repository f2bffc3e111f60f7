#!/usr/bin/env bash
# Bazel sh_test entry of every Python test (tests/pytest.bzl): pytest on the given files with
# the built gossipcc package, the multi-process test helpers and tools/ importable.
set -euo pipefail
RUNFILES="${TEST_SRCDIR:?}/${TEST_WORKSPACE:-gossipcc}"
export PYTHONPATH="$RUNFILES/torch_backend:$RUNFILES/tests/torch_backend:$RUNFILES/tools${PYTHONPATH:+:$PYTHONPATH}"
export GOSSIPCC_TOOLS="$RUNFILES/tools"
export OMP_NUM_THREADS=1
cd "$RUNFILES"
# --durations: the slowest cases in each test.log, for whoever sizes the suite's time next.
exec /usr/bin/python3 -m pytest -q -p no:cacheprovider --durations=10 "$@"
