#!/usr/bin/env bash
# One sitting on this commit: every benchmark of tools/bench and both main-job workloads, then
# docs/benchmarks.md's generated blocks rewritten from the results (tools/bench/sitting.py --help):
#   tools/bench/sitting.sh [--quick] [--layouts 4x2,4x1] [--network rate=100mbit,delay=25ms] [--allow-load] ...
# Builds the gossipcc package first, as tools/bench/run.sh does; the emulated network needs root.
set -euo pipefail
cd "$(dirname "$0")/../.."
tools/setup.sh
bazel build --jobs=2 --ui_event_filters=-info --noshow_progress //torch_backend:python_package //tools/delay_line
export PYTHONPATH="$PWD/bazel-bin/torch_backend${PYTHONPATH:+:$PYTHONPATH}"
echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%FT%TZ)"
exec /usr/bin/python3 tools/bench/sitting.py "$@"
