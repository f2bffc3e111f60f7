#!/usr/bin/env bash
# Builds a folder that runs gossipcc's CUDA/NCCL C++ tests on a machine with an NVIDIA GPU and
# driver but no Bazel, no apt and no network (docs/reliability.md, "GPU checks").
#   tools/gpu_bundle.sh [OUT_DIR]      (default: gpu_bundle/ in the repository root)
#   OUT_DIR/run.sh                     (on the GPU machine; here every GPU case skips)
#
# What is in it, and why:
#   bin/  the test binaries (tests tagged "gpu": NCCL collectives, PowerSGD's CUDA path, gossip on
#         CUDA buffers) with gossipcc's own libraries and the CUDA runtime linked in statically;
#   lib/  the shared libraries they need that a GPU machine may not have (Gloo, Abseil and theirs);
#   runtime/  this machine's glibc, libstdc++ and loader: run.sh uses them only on a machine whose
#         glibc is older than this one's (a newer one runs the binaries as they are, and its own
#         NCCL may need its newer glibc);
#   NCCL (~200 MB) and cuBLAS (~600 MB) stay out: run.sh takes the GPU machine's (a CUDA
#   toolkit's, or those of pip's torch in nvidia/*/lib), as does the driver.
# The folder must stay under 60 MiB; the script fails if it does not.
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${1:-gpu_bundle}
TARGETS=(//tests/comm:nccl_test //tests/algorithms:gossip_cuda_test //tests/compression:power_sgd_cuda_test)
LIMIT_MIB=60

if [ ! -f /usr/local/cuda/include/nccl.h ] && [ -z "${CUDA_HOME:-}" ]; then
  echo "gpu_bundle: no CUDA toolkit with NCCL (/usr/local/cuda or CUDA_HOME): the binaries would be built" \
       "without CUDA and test nothing on a GPU" >&2
  exit 1
fi

bazel build --define=gossipcc_cudart=static "${TARGETS[@]}"
BIN=$(bazel info bazel-bin 2>/dev/null)

rm -rf "$OUT"
mkdir -p "$OUT/bin" "$OUT/lib" "$OUT/runtime"
for t in "${TARGETS[@]}"; do
  path=${t#//}
  path=${path/://}
  install -m 755 "$BIN/$path" "$OUT/bin/"
done

# Every shared library the binaries resolve here, but the driver's and the big CUDA libraries'.
# `ldd` prints "name => path (address)" or "path (address)" (the loader).
is_external() {
  case "$1" in
    libcuda.so*|libnccl.so*|libcublas.so*|libcublasLt.so*|libcudart.so*|linux-vdso.so*) return 0 ;;
  esac
  return 1
}
for b in "$OUT"/bin/*; do
  ldd "$b" | while read -r first arrow path _; do
    if [ "$arrow" = "=>" ]; then
      is_external "$first" && continue
      [ -f "$path" ] || { echo "gpu_bundle: $b needs $first, not found here" >&2; exit 1; }
      case "$first" in  # the C/C++ runtime: used only where the machine's glibc is older
        libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|libstdc++.so*|libgcc_s.so*) dest=runtime ;;
        *) dest=lib ;;
      esac
      cp -L -n "$path" "$OUT/$dest/$first"
    elif [ -f "$first" ]; then  # the dynamic loader
      cp -L -n "$first" "$OUT/runtime/ld-linux.so"
    fi
  done
done
chmod 755 "$OUT/runtime/ld-linux.so"
getconf GNU_LIBC_VERSION | awk '{print $2}' >"$OUT/runtime/GLIBC_VERSION"
install -m 755 tools/gpu_bundle_run.sh "$OUT/run.sh"
git rev-parse HEAD >"$OUT/COMMIT" 2>/dev/null || echo unknown >"$OUT/COMMIT"

size_mib=$(( $(du -sb "$OUT" | cut -f1) / 1048576 ))
echo "gpu_bundle: $OUT: ${size_mib} MiB, $(ls "$OUT/bin" | wc -l) test binaries, $(ls "$OUT/lib" | wc -l) libraries"
if [ "$size_mib" -ge "$LIMIT_MIB" ]; then
  echo "gpu_bundle: $OUT is ${size_mib} MiB, over the ${LIMIT_MIB} MiB limit" >&2
  exit 1
fi
