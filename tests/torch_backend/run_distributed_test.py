"""Runs PyTorch's own distributed test suite (torch/testing/_internal/distributed/
distributed_test.py) against backend="gossipcc", as PyTorch runs it for its own backends.

    python3 run_distributed_test.py [unittest args, e.g. -k test_all_reduce]

Environment: WORLD_SIZE (default 2). Cases PyTorch skips for plugin backends, and those
that need features gossipcc does not have, are listed with reasons in docs/pytorch.md.
"""
import os
import sys
import tempfile

os.environ["BACKEND"] = "gossipcc"
os.environ.setdefault("WORLD_SIZE", "2")
os.environ.setdefault("TEMP_DIR", tempfile.mkdtemp(prefix="gossipcc_dist_test_", dir=os.environ.get("TEST_TMPDIR")))

import gossipcc  # noqa: E402,F401  - registers the backend (also in every spawned rank)
from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

# gossipcc is a plugin backend with DDP and subgroup support.
DistTestCases.backend_feature["plugin"].add("gossipcc")
DistTestCases.backend_feature["ddp"].add("gossipcc")
DistTestCases.backend_feature["subgroup"].add("gossipcc")

from torch.testing._internal.common_utils import run_tests  # noqa: E402
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest, TestDistBackend)


class TestGossipccBackend(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()


if __name__ == "__main__":
    run_tests()
