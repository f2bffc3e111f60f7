#!/usr/bin/env bash
# Installs every Debian package gossipcc needs. Idempotent; quiet on success.
# Nothing is downloaded at build time: Bazel builds against these packages offline.
set -euo pipefail

PACKAGES=(
  # Build: Bazel 4.2.3 and the rule repositories it needs locally.
  bazel-bootstrap bazel-platforms bazel-rules-java bazel-skylib g++
  # Libraries: Gloo (CPU transport), Abseil, GoogleTest/GoogleMock, Eigen (PowerSGD on CPU).
  libgloo-dev libabsl-dev libgtest-dev libgmock-dev libeigen3-dev
  # The c10d backend (torch 1.13 on bookworm) and its Python tests.
  libtorch-dev python3-torch python3-dev pybind11-dev python3-pybind11 python3-pytest python3-numpy
  # tools/wheel_test.sh: `pip install --no-build-isolation .` into a venv (pyproject.toml).
  python3-pip python3-venv
  # An optimised BLAS for torch (Debian's torch calls the generic BLAS, which is the reference
  # implementation unless one is installed: the main job's MLP forward took 18 ms instead of
  # 3.7 ms). The OpenMP build follows torch.set_num_threads / OMP_NUM_THREADS like torch does.
  libopenblas0-openmp
  # The main job and benchmarks (tools/train.sh, tools/bench/): the digits data set, plots, and
  # iproute2 (ip, tc) for the emulated cluster (tools/emulated_cluster.py).
  python3-sklearn python3-matplotlib iproute2
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
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
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
