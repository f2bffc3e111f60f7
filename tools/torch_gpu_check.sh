#!/usr/bin/env bash
# The c10d backend on CUDA tensors, on a GPU machine that has a CUDA torch but no Bazel, no apt
# and no network: builds gossipcc's extension there with g++ against that torch, then runs
# tools/torch_gpu_check.py (collectives on CUDA tensors against their reference, on the
# caller's current stream; DDP on CUDA).
#   tools/torch_gpu_check.sh pack DIR   (here) DIR gets what the GPU machine lacks: Abseil,
#                                       Gloo and Eigen headers, the shared libraries of a GPU
#                                       bundle (tools/gpu_bundle.sh) and the nvcc-built kernels
#   tools/torch_gpu_check.sh run DIR    (there) builds into DIR/build, runs the checks
# Not part of the CI; docs/reliability.md ("GPU checks") records what it found.
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${1:?pack or run}
DIR=${2:?directory}
PY=${PYTHON:-python3}

if [ "$MODE" = pack ]; then
  [ -d gpu_bundle/lib ] || tools/gpu_bundle.sh
  rm -rf "$DIR" && mkdir -p "$DIR/include" "$DIR/lib"
  cp -r /usr/include/absl /usr/include/gloo "$DIR/include/"
  # The one header Debian's Gloo package lacks (third_party/BUILD.bazel, gloo_missing_headers).
  cp third_party/gloo_missing_headers/gloo/common/memory.h "$DIR/include/gloo/common/"
  cp -r /usr/include/eigen3 "$DIR/include/"
  cp gpu_bundle/lib/* "$DIR/lib/"
  cp "$(bazel info bazel-bin 2>/dev/null)/compression/power_sgd_kernels.pic.o" "$DIR/"
  du -sh "$DIR"
  exit 0
fi

DIR=$(cd "$DIR" && pwd)
OUT=$DIR/build
rm -rf "$OUT" && mkdir -p "$OUT/obj" "$OUT/gossipcc"
read -r TORCH_DIR ABI PY_INC TORCH_VERSION TORCH_CUDA < <("$PY" -c '
import os, sysconfig, torch
print(os.path.dirname(torch.__file__), int(torch._C._GLIBCXX_USE_CXX11_ABI), sysconfig.get_paths()["include"],
      torch.__version__, torch.version.cuda)')
[ -f "$PY_INC/Python.h" ] || { echo "no Python.h at $PY_INC (the Python headers are needed)" >&2; exit 1; }
# CUDA and NCCL headers: the toolkit's, or pip's nvidia/*/include.
CUDA_INC=()
for d in /usr/local/cuda/include $("$PY" -c '
import glob, os, sys
print(" ".join(d for p in sys.path for d in glob.glob(os.path.join(p, "nvidia", "*", "include"))))'); do
  [ -d "$d" ] && CUDA_INC+=("-isystem" "$d")
done
CUDA_LIB=()
for d in /usr/local/cuda/lib64 $("$PY" -c '
import glob, os, sys
print(" ".join(d for p in sys.path for d in glob.glob(os.path.join(p, "nvidia", "*", "lib"))))'); do
  [ -d "$d" ] && CUDA_LIB+=("-L$d" "-Wl,-rpath,$d")
done
echo "torch $TORCH_VERSION (CUDA $TORCH_CUDA, C++11 ABI $ABI) at $TORCH_DIR; Python headers $PY_INC"
echo "gloo symbols torch's libtorch_cpu exports: $(nm -D --defined-only "$TORCH_DIR/lib/libtorch_cpu.so" 2>/dev/null | grep -c 'gloo' || true)"

FLAGS=(-std=c++17 -O1 -fPIC -w -DGOSSIPCC_WITH_CUDA=1 -DGOSSIPCC_TORCH_CUDA=1 -D_GLIBCXX_USE_CXX11_ABI="$ABI"
       -I. -isystem "$DIR/include" -isystem "$DIR/include/eigen3" "${CUDA_INC[@]}"
       -isystem "$TORCH_DIR/include" -isystem "$TORCH_DIR/include/torch/csrc/api/include" -isystem "$PY_INC")
SOURCES=$(ls comm/*.cc comm/{core,gloo,p2p,nccl,sched}/*.cc algorithms/*.cc compression/*.cc torch_backend/*.cc | grep -v 'power_sgd_kernels_unavailable')
start=$SECONDS
printf '%s\n' $SOURCES | xargs -P "$(nproc)" -I{} sh -c 'g++ "$@" -c {} -o "'"$OUT"'/obj/$(echo {} | tr / _).o"' _ "${FLAGS[@]}"
g++ -shared -o "$OUT/gossipcc/_C.so" "$OUT"/obj/*.o "$DIR/power_sgd_kernels.pic.o" \
  "$DIR/lib/libgloo.so.0" "$DIR"/lib/libabsl_*.so.* -Wl,-rpath,"$DIR/lib" \
  -L"$TORCH_DIR/lib" -Wl,-rpath,"$TORCH_DIR/lib" -ltorch -ltorch_cpu -lc10 -lc10_cuda -ltorch_python \
  "${CUDA_LIB[@]}" -lnccl -lcublas -lcudart
echo "built in $((SECONDS - start)) s"
cp torch_backend/python/gossipcc/*.py "$OUT/gossipcc/"
cat >"$OUT/gossipcc/_build_info.py" <<EOF
TORCH_VERSION = '$TORCH_VERSION'
TORCH_CXX11_ABI = $([ "$ABI" = 1 ] && echo True || echo False)
TORCH_CUDA = '$TORCH_CUDA'
PYTHON_VERSION = '$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')'
WITH_CUDA = True
CUDA_VERSION = '$TORCH_CUDA'
NCCL_VERSION = None
EOF
# The same extension with the torch-side current stream compiled out (the legacy default
# stream, as before): the stream check must fail there, which shows that it can.
mkdir -p "$OUT/nostream/gossipcc"
g++ "${FLAGS[@]}" -UGOSSIPCC_TORCH_CUDA -DGOSSIPCC_TORCH_CUDA=0 -c torch_backend/tensor_buffer.cc -o "$OUT/nostream/tensor_buffer.o"
g++ -shared -o "$OUT/nostream/gossipcc/_C.so" $(ls "$OUT"/obj/*.o | grep -v torch_backend_tensor_buffer) \
  "$OUT/nostream/tensor_buffer.o" "$DIR/power_sgd_kernels.pic.o" \
  "$DIR/lib/libgloo.so.0" "$DIR"/lib/libabsl_*.so.* -Wl,-rpath,"$DIR/lib" \
  -L"$TORCH_DIR/lib" -Wl,-rpath,"$TORCH_DIR/lib" -ltorch -ltorch_cpu -lc10 -lc10_cuda -ltorch_python \
  "${CUDA_LIB[@]}" -lnccl -lcublas -lcudart
cp "$OUT"/gossipcc/*.py "$OUT/nostream/gossipcc/"
here=$PWD
cd /tmp
status=0
echo "== the extension as built"
LD_LIBRARY_PATH="$DIR/lib" PYTHONPATH="$OUT" "$PY" "$here/tools/torch_gpu_check.py" 2>"$OUT/stderr.log" || status=1
echo "== with the current stream compiled out (the stream check expects the failure)"
TORCH_GPU_CHECK_EXPECT_STREAM_FAILURE=1 LD_LIBRARY_PATH="$DIR/lib" PYTHONPATH="$OUT/nostream" "$PY" "$here/tools/torch_gpu_check.py" \
  2>"$OUT/stderr_nostream.log" || status=1
exit $status
