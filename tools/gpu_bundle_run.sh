#!/usr/bin/env bash
# run.sh of a GPU bundle (built by tools/gpu_bundle.sh): runs every test binary in bin/ and
# prints one line per test case, then "N passed, N failed, N skipped". Exit status 1 when a
# case failed or a binary crashed, else 0. Needs bash, coreutils and the NVIDIA driver; nothing
# is installed or downloaded.
#   run.sh [gtest filter]       e.g. run.sh 'NcclCollectivesTest.*'
# NCCL and cuBLAS come from the machine: $GOSSIPCC_CUDA_LIBS (directories separated by ':'),
# then $LD_LIBRARY_PATH, /usr/local/cuda/lib64, and the nvidia/*/lib folders of any Python
# found on PATH (pip's torch brings NCCL and cuBLAS there).
# Environment: GOSSIPCC_GPU_TEST_TIMEOUT (seconds per binary, default 1200).
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
FILTER=${1:-*}
TIMEOUT=${GOSSIPCC_GPU_TEST_TIMEOUT:-1200}

# Directories holding libnccl.so.2 or libcublas.so.13, in the order above.
candidates=()
IFS=: read -r -a from_env <<<"${GOSSIPCC_CUDA_LIBS:-}:${LD_LIBRARY_PATH:-}"
candidates+=("${from_env[@]}" /usr/local/cuda/lib64 /usr/lib/x86_64-linux-gnu)
for py in python3 python; do
  command -v "$py" >/dev/null 2>&1 || continue
  while IFS= read -r d; do candidates+=("$d"); done < <("$py" - <<'EOF' 2>/dev/null
import glob, os, sys
for p in sys.path:
    for d in sorted(glob.glob(os.path.join(p, "nvidia", "*", "lib"))):
        print(d)
EOF
)
done
cuda_libs=""
for lib in libnccl.so.2 libcublas.so.13 libcublasLt.so.13; do
  for d in "${candidates[@]}"; do
    if [ -n "$d" ] && [ -e "$d/$lib" ]; then
      case ":$cuda_libs:" in *":$d:"*) ;; *) cuda_libs="$cuda_libs:$d" ;; esac
      break
    fi
  done
done
cuda_libs=${cuda_libs#:}
echo "# gossipcc GPU bundle $(cat "$HERE/COMMIT" 2>/dev/null) on $(uname -n)"
echo "# NCCL/cuBLAS from: ${cuda_libs:-(not found: CUDA cases will fail to load)}"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/# GPU: /'
else
  echo "# GPU: none (no nvidia-smi)"
fi

# The machine's glibc if it is at least the one the binaries were built with (its NCCL may need
# it); else the bundled glibc, libstdc++ and loader.
built=$(cat "$HERE/runtime/GLIBC_VERSION")
have=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
native=0
if [ -n "$have" ] && [ "$(printf '%s\n%s\n' "$built" "$have" | sort -V | head -n 1)" = "$built" ]; then native=1; fi
echo "# glibc: machine ${have:-unknown}, built with $built: $([ "$native" = 1 ] && echo "the machine's" || echo "the bundled one")"

passed=0 failed=0 skipped=0
for bin in "$HERE"/bin/*; do
  name=$(basename "$bin")
  log=$(mktemp)
  if [ "$native" = 1 ]; then
    LD_LIBRARY_PATH="$HERE/lib${cuda_libs:+:$cuda_libs}" timeout -k 10 "$TIMEOUT" \
      "$bin" --gtest_filter="$FILTER" --gtest_color=no >"$log" 2>&1
  else
    timeout -k 10 "$TIMEOUT" "$HERE/runtime/ld-linux.so" --library-path "$HERE/runtime:$HERE/lib${cuda_libs:+:$cuda_libs}" \
      "$bin" --gtest_filter="$FILTER" --gtest_color=no >"$log" 2>&1
  fi
  rc=$?
  # One line per case: the gtest result line, with a skip's reason (the line gtest prints
  # after "Skipped") or a failure's first message; then "COUNTS passed failed skipped".
  report=$(awk -v name="$name" '
    /^\[ RUN      \]/ { current = $4; reason = ""; next }
    /: Skipped$/ { want_reason = 1; next }
    want_reason { reason = $0; want_reason = 0; next }
    /: Failure$/ { if (!(current in first)) { getline msg; first[current] = msg }; next }
    /^\[       OK \]/ { printf "PASS  %s %s %s %s\n", name, $4, $5, $6; p++; next }
    /^\[  SKIPPED \]/ && $4 !~ /^[0-9]/ && !skip_seen[$4]++ { printf "SKIP  %s %s: %s\n", name, $4, reason; s++; next }
    /^\[  FAILED  \]/ && $4 !~ /^[0-9]/ && !fail_seen[$4]++ { printf "FAIL  %s %s: %s\n", name, $4, first[$4]; f++; next }
    END { printf "COUNTS %d %d %d\n", p, f, s }' "$log")
  grep -v '^COUNTS ' <<<"$report"
  read -r _ p f s < <(grep '^COUNTS ' <<<"$report")
  passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
    # A crash, a timeout or a binary that did not load: no case line says so.
    failed=$((failed + 1))
    why="exit status $rc"
    [ "$rc" -eq 124 ] && why="timed out after ${TIMEOUT} s"
    echo "FAIL  $name (whole binary): $why; last lines:"
    tail -n 15 "$log" | sed 's/^/      /'
  elif [ "$f" -gt 0 ]; then
    echo "      ($name's full log: $log)"
    continue
  fi
  rm -f "$log"
done
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
