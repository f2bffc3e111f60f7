#!/usr/bin/env bash
# Bazel sh_test entry: runs pytest on the given files with the built gossipcc package importable.
set -euo pipefail
RUNFILES="${TEST_SRCDIR:?}/${TEST_WORKSPACE:-gossipcc}"
export PYTHONPATH="$RUNFILES/torch_backend:$RUNFILES/tests/torch_backend${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS=1
cd "$RUNFILES"
exec /usr/bin/python3 -m pytest -q -p no:cacheprovider "$@"
