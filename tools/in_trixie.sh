#!/usr/bin/env bash
# Runs a command inside the trixie (torch 2.x) root made by tools/trixie_root.sh, with this
# repository bind-mounted at the same path and /proc (of a PID namespace of its own), /dev,
# /dev/shm mounted; the mounts are undone when the last of the invocations running at the same
# time exits (a count under a lock: one exiting must not unmount /tmp under another), also on
# failure or Ctrl-C.
#   tools/in_trixie.sh COMMAND...      (run from anywhere; COMMAND runs in the repository root)
# Another Debian root the same way: GOSSIPCC_TRIXIE_ROOT=DIR (tools/in_forky.sh does so).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
ROOT=${GOSSIPCC_TRIXIE_ROOT:-/var/lib/gossipcc/trixie}
# apt-get, not python3: tools/trixie_root.sh installs the packages through this script, into
# a fresh minbase root that has no python3 yet.
[ -x "$ROOT/usr/bin/apt-get" ] || { echo "no Debian root at $ROOT: run tools/trixie_root.sh" >&2; exit 1; }
# Invocations running at the same time share the mounts: a count of users under a lock, one per
# root (named after its directory); the last one out unmounts everything this script mounts in
# that root (in reverse order).
COUNT="/run/gossipcc-$(basename "$ROOT")-users"
MOUNTS=("$ROOT" "$ROOT/dev" "$ROOT/dev/shm" "$ROOT/tmp" "$ROOT$REPO")
# The Debian source packages tools/setup.sh fetched for the wheel's static Gloo and Abseil
# (third_party/debian_sources.bzl): the same tarballs for the trixie root's wheel, read-only.
SRC_CACHE=${GOSSIPCC_SRC_CACHE:-/var/cache/gossipcc/src}
[ -d "$SRC_CACHE" ] && MOUNTS+=("$ROOT$SRC_CACHE")
users() {  # users DELTA: adds DELTA to the count under the lock, prints the new count
  (
    flock 9
    local n=0
    [ -s "$COUNT" ] && n=$(cat "$COUNT")
    n=$((n + $1)); [ "$n" -lt 0 ] && n=0
    echo "$n" > "$COUNT"
    echo "$n"
  ) 9>"$COUNT.lock"
}
cleanup() {
  local i
  if [ "$(users -1)" -eq 0 ]; then
    for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do umount -l "${MOUNTS[$i]}" 2>/dev/null || true; done
  fi
}
users 1 >/dev/null
trap cleanup EXIT INT TERM
mount_once() {  # mount_once TARGET MOUNT-ARGS...
  local target=$1; shift
  mkdir -p "$target"
  (flock 9; mountpoint -q "$target" || mount "$@" "$target") 9>"$COUNT.lock"
}
mount_once "$ROOT" --bind "$ROOT"
mount_once "$ROOT/dev" --bind /dev
mount_once "$ROOT/dev/shm" -t tmpfs tmpfs
mount_once "$ROOT/tmp" -t tmpfs tmpfs
mount_once "$ROOT$REPO" --bind "$REPO"
if [ -d "$SRC_CACHE" ]; then
  mount_once "$ROOT$SRC_CACHE" --bind "$SRC_CACHE"
  mount -o remount,bind,ro "$ROOT$SRC_CACHE" 2>/dev/null || true
fi
# The root is this host seen through another Debian: the same name resolution. Its own hosts file
# (debootstrap's) lacks this host's name, and torchrun's c10d rendezvous hands the workers the
# agent's host name: unresolvable, the workers retried until the launch timed out.
cp /etc/resolv.conf "$ROOT/etc/resolv.conf" 2>/dev/null || true
cp /etc/hosts "$ROOT/etc/hosts" 2>/dev/null || true
# In a PID namespace of its own, with its /proc: trixie's `ip netns` reads /proc/1/ns (the
# "init namespace"), which the host's /proc does not let a chroot read.
unshare --pid --fork --mount-proc="$ROOT/proc" chroot "$ROOT" /usr/bin/env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  LANG=C.UTF-8 TERM="${TERM:-dumb}" /bin/bash -c 'cd "$0" && exec "$@"' "$REPO" "$@"
