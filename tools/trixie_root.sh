#!/usr/bin/env bash
# Makes (once) a Debian trixie root file system with torch 2.x and the build tools, so the
# c10d backend can be built and tested against torch 2.x on this bookworm machine.
#   tools/trixie_root.sh            -> prints the root's path (default /var/lib/gossipcc/trixie)
# Idempotent: a finished root is marked and reused; a half-made one is removed and redone.
set -euo pipefail
ROOT=${GOSSIPCC_TRIXIE_ROOT:-/var/lib/gossipcc/trixie}
MIRROR=${GOSSIPCC_DEBIAN_MIRROR:-http://deb.debian.org/debian}
PACKAGES=(
  ca-certificates g++ bazel-bootstrap bazel-platforms bazel-rules-java bazel-skylib
  libgloo-dev libabsl-dev libgtest-dev libgmock-dev libeigen3-dev
  libtorch-dev python3-torch python3-dev pybind11-dev python3-pybind11 python3-pytest python3-numpy python3-expecttest python3-setuptools
  # The multi-host tests (tests/torch_backend:multihost_test): ip and tc for tools/emulated_cluster.py,
  # and what its delay line (tools/delay_line, a data dependency of the cluster) builds and runs with.
  iproute2 libnetfilter-queue-dev libmnl-dev iptables
  # sysctl: the emulated hosts' TCP settings (tools/emulated_cluster.py --host-tcp).
  procps
  # tools/wheel_test.sh: pip builds the wheel and installs it into a venv; its static Gloo and
  # Abseil are unpacked and patched from the source tarballs tools/setup.sh fetched
  # (third_party/debian_sources.bzl).
  python3-pip python3-venv patch xz-utils
)
marker="$ROOT/.gossipcc-packages"
want="${PACKAGES[*]}"
if [ -f "$marker" ] && [ "$(cat "$marker")" = "$want" ]; then
  echo "$ROOT"; exit 0
fi
log=$(mktemp); trap 'rm -f "$log"' EXIT
run_quiet() { if ! "$@" >"$log" 2>&1; then tail -n 40 "$log" >&2; echo "failed: $*" >&2; exit 1; fi; }
if ! command -v debootstrap >/dev/null; then
  run_quiet apt-get update -qq
  run_quiet env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap
fi
if [ ! -x "$ROOT/usr/bin/apt-get" ] || [ ! -f "$ROOT/.gossipcc-base" ]; then
  rm -rf "$ROOT"; mkdir -p "$(dirname "$ROOT")"
  run_quiet debootstrap --variant=minbase trixie "$ROOT" "$MIRROR"
  touch "$ROOT/.gossipcc-base"
fi
# Package scripts (the JDK's) need /proc: install through tools/in_trixie.sh, which mounts it.
in_root() { "$(dirname "$0")/in_trixie.sh" "$@"; }
run_quiet in_root apt-get update -qq
run_quiet in_root env DEBIAN_FRONTEND=noninteractive dpkg --configure -a
run_quiet in_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}"
in_root apt-get clean
echo "$want" >"$marker"
echo "$ROOT"
