"""Shared pieces of the wrapper tests: a small model, a learnable task, cross-rank helpers."""
import datetime

import torch
import torch.distributed as dist

from launcher import init_method

TEACHER = torch.randn(20, 4, generator=torch.Generator().manual_seed(7))


def make_model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def batch(rank, step):
    """Labels from a fixed linear teacher; each rank has its own data (cycles 8 batches)."""
    g = torch.Generator().manual_seed(1000 * (step % 8) + rank)
    x = torch.randn(32, 20, generator=g)
    return x, (x @ TEACHER).argmax(1)


def init(rank, world_size):
    import gossipcc  # noqa: F401  (registers the backend)
    dist.init_process_group("gossipcc", init_method=init_method(), rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=60))


def flat_params(module):
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()])


def gather(tensor):
    out = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(out, tensor.contiguous())
    return out


def gather_scalar(value):
    return [t.item() for t in gather(torch.tensor([float(value)], dtype=torch.float64))]


def loss_drop(losses, k=5):
    """mean of the last k losses / mean of the first k."""
    return (sum(losses[-k:]) / k) / (sum(losses[:k]) / k)
