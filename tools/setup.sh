#!/usr/bin/env bash
# Installs every Debian package gossipcc needs. Idempotent; quiet on success.
# Nothing is downloaded at build time: Bazel builds against these packages offline.
set -euo pipefail

PACKAGES=(
  # Build: Bazel 4.2.3 and the rule repositories it needs locally.
  bazel-bootstrap bazel-platforms bazel-rules-java bazel-skylib g++
  # The wheel's Gloo and Abseil are compiled from Debian source packages (below): unpacked and
  # patched by a Bazel repository rule (third_party/debian_sources.bzl).
  patch xz-utils
  # Libraries: Gloo (CPU transport), Abseil, GoogleTest/GoogleMock, Eigen (PowerSGD on CPU).
  libgloo-dev libabsl-dev libgtest-dev libgmock-dev libeigen3-dev
  # The c10d backend (torch 1.13 on bookworm) and its Python tests.
  libtorch-dev python3-torch python3-dev pybind11-dev python3-pybind11 python3-pytest python3-numpy
  # tools/wheel_test.sh: `pip install --no-build-isolation .` into a venv (pyproject.toml).
  python3-pip python3-venv
  # An optimised BLAS for torch (Debian's torch calls the generic BLAS, which is the reference
  # implementation unless one is installed; docs/benchmarks.md, "The machine"). The OpenMP build follows torch.set_num_threads / OMP_NUM_THREADS like torch does.
  libopenblas0-openmp
  # The main job and benchmarks (tools/train.sh, tools/bench/): the digits data set, plots, and
  # iproute2 (ip, tc) for the emulated cluster (tools/emulated_cluster.py).
  python3-sklearn python3-matplotlib iproute2
  # The emulated cluster's WAN delay, jitter and loss on kernels without sch_netem: the NFQUEUE
  # delay line (tools/delay_line, built against libnetfilter-queue and libmnl) and the iptables
  # rule that hands a host's outgoing packets to it (tools/wan_link.py).
  libnetfilter-queue-dev libmnl-dev iptables
  # sysctl: the emulated hosts' TCP settings (tools/emulated_cluster.py --host-tcp).
  procps
  # The main job's language-model workload (tools/train/lm.py): the text it trains on, about
  # 2.6 MB of English in /usr/share/games/fortunes.
  fortunes
  # tools/trixie_root.sh: a Debian trixie root with torch 2.x, to test the backend against it.
  debootstrap
  # tools/fuzz.sh: clang with libFuzzer and the sanitizer runtimes (libclang-rt-dev ->
  # libclang-rt-14-dev on bookworm), and pkg-config for Abseil's link flags.
  clang libclang-rt-dev pkgconf
  # tools/slurm_cluster.sh (the Slurm example's test): a one-machine Slurm cluster. slurmctld,
  # slurmd, the client commands (sbatch, srun, sinfo, scontrol) and munge (Slurm's auth/munge);
  # slurm-wlm is only the metapackage of the first three. On a machine whose init system lets
  # packages start services, installing them also starts the system's own munge/slurm daemons;
  # tools/slurm_cluster.sh uses its own config, key, socket and ports and neither needs nor
  # touches those.
  slurmctld slurmd slurm-client munge
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
if [ ${#missing[@]} -ne 0 ]; then
  log=$(mktemp /tmp/gossipcc-setup.XXXXXX.log)
  if ! { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
    echo "setup: installing ${missing[*]} failed; log follows" >&2
    cat "$log" >&2
    exit 1
  fi
  rm -f "$log"
  if [ ! -e /usr/local/cuda/include/nccl.h ]; then
    echo "setup: note: no CUDA toolkit at /usr/local/cuda; CUDA/NCCL paths compile out and their tests skip" >&2
  fi
fi

# Source packages for the wheel (tools/pep517): its extension links Gloo (core + TCP transport)
# and Abseil statically, compiled with -fPIC and hidden symbols, so it loads no libgloo/libabsl
# next to pip's torch (which bundles its own Gloo). Debian ships Gloo only as a shared library
# and bookworm's static Abseil is not position-independent, so both are compiled from Debian's
# source packages: trixie's, one set of sources for the bookworm build and the trixie root's
# (tools/in_trixie.sh bind-mounts this directory). Only the upstream and Debian tarballs are
# fetched, each checked against the SHA-256 in trixie's signed Sources index (apt's own
# download; the .dsc of gloo is missing from the archive's pool, and is not needed). Kept in
# $GOSSIPCC_SRC_CACHE (default /var/cache/gossipcc/src) with a manifest (SOURCES) that
# third_party/debian_sources.bzl reads; a complete manifest means nothing is fetched again.
SRC_CACHE=${GOSSIPCC_SRC_CACHE:-/var/cache/gossipcc/src}
SRC_SUITE=trixie
SRC_PACKAGES=(abseil gloo)
sources_complete() {
  [ -s "$SRC_CACHE/SOURCES" ] || return 1
  local name version orig debian
  for name in "${SRC_PACKAGES[@]}"; do
    read -r _ version orig debian < <(grep "^$name " "$SRC_CACHE/SOURCES") || return 1
    [ -n "$debian" ] && [ -s "$SRC_CACHE/$orig" ] && [ -s "$SRC_CACHE/$debian" ] || return 1
  done
}
if ! sources_complete; then
  fetch_failed() {
    echo "setup: could not fetch the Debian source packages ${SRC_PACKAGES[*]} ($SRC_SUITE) into $SRC_CACHE," >&2
    echo "setup: which the wheel's self-contained extension is compiled from (tools/pep517, third_party/debian_sources.bzl): $1" >&2
    exit 1
  }
  $SUDO mkdir -p "$SRC_CACHE/apt/lists/partial"
  # A private apt configuration: the system's sources and package lists are left as they are.
  echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $SRC_SUITE main" |
    $SUDO tee "$SRC_CACHE/apt/sources.list" >/dev/null
  APT_SRC=(-o "Dir::Etc::SourceList=$SRC_CACHE/apt/sources.list" -o Dir::Etc::SourceParts=/nonexistent
           -o "Dir::State::Lists=$SRC_CACHE/apt/lists" -o Debug::NoDropPrivs=true)
  log=$(mktemp /tmp/gossipcc-setup.XXXXXX.log)
  $SUDO apt-get "${APT_SRC[@]}" update -qq --error-on=any >"$log" 2>&1 || { cat "$log" >&2; fetch_failed "apt-get update of the deb-src index failed (log above)"; }
  # Lines: 'URI' FILE SIZE SHA256:HASH, for the .dsc, the upstream tarball and the Debian one.
  uris=$(cd "$SRC_CACHE/apt" && $SUDO apt-get "${APT_SRC[@]}" source --print-uris "${SRC_PACKAGES[@]}" 2>"$log") ||
    { cat "$log" >&2; fetch_failed "apt-get source --print-uris failed (log above)"; }
  manifest=""
  for name in "${SRC_PACKAGES[@]}"; do
    dsc=$(grep -oE "^'[^']+' ${name}_[^ ]+\.dsc " <<<"$uris" | awk '{print $2}' | head -n 1)
    [ -n "$dsc" ] || fetch_failed "no source package $name in $SRC_SUITE's Sources index"
    version=${dsc#"${name}_"}; version=${version%.dsc}
    orig="" debian=""
    while read -r uri file _ hash; do
      uri=${uri//\'/}
      case "$file" in
        "${name}_${version%-*}.orig.tar."*) orig=$file ;;
        "${name}_${version}.debian.tar."*) debian=$file ;;
        *) continue ;;
      esac
      if [ ! -s "$SRC_CACHE/$file" ]; then
        $SUDO /usr/lib/apt/apt-helper download-file "$uri" "$SRC_CACHE/$file.part" "$hash" >"$log" 2>&1 ||
          { cat "$log" >&2; fetch_failed "downloading $uri failed (log above)"; }
        $SUDO mv "$SRC_CACHE/$file.part" "$SRC_CACHE/$file"
      fi
    done <<<"$uris"
    [ -n "$orig" ] && [ -n "$debian" ] || fetch_failed "$name $version has no .orig.tar.* and .debian.tar.* (a native package?)"
    manifest+="$name $version $orig $debian"$'\n'
  done
  rm -f "$log"
  printf '%s' "# package version upstream-tarball debian-tarball (tools/setup.sh; Debian $SRC_SUITE)"$'\n'"$manifest" |
    $SUDO tee "$SRC_CACHE/SOURCES.part" >/dev/null
  $SUDO mv "$SRC_CACHE/SOURCES.part" "$SRC_CACHE/SOURCES"
  sources_complete || fetch_failed "the manifest $SRC_CACHE/SOURCES is incomplete"
fi
