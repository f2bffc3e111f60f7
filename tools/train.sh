#!/usr/bin/env bash
# The main job, two workloads on 4 ranks, each rank its own host in a network namespace with a
# shaped link, once per method; each prints a table and writes it with a plot to results/:
#   digits: an MLP on scikit-learn's digits (default 1 Gbit/s): exact all-reduce on gossipcc
#           and on gloo, PowerSGD, SGP, OSGP, D-PSGD, AD-PSGD; test accuracy against time
#   lm:     a byte-level GPT on the text of Debian's fortunes package (default 100 Mbit/s):
#           every method above plus DiLoCo and Streaming DiLoCo over each outer transport;
#           validation loss against time, bytes per inner step (tools/train/lm_job.py)
# Needs root for the namespaces.
#   tools/train.sh                   both workloads with their defaults (digits, then lm)
#   tools/train.sh digits [flags]    the digits workload: [--ranks 4] [--network 1gbit|10gbit|
#                                    100mbit|none|local] [--methods all|a,b] [--steps 300] ...
#   tools/train.sh lm [flags]        the LM workload: [--network 100mbit] [--methods all|a,b]
#                                    [--time-budget 50] [--targets 3.0,2.9] [--trials 5]
#                                    [--tuned FILE] [--smoke] ...; --tune: the learning-rate pass
#   tools/train.sh --flag ...        (no workload named) the digits workload, as before
# `tools/train.sh digits --help` and `tools/train.sh lm --help` list every flag.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
bazel build --jobs=2 --ui_event_filters=-info --noshow_progress //torch_backend:python_package
export PYTHONPATH="$PWD/bazel-bin/torch_backend${PYTHONPATH:+:$PYTHONPATH}"
case "${1:-}" in
  digits) shift; exec /usr/bin/python3 tools/train/train.py "$@" ;;
  lm) shift; exec /usr/bin/python3 tools/train/lm_job.py "$@" ;;
  "")
    status=0
    /usr/bin/python3 tools/train/train.py || status=$?
    /usr/bin/python3 tools/train/lm_job.py || status=$?
    exit "$status" ;;
  *) exec /usr/bin/python3 tools/train/train.py "$@" ;;
esac
