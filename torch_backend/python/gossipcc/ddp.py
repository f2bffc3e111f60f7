"""Applies the gossipcc allreduce policy to unmodified DistributedDataParallel models.

With policy "exact" nothing changes: DDP all-reduces its buckets through the backend. With a
"powersgd" policy, every DDP model built on a gossipcc process group gets a comm hook that
compresses its gradient buckets with gossipcc's native PowerSGD collective; DDP takes one comm
hook, so the user's own register_comm_hook on such a model raises a RuntimeError that names the
policy, where it was set, and how to use one's own hook (the policy "exact").

Registering one of torch's PowerSGD hooks (`powerSGD_hook`, `batched_powerSGD_hook`, also inside
`fp16_compress_wrapper` / `bf16_compress_wrapper`) on a DDP model of a gossipcc group turns on the
group's `order_nested_collectives`: those hooks issue all-reduces inside future callbacks, and with
several buckets the order of those and of the next buckets' all-reduces must be the same on every
rank (ProcessGroupGossipcc::set_order_nested_collectives).
"""
import functools

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

_original_init = DistributedDataParallel.__init__


def _gossipcc_backend(process_group):
    """The gossipcc backend behind `process_group`; None if the group uses another backend."""
    from . import get_backend_object
    try:
        return get_backend_object(process_group)
    except ValueError:  # the group uses another backend (get_backend_object says so)
        return None


_warned_policy_not_applied = []


def _requested_policy():
    """(normal form, source) of the policy the user set, or None if it is "exact"."""
    from . import _C, _policy_and_source
    text, source = _policy_and_source()
    try:
        policy = _C.parse_allreduce_policy(text)
    except ValueError:  # an invalid policy: creating a gossipcc group reports it, naming the source
        return None
    return None if policy == "exact" else (policy, source)


def _policy_backend(ddp_model):
    """The gossipcc backend whose allreduce policy applies to `ddp_model`, or None.

    A lookup that fails for another reason than "not a gossipcc group" is an error when a
    policy other than "exact" was asked for: the model would otherwise train with exact
    averaging without a word. A DDP model on another backend's group while such a policy is set
    gets a warning (once per process): the policy belongs to gossipcc groups only."""
    group = getattr(ddp_model, "process_group", None)
    try:
        backend = _gossipcc_backend(group)
    except Exception as e:  # noqa: BLE001 - re-raised, or ignored where no policy was asked for
        requested = _requested_policy()
        if requested is None:
            return None
        raise RuntimeError(
            f"gossipcc: the allreduce policy {requested[0]!r} (from {requested[1]}) cannot be applied to this "
            f"DistributedDataParallel model: looking up the gossipcc backend of its process group failed "
            f"({type(e).__name__}: {e}). Set the policy to 'exact' to train without it") from e
    if backend is None:
        requested = _requested_policy()
        if requested is not None and not _warned_policy_not_applied:
            _warned_policy_not_applied.append(True)
            try:
                name = dist.get_backend(group)
            except Exception:  # noqa: BLE001 - only for the message
                name = type(group).__name__
            import warnings
            warnings.warn(
                f"gossipcc: the allreduce policy {requested[0]!r} (from {requested[1]}) is not applied to this "
                f"DistributedDataParallel model: its process group uses the {name!r} backend, and the policy "
                "applies to gossipcc process groups only; this model's gradients are averaged exactly by "
                f"{name!r}. Build DDP on a gossipcc group (init_process_group(backend=\"gossipcc\")) to get the "
                "policy (this warning is shown once per process)", UserWarning, stacklevel=3)
    return backend


@functools.wraps(_original_init)
def _init_with_policy(self, *args, **kwargs):
    _original_init(self, *args, **kwargs)
    backend = _policy_backend(self)
    if backend is None or backend.allreduce_policy == "exact":
        return
    from . import powersgd
    powersgd.install_policy_hook(self, backend)


DistributedDataParallel.__init__ = _init_with_policy

_original_register_comm_hook = DistributedDataParallel.register_comm_hook


def _issues_collectives_in_callbacks(hook):
    """Whether `hook` is one of torch's PowerSGD hooks, possibly wrapped (functools.wraps,
    functools.partial, or a closure such as fp16_compress_wrapper's)."""
    try:
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps
    except ImportError:
        return False
    nesting = {ps.powerSGD_hook, ps.batched_powerSGD_hook}
    seen = set()

    def visit(f, depth):
        if any(f is n for n in nesting):
            return True
        if depth > 4 or id(f) in seen:
            return False
        seen.add(id(f))
        inner = [getattr(f, "__wrapped__", None), getattr(f, "func", None)]
        for cell in getattr(f, "__closure__", None) or ():
            try:
                inner.append(cell.cell_contents)
            except ValueError:  # an empty cell
                pass
        return any(callable(g) and visit(g, depth + 1) for g in inner if g is not None)

    return visit(hook, 0)


def _refuse_second_hook(ddp_model, hook):
    """DDP takes one comm hook; under a powersgd policy gossipcc has registered one already."""
    state = getattr(ddp_model, "_gossipcc_policy_state", None)
    if state is None:
        return
    backend = state.backend
    source = backend.allreduce_policy_source or "the process group's options"
    name = getattr(hook, "__qualname__", None) or repr(hook)
    raise RuntimeError(
        f"DistributedDataParallel.register_comm_hook({name}): this DDP model already has a comm hook, which "
        f"gossipcc registered when the model was built because the group's allreduce policy is "
        f"{backend.allreduce_policy!r} (from {source}); DDP takes one comm hook. To use your own hook, "
        "set the policy to 'exact' before init_process_group (GOSSIPCC_ALLREDUCE=exact, or "
        "gossipcc.configure(allreduce=\"exact\")); to keep gossipcc's PowerSGD, do not register a hook")


@functools.wraps(_original_register_comm_hook)
def _register_comm_hook(self, state, hook, *args, **kwargs):
    _refuse_second_hook(self, hook)
    result = _original_register_comm_hook(self, state, hook, *args, **kwargs)
    if _issues_collectives_in_callbacks(hook):
        # DDP's group, and the hook's own if its state names another one.
        for group in (getattr(self, "process_group", None), getattr(state, "process_group", None)):
            backend = _gossipcc_backend(group) if group is not None else None
            if backend is not None:
                backend.order_nested_collectives = True
    return result


DistributedDataParallel.register_comm_hook = _register_comm_hook
