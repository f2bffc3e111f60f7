#!/usr/bin/env bash
# The comm-layer demo (the main job is tools/train.sh): N local ranks run every collective and print a table of sizes, times and
# bus bandwidth.   tools/demo.sh [--ranks=4] [--min_bytes=4096] [--max_bytes=67108864]
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
bazel run //comm/bench:collectives_demo -- "$@"
