#!/usr/bin/env bash
# Runs a command inside the trixie (torch 2.x) root made by tools/trixie_root.sh, with this
# repository bind-mounted at the same path and /proc (of a PID namespace of its own), /dev,
# /dev/shm mounted; every mount is
# undone on exit, also on failure or Ctrl-C.
#   tools/in_trixie.sh COMMAND...      (run from anywhere; COMMAND runs in the repository root)
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
ROOT=${GOSSIPCC_TRIXIE_ROOT:-/var/lib/gossipcc/trixie}
# apt-get, not python3: tools/trixie_root.sh installs the packages through this script, into
# a fresh minbase root that has no python3 yet.
[ -x "$ROOT/usr/bin/apt-get" ] || { echo "no trixie root at $ROOT: run tools/trixie_root.sh" >&2; exit 1; }
mounted=()
cleanup() {
  local i
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[$i]}" 2>/dev/null || true; done
}
trap cleanup EXIT INT TERM
mount_once() {  # mount_once TARGET MOUNT-ARGS...
  local target=$1; shift
  mkdir -p "$target"
  if ! mountpoint -q "$target"; then mount "$@" "$target"; mounted+=("$target"); fi
}
# The root a mount point of its own, so that `ip netns exec` (the multi-host tests) can make
# "/" a slave mount inside the chroot.
mount_once "$ROOT" --bind "$ROOT"
mount_once "$ROOT/dev" --bind /dev
mount_once "$ROOT/dev/shm" -t tmpfs tmpfs
mount_once "$ROOT/tmp" -t tmpfs tmpfs
mount_once "$ROOT$REPO" --bind "$REPO"
cp /etc/resolv.conf "$ROOT/etc/resolv.conf" 2>/dev/null || true
# In a PID namespace of its own, with its /proc: trixie's `ip netns` reads /proc/1/ns (the
# "init namespace"), which the host's /proc does not let a chroot read.
unshare --pid --fork --mount-proc="$ROOT/proc" chroot "$ROOT" /usr/bin/env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  LANG=C.UTF-8 TERM="${TERM:-dumb}" /bin/bash -c 'cd "$0" && exec "$@"' "$REPO" "$@"
