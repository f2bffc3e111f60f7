"""gossipcc: gossip and compressed collectives as a torch.distributed backend.

``import gossipcc`` registers the backend once under the name ``"gossipcc"``::

    import gossipcc, torch.distributed as dist
    dist.init_process_group(backend="gossipcc", init_method="env://")

CPU tensors travel over Gloo, CUDA tensors over NCCL. How DistributedDataParallel all-reduces
its gradient buckets is the *allreduce policy*: ``configure(allreduce=...)`` before
``init_process_group``, else the ``GOSSIPCC_ALLREDUCE`` environment variable, else ``"exact"``.
Every rank must use the same policy (``init_process_group`` fails on every rank otherwise).
See docs/pytorch.md.

Training wrappers (docs/algorithms.md): ``GossipDataParallel`` (SGP, OSGP, D-PSGD),
``BilatGossipDataParallel`` (AD-PSGD), ``AllReduceEA`` (elastic averaging) and ``AllReduceSGD``
(all-reduce SGD with uneven step counts); ``DiLoCo`` (docs/diloco.md).

This file registers the backend (_install.py) and re-exports; the modules and what each holds:
docs/pytorch.md, "The package". What gossipcc changes in torch, and when: _torch_patches.py.
"""
import warnings as _warnings

import torch as _torch

from ._torch_check import check_torch as _check_torch
from .version import __version__

_check_torch(_torch)  # before _C: ImportError naming both versions if torch is not the one built for
from ._install import install as _install  # noqa: E402  (loads _C)

_install()

from ._C import ProcessGroupGossipcc  # noqa: E402
from .backend import BACKEND_NAME, ENV_ALLREDUCE, allreduce_policy, get_backend_object  # noqa: E402
from .bilat import BilatGossipDataParallel  # noqa: E402
from .ddp import configure  # noqa: E402
from .diloco import DiLoCo  # noqa: E402
from .distlearn import AllReduceEA, AllReduceSGD  # noqa: E402
from .errors import (DEPRECATED_ALIASES as _DEPRECATED_ALIASES, AbortedError, CommError,  # noqa: E402
                     CommTimeoutError, InvalidArgumentError, MismatchError, PeerError)
from .gossip import GossipDataParallel, PeerLostWarning  # noqa: E402

__all__ = [
    "GossipDataParallel", "BilatGossipDataParallel", "AllReduceEA", "AllReduceSGD", "PeerLostWarning", "DiLoCo",
    "BACKEND_NAME", "ENV_ALLREDUCE", "configure", "allreduce_policy", "get_backend_object",
    "ProcessGroupGossipcc", "CommError", "InvalidArgumentError", "MismatchError", "CommTimeoutError",
    "PeerError", "AbortedError",
]


def __getattr__(name):
    """Deprecated names (errors.DEPRECATED_ALIASES), with a DeprecationWarning naming the new one."""
    if name in _DEPRECATED_ALIASES:
        new, value = _DEPRECATED_ALIASES[name]
        _warnings.warn(f"gossipcc.{name} is deprecated (it shadows the builtin of that name); use gossipcc.{new}",
                       DeprecationWarning, stacklevel=2)
        return value
    raise AttributeError(f"module 'gossipcc' has no attribute {name!r}")
