#!/usr/bin/env bash
# Bazel sh_test entry: PyTorch's distributed_test.py against gossipcc (run_distributed_test.py).
set -euo pipefail
RUNFILES="${TEST_SRCDIR:?}/${TEST_WORKSPACE:-gossipcc}"
# shims/ last: its expecttest stand-in is used only where Debian has no python3-expecttest.
export PYTHONPATH="$RUNFILES/torch_backend:$RUNFILES/tests/torch_backend:$RUNFILES/tests/torch_backend/shims"
export OMP_NUM_THREADS=1 WORLD_SIZE="${WORLD_SIZE:-2}"
cd "$TEST_TMPDIR"
exec /usr/bin/python3 "$RUNFILES/tests/torch_backend/run_distributed_test.py" -v "$@"
