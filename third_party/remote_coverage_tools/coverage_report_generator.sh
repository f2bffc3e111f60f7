#!/bin/sh
echo "coverage reports need a networked Bazel (remote_coverage_tools); not available offline" >&2
exit 1
