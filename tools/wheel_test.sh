#!/usr/bin/env bash
# The pip path of a user (docs/pytorch.md, "Installing with pip"): builds gossipcc's wheel with pip (pyproject.toml, against
# the torch of Debian's /usr/bin/python3), installs it into a fresh venv that sees the system's
# torch (--system-site-packages), and tests the installed package from a directory outside the
# source tree, so nothing can come from bazel-bin: tools/extension_isolation_check.sh (the
# extension needs no libgloo/libabsl and exports no gloo::/absl:: symbol), tests/wheel/test_installed.py (where it was
# imported from, the version, python -m gossipcc.info, the ImportError under another torch), then
# a subset of the backend's tests (test_collectives.py, test_ddp.py) with only their helpers
# (tests/torch_backend) on PYTHONPATH.
#   tools/wheel_test.sh                         # bookworm: torch 1.13
#   tools/in_trixie.sh tools/wheel_test.sh      # the trixie root: torch 2.6
# Offline: pip installs with --no-index; torch comes from Debian's python3-torch.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${GOSSIPCC_WHEEL_PYTHON:-/usr/bin/python3}
WORK=$(mktemp -d /tmp/gossipcc-wheel.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
unset PYTHONPATH
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

step() { echo "-- $*"; }
step "venv: $PYTHON -m venv --system-site-packages"
"$PYTHON" -m venv --system-site-packages "$WORK/venv"
VPY="$WORK/venv/bin/python"

step "pip wheel --no-build-isolation $REPO (the venv's interpreter: its torch is the system's)"
start=$SECONDS
"$VPY" -m pip wheel -q --no-build-isolation --no-deps -w "$WORK/dist" "$REPO"
wheel=$(ls "$WORK"/dist/gossipcc-*.whl)
echo "   $(basename "$wheel"): $(du -k "$wheel" | cut -f1) KiB, built in $((SECONDS - start)) s"

step "pip install --no-index $(basename "$wheel")"
"$VPY" -m pip install -q --no-index "$wheel"

cd "$WORK"  # outside the source tree
step "isolation: the installed extension links Gloo and Abseil privately (ldd, nm -D)"
"$REPO/tools/extension_isolation_check.sh" "$(ls "$WORK"/venv/lib/python*/site-packages/gossipcc/_C*.so)"
step "python -m gossipcc.info"
"$VPY" -m gossipcc.info
step "tests/wheel/test_installed.py"
"$VPY" -m pytest -q -p no:cacheprovider "$REPO/tests/wheel/test_installed.py"
step "backend tests against the installed package: test_collectives.py, test_ddp.py"
OMP_NUM_THREADS=1 PYTHONPATH="$REPO/tests/torch_backend" "$VPY" -m pytest -q -p no:cacheprovider \
  "$REPO/tests/torch_backend/test_collectives.py" "$REPO/tests/torch_backend/test_ddp.py"
