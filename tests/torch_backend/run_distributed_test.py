"""Runs PyTorch's own distributed test suite (torch/testing/_internal/distributed/
distributed_test.py) against backend="gossipcc", as PyTorch runs it for its own backends.

    python3 run_distributed_test.py [unittest args, e.g. -k test_all_reduce]

Environment: WORLD_SIZE (default 2). Cases PyTorch skips for plugin backends, and those
that need features gossipcc does not have, are listed with reasons in docs/pytorch.md.
"""
import faulthandler
import os
import re
import sys
import tempfile
import unittest

os.environ["BACKEND"] = "gossipcc"
os.environ.setdefault("WORLD_SIZE", "2")
os.environ.setdefault("TEMP_DIR", tempfile.mkdtemp(prefix="gossipcc_dist_test_", dir=os.environ.get("TEST_TMPDIR")))

import gossipcc  # noqa: E402,F401  - registers the backend (also in every spawned rank)
from gossipcc import _C  # noqa: E402
from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

# gossipcc is a plugin backend with DDP and subgroup support.
DistTestCases.backend_feature["plugin"].add("gossipcc")
DistTestCases.backend_feature["ddp"].add("gossipcc")
DistTestCases.backend_feature["subgroup"].add("gossipcc")

from torch.testing._internal.common_utils import run_tests  # noqa: E402
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest, TestDistBackend)


# A rank stuck this long dumps every thread's Python stack to the test log (the suite then
# kills it at its own per-case timeout, 300 s, which says only "timed out").
_HANG_DUMP_SECONDS = float(os.environ.get("GOSSIPCC_SUITE_HANG_DUMP_S", "240"))


class TestGossipccBackend(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        import torch
        if torch.cuda.is_available():
            self._spawn_processes()  # CUDA cannot be used in a forked child
        else:
            # Forked ranks start in milliseconds instead of re-importing torch (~2 s each).
            # OMP_NUM_THREADS=1 (run_distributed_suite.sh) keeps the parent free of OpenMP
            # threads, which a fork would copy in a broken state.
            self._start_processes(torch.multiprocessing.get_context("fork").Process)

    @classmethod
    def _run(cls, *args, **kwargs):
        faulthandler.dump_traceback_later(_HANG_DUMP_SECONDS, exit=False)
        super()._run(*args, **kwargs)


# Cases the suite reserves for Gloo (or "Gloo or NCCL") by name: on CPU gossipcc offers what
# Gloo does, so run them. The suite's skip decorator (sandcastle_skip) only marks the function
# (__unittest_skip__), or, as unittest.skip, wraps it keeping it as __wrapped__. Inner
# decorators (GPU counts, world size) still apply. Those that test Gloo's own behaviour, or
# use CUDA without checking for it, are skipped again below, each with its reason.
# The same for the suite's other allow-lists that name CPU features gossipcc has (futures,
# batched CPU send/recv, CPU all-to-all, barrier timeouts).
_CPU_FEATURE_SKIPS = ("get_future is only supported on", "GLOO Batch Send Recv CPU", "Only MPI supports CPU all_to_all",
                      "Only MPI supports all_to_all", "Only gloo backend supports timeouts")


def _reserved_for_cpu_backends(reason):
    # torch 1.13: "Test requires backend to be one of {...}"; 2.x: "... backend gossipcc to be ...".
    return (re.match(r"Test requires backend (\S+ )?to be one of", reason) is not None and "gloo" in reason) or \
        reason.startswith(_CPU_FEATURE_SKIPS)


for _name in dir(TestGossipccBackend):
    _test = getattr(TestGossipccBackend, _name)
    _reason = getattr(_test, "__unittest_skip_why__", "")
    if _name.startswith("test") and _reserved_for_cpu_backends(_reason):
        if "skip_wrapper" in getattr(_test, "__qualname__", ""):
            setattr(TestGossipccBackend, _name, _test.__wrapped__)
        else:
            _test.__unittest_skip__ = False


def _skip(names, reason):
    for name in names:
        setattr(TestGossipccBackend, name, unittest.skip(reason)(getattr(TestGossipccBackend, name)))


# Cases this driver skips beyond PyTorch's own skips (docs/pytorch.md lists them all).
# Of the cases reserved for Gloo (run above), those that test Gloo itself or need its setup:
_skip([name for name in dir(TestGossipccBackend) if name.startswith("test_monitored_barrier")],
      "torch's monitored_barrier() runs only on the gloo backend ('monitored_barrier is only implemented for "
      "GLOO backend') and these check Gloo's messages")
_skip([name for name in dir(TestGossipccBackend) if name.startswith("test_accumulate_gradients_no_sync")],
      "the case builds its model only when BACKEND is nccl or gloo (UnboundLocalError for any other name)")
if sys.version_info >= (3, 13):
    _skip(["test_gather_object", "test_gather_object_subgroup"],
          "the case expects pickle's message before Python 3.13 ('Can't pickle local object'); 3.13 says "
          "'Can't get local object' (any backend)")
_skip(["test_barrier_timeout_global"],
      "re-initialises the default group through env://, which only the suite's own gloo/nccl runs set up "
      "(MASTER_PORT); the group variants of the case run")
if _C.TORCH_HAS_BACKEND_CLASS:
    # torch 2.x names every plugin backend "custom" in DDP's logging data; the case expects
    # the registered name.
    _skip(["test_ddp_logging_data_cpu"], "torch 2.x reports plugin backends as 'custom' in DDP logging data")
try:
    import torch.distributed._shard.sharded_tensor  # noqa: F401
except ValueError:
    # torch 1.13 on Python >= 3.11 (Debian bookworm): importing torch.distributed._shard fails
    # ("mutable default ... for field tensor_properties"), whatever the backend.
    _skip(["test_DistributedDataParallelCPU", "test_DistributedDataParallelCPU_grad_is_view",
           "test_ddp_create_graph", "test_ddp_logging_data_cpu", "test_static_graph_api_cpu"],
          "torch 1.13 on Python 3.11: torch.distributed._shard does not import (a torch bug, any backend)")


def _parent_side_skip_reason(test):
    """The skip a test's torch decorators would take inside its spawned ranks, decided here.

    PyTorch's skip_if_lt_x_gpu / skip_if_no_gpu / skip_if_small_worldsize /
    skip_if_odd_worldsize decide in each spawned rank and exit with a skip code, so a case
    that can only skip still costs WORLD_SIZE fresh Python processes (~2 s here; about half
    the suite's time on a machine without GPUs). Same conditions, same messages, no processes.
    """
    import torch
    from torch.testing._internal import common_distributed as cd

    world_size = int(os.environ["WORLD_SIZE"])
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if getattr(cd, "TEST_HPU", False):
        return None  # HPU counts are decided in the ranks; leave those alone
    f = test
    while f is not None:
        code = getattr(f, "__code__", None)
        qualname = getattr(code, "co_qualname", "") if code else ""
        closure = dict(zip(code.co_freevars, (c.cell_contents for c in (f.__closure__ or ())))) if code else {}
        if qualname.startswith("skip_if_lt_x_gpu.") and gpus < closure.get("x", 0):
            return cd.TEST_SKIPS[f"multi-gpu-{closure['x']}"].message
        if qualname.startswith("skip_if_no_gpu."):
            if gpus == 0:
                return cd.TEST_SKIPS["no_cuda"].message
            if gpus < world_size:
                return cd.TEST_SKIPS[f"multi-gpu-{world_size}"].message
        if qualname.startswith("skip_if_small_worldsize.") and world_size <= 2:
            return cd.TEST_SKIPS["small_worldsize"].message
        if qualname.startswith("skip_if_odd_worldsize.") and world_size % 2 == 1:
            return cd.TEST_SKIPS["odd_worldsize"].message
        f = getattr(f, "__wrapped__", None)
    return None


for _name in dir(TestGossipccBackend):
    _test = getattr(TestGossipccBackend, _name)
    if _name.startswith("test") and callable(_test) and not getattr(_test, "__unittest_skip__", False):
        _reason = _parent_side_skip_reason(_test)
        if _reason:
            _skip([_name], _reason)


if __name__ == "__main__":
    run_tests()
