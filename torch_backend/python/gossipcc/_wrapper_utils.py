"""Helpers shared by gossipcc's training wrappers (gossip.py, distlearn.py): process-group
lookup, flat copies of a model's tensors, and rank-0 broadcasts."""
import torch
import torch.distributed as dist

from .backend import get_backend_object


def resolve_group(process_group):
    """(group, backend object, rank in group, group size) for `process_group` (None: default)."""
    if not dist.is_initialized():
        raise RuntimeError("gossipcc wrappers: call torch.distributed.init_process_group(backend=\"gossipcc\") first")
    backend = get_backend_object(process_group)
    return process_group, backend, dist.get_rank(process_group), dist.get_world_size(process_group)


def global_rank(group, group_rank):
    """The global rank of `group_rank` in `group` (for dist.broadcast's src)."""
    if group is None or group is dist.GroupMember.WORLD:
        return group_rank
    if hasattr(dist, "get_global_rank"):  # torch >= 2.0
        return dist.get_global_rank(group, group_rank)
    return dist.distributed_c10d._get_global_rank(group, group_rank)


def refuse_ddp(module, who, usage):
    """ValueError if `module` is, or contains, a DistributedDataParallel: DDP all-reduces the
    gradients at every backward, which defeats a method whose point is to communicate less (or
    differently). `usage` shows the right call (e.g. "gossipcc.DiLoCo(model, inner, outer)").
    Local and deterministic: every rank that wraps DDP raises here, before any collective."""
    from torch.nn.parallel import DistributedDataParallel
    if not isinstance(module, torch.nn.Module):
        raise ValueError(f"{who}: the model must be a torch.nn.Module, got {type(module).__name__}")
    for name, sub in module.named_modules():
        if isinstance(sub, DistributedDataParallel):
            where = "the model is" if not name else f"the model's submodule {name!r} is"
            raise ValueError(f"{who}: {where} wrapped in DistributedDataParallel, which all-reduces every "
                             f"gradient at every backward and so defeats {who}'s own communication; pass the "
                             f"bare module instead ({usage}, with the module you gave DDP), and call "
                             "init_process_group as before")


def check_params(params, who):
    """Parameters gossiped as one buffer: at least one, one dtype, one device, floating point."""
    if not params:
        raise ValueError(f"{who}: the module has no parameters")
    dtypes = {p.dtype for p in params}
    devices = {p.device for p in params}
    if len(dtypes) != 1 or len(devices) != 1:
        raise ValueError(f"{who}: every parameter must have one dtype and one device "
                         f"(got dtypes {sorted(map(str, dtypes))}, devices {sorted(map(str, devices))})")
    if not params[0].is_floating_point():
        raise ValueError(f"{who}: parameters must be floating point, got {params[0].dtype}")


def flatten(tensors):
    """A new contiguous 1-D copy of `tensors`, concatenated."""
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def unflatten_into(flat, tensors):
    """Copies consecutive slices of `flat` into `tensors` (in place, no autograd)."""
    offset = 0
    with torch.no_grad():
        for t in tensors:
            n = t.numel()
            t.copy_(flat[offset:offset + n].view_as(t))
            offset += n


def broadcast_from_first(group, tensors):
    """Every rank's `tensors` <- those of the group's rank 0 (one flat broadcast per dtype/device)."""
    src = global_rank(group, 0)
    by_kind = {}
    for t in tensors:
        by_kind.setdefault((t.dtype, t.device), []).append(t)
    for same in by_kind.values():
        flat = flatten(same)
        dist.broadcast(flat, src=src, group=group)
        unflatten_into(flat, same)


def average_buffers(group, world_size, buffers):
    """Floating-point buffers (e.g. BatchNorm running statistics) <- their exact average over
    the group; other buffers (e.g. num_batches_tracked) <- rank 0's. Every rank ends bitwise equal."""
    floating = [b for b in buffers if b.is_floating_point()]
    by_kind = {}
    for b in floating:
        by_kind.setdefault((b.dtype, b.device), []).append(b)
    for same in by_kind.values():
        flat = flatten(same)
        dist.all_reduce(flat, group=group)
        flat.div_(world_size)
        unflatten_into(flat, same)
    # Broadcast everything afterwards: all-reduce results need not be bitwise equal across ranks.
    if buffers:
        broadcast_from_first(group, list(buffers))
