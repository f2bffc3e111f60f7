#!/usr/bin/env bash
# Runs a command inside the forky (newest torch) root made by tools/forky_root.sh, mounted and
# entered as tools/in_trixie.sh does for the trixie root (the repository at the same path, /proc,
# /dev, /dev/shm, a tmpfs /tmp; undone when the last concurrent invocation exits).
#   tools/in_forky.sh COMMAND...       (run from anywhere; COMMAND runs in the repository root)
set -euo pipefail
ROOT=${GOSSIPCC_FORKY_ROOT:-/var/lib/gossipcc/forky}
[ -x "$ROOT/usr/bin/apt-get" ] || { echo "no forky root at $ROOT: run tools/forky_root.sh" >&2; exit 1; }
GOSSIPCC_TRIXIE_ROOT="$ROOT" exec "$(dirname "$0")/in_trixie.sh" "$@"
