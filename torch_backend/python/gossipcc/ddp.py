"""Applies the gossipcc allreduce policy to unmodified DistributedDataParallel models.

With policy "exact" nothing changes: DDP all-reduces its buckets through the backend. With a
"powersgd" policy, every DDP model built on a gossipcc process group gets a comm hook that
compresses its gradient buckets with gossipcc's native PowerSGD collective.
"""
import functools

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

_original_init = DistributedDataParallel.__init__


def _gossipcc_backend(process_group):
    from . import get_backend_object
    try:
        return get_backend_object(process_group)
    except (ValueError, RuntimeError, AttributeError):
        return None


@functools.wraps(_original_init)
def _init_with_policy(self, *args, **kwargs):
    _original_init(self, *args, **kwargs)
    backend = _gossipcc_backend(getattr(self, "process_group", None))
    if backend is None or backend.allreduce_policy == "exact":
        return
    from . import powersgd
    powersgd.install_policy_hook(self, backend)


DistributedDataParallel.__init__ = _init_with_policy
