#!/usr/bin/env bash
# The main job: trains an MLP on scikit-learn's digits on 4 ranks, each rank its own host in a
# network namespace with a shaped link (default 1 Gbit/s), once per method (exact all-reduce on
# gossipcc and on gloo, PowerSGD, SGP, OSGP, D-PSGD, AD-PSGD); prints a table and writes it with
# a plot of accuracy against time to results/<date-time>/. Needs root for the namespaces.
#   tools/train.sh [--ranks 4] [--network 1gbit|10gbit|100mbit|none|local] [--methods all|a,b]
#                  [--steps 300] [--target 0.95] [--results DIR]      (--help for all flags)
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
bazel build --jobs=2 --ui_event_filters=-info --noshow_progress //torch_backend:python_package
export PYTHONPATH="$PWD/bazel-bin/torch_backend${PYTHONPATH:+:$PYTHONPATH}"
exec /usr/bin/python3 tools/train/train.py "$@"
