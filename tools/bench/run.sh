#!/usr/bin/env bash
# Runs one benchmark of tools/bench with the gossipcc package built and importable:
#   tools/bench/run.sh allreduce_backends|gossip_vs_allreduce|model_shapes|p2p_segments|powersgd_overlap|
#                      powersgd_vs_torch|projection|quantized_allreduce [flags]
# (each takes --help). Each runs on tools/bench/harness.py (--trials, --max-load, --allow-load,
# --results-dir), prints its tables and writes results/<benchmark>-<UTC time>/results.json, which
# tools/bench/report.py renders again. The emulated network needs root (tools/emulated_cluster.py).
set -euo pipefail
cd "$(dirname "$0")/../.."
name=${1:?usage: tools/bench/run.sh BENCHMARK [flags]}; shift
[ -f "tools/bench/${name}.py" ] || { echo "run.sh: no benchmark tools/bench/${name}.py" >&2; exit 2; }
tools/setup.sh
bazel build --jobs=2 --ui_event_filters=-info --noshow_progress //torch_backend:python_package
export PYTHONPATH="$PWD/bazel-bin/torch_backend${PYTHONPATH:+:$PYTHONPATH}"
echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%FT%TZ)"
exec /usr/bin/python3 "tools/bench/${name}.py" "$@"
