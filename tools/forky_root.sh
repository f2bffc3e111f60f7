#!/usr/bin/env bash
# Makes (once) a Debian forky root file system with the newest torch of the test matrix (forky's
# python3-torch/libtorch-dev, Python 3.14) and the build tools, so the c10d backend can be built
# and tested against it on this bookworm machine; tools/in_forky.sh runs commands in it.
#   tools/forky_root.sh            -> prints the root's path (default /var/lib/gossipcc/forky)
# Idempotent: a finished root is marked and reused; a half-made one is removed and redone.
# Bazel: forky's own bazel-bootstrap (7.x) builds this WORKSPACE (written for Bazel 4.2.3) with
# the flags the root's /etc/bazel.bazelrc gets below: WORKSPACE mode instead of Bzlmod, and the
# repositories Bazel 7's own rules fetch from GitHub pointed at forky's Debian copies; and
# C++20, which torch 2.14's headers require, through /usr/local/bin/bazel (first on the root's
# PATH): the workspace's .bazelrc says C++17 and is read after any system rc file, so the
# standard goes on the command line, after the command (`bazel build|test|run ...`).
set -euo pipefail
ROOT=${GOSSIPCC_FORKY_ROOT:-/var/lib/gossipcc/forky}
MIRROR=${GOSSIPCC_DEBIAN_MIRROR:-http://deb.debian.org/debian}
PACKAGES=(
  ca-certificates g++ bazel-bootstrap bazel-platforms bazel-rules-java bazel-skylib
  libgloo-dev libabsl-dev libgtest-dev libgmock-dev libeigen3-dev
  libtorch-dev python3-torch python3-dev pybind11-dev python3-pybind11 python3-pytest python3-numpy python3-expecttest python3-setuptools
  # tools/wheel_test.sh (pip builds the wheel into a venv from the tarballs tools/setup.sh fetched).
  python3-pip python3-venv patch xz-utils
  # The emulated cluster's tools, which the backend's smoke tests may launch with.
  iproute2 procps
)
# The root's /etc/bazel.bazelrc, read by forky's /etc/bazel/bazelrc (try-import): every Bazel
# command in the root gets these.
BAZELRC='common --noenable_bzlmod
common --override_repository=bazel_skylib=/usr/share/bazel/tools/skylib
common --override_repository=bazel_features=/usr/share/bazel/tools/features
common --override_repository=rules_license=/usr/share/bazel/rules/license
common --override_repository=rules_python=/usr/share/bazel/rules/python
common --override_repository=rules_proto=/usr/share/bazel/rules/proto'
BAZEL_WRAPPER='#!/bin/sh
# tools/forky_root.sh: torch 2.14 needs C++20 (the workspace .bazelrc: C++17, read after /etc).
case "$1" in
  build|test|run|coverage|cquery|aquery)
    cmd=$1; shift; exec /usr/bin/bazel "$cmd" --cxxopt=-std=c++20 --host_cxxopt=-std=c++20 "$@" ;;
esac
exec /usr/bin/bazel "$@"'
marker="$ROOT/.gossipcc-packages"
want="${PACKAGES[*]} | $BAZELRC | $BAZEL_WRAPPER"
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
  # bookworm's debootstrap has no script named forky; every Debian suite uses the sid one.
  run_quiet debootstrap --variant=minbase forky "$ROOT" "$MIRROR" /usr/share/debootstrap/scripts/sid
  touch "$ROOT/.gossipcc-base"
fi
# forky is Debian's testing suite: its Release file carries a Valid-Until a week or so ahead,
# which an archive mirrored earlier than this machine's clock has passed; apt then refuses it
# ("Release file ... is expired"). The root accepts such a Release (still signature-checked).
echo 'Acquire::Check-Valid-Until "false";' >"$ROOT/etc/apt/apt.conf.d/99gossipcc-valid-until"
in_root() { "$(dirname "$0")/in_forky.sh" "$@"; }
run_quiet in_root apt-get update -qq
run_quiet in_root env DEBIAN_FRONTEND=noninteractive dpkg --configure -a
run_quiet in_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}"
in_root apt-get clean
echo "$BAZELRC" >"$ROOT/etc/bazel.bazelrc"
mkdir -p "$ROOT/usr/local/bin"
echo "$BAZEL_WRAPPER" >"$ROOT/usr/local/bin/bazel"
chmod 755 "$ROOT/usr/local/bin/bazel"
echo "$want" >"$marker"
echo "$ROOT"
