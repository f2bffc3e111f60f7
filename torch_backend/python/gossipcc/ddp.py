"""The allreduce policy: how DistributedDataParallel all-reduces its gradient buckets on a
gossipcc process group, for unmodified DDP code.

``configure(allreduce=...)`` before ``init_process_group``, else the ``GOSSIPCC_ALLREDUCE``
environment variable, else ``"exact"``. With "exact" nothing changes: DDP all-reduces its
buckets through the backend. With a "powersgd" policy, every DDP model built on a gossipcc
process group gets gossipcc's PowerSGD comm hook (hooks.powerSGD_hook, with a state made by
``PowerSGDState.from_policy``; ``model._gossipcc_policy_state``); DDP takes one comm hook, so
the user's own register_comm_hook on such a model raises a RuntimeError that names the policy,
where it was set, and how to use one's own hook (the policy "exact").

Registering one of torch's PowerSGD hooks (`powerSGD_hook`, `batched_powerSGD_hook`, also inside
`fp16_compress_wrapper` / `bf16_compress_wrapper`) on a DDP model of a gossipcc group turns on the
group's `order_nested_collectives`: those hooks issue all-reduces inside future callbacks, and with
several buckets the order of those and of the next buckets' all-reduces must be the same on every
rank (ProcessGroupGossipcc::set_order_nested_collectives).

The functions here are what _torch_patches' DDP patches call (ddp_init_calls,
ddp_register_comm_hook_calls); patch_for_policy / patch_for_group apply them.
"""
import warnings

import torch.distributed as dist

from . import _C
from . import _torch_patches
from . import backend as _backend
from .hooks import PowerSGDState, powerSGD_hook


def configure(allreduce=None, *, new_groups_only=False):
    """Sets the backend's options for process groups created after this call; call it before
    ``init_process_group``.

    allreduce: policy string, e.g. "exact" or "powersgd:rank=2,start_iter=10" (any case; None:
    back to GOSSIPCC_ALLREDUCE, else "exact"). Validated now; it takes precedence over the
    GOSSIPCC_ALLREDUCE environment variable. Every rank must configure the same policy: a group
    whose ranks differ fails its creation on every rank, naming each rank's policy.

    A group's policy is fixed when the group is created (DDP models read it when they are
    built), so while a gossipcc process group exists this raises RuntimeError: the call would
    change nothing for that group. ``new_groups_only=True`` says that is meant: the policy then
    applies to groups created afterwards (``dist.new_group(backend="gossipcc")``) and the
    existing ones keep theirs (``get_backend_object(group).allreduce_policy``).
    """
    _backend.set_configured_policy(allreduce, new_groups_only)
    patch_for_policy()


def _requested_policy():
    """(normal form, source) of the policy the user set, or None if it is "exact"."""
    text, source = _backend.policy_and_source()
    try:
        policy = _C.parse_allreduce_policy(text)
    except ValueError:  # an invalid policy: creating a gossipcc group reports it, naming the source
        return None
    return None if policy == "exact" else (policy, source)


def patch_for_policy():
    """Puts the policy onto DDP models (DDP.__init__ and register_comm_hook patched) once a
    policy other than "exact" is asked for; with "exact" DDP stays as torch has it."""
    if _requested_policy() is not None:
        _torch_patches.ddp_init_calls(after_ddp_init)
        _torch_patches.ddp_register_comm_hook_calls(before_register_comm_hook, after_register_comm_hook)


def patch_for_group(backend):
    """A gossipcc group was created: torch's PowerSGD hooks on its DDP models need their nested
    collectives ordered, and its policy, if not "exact", goes onto its DDP models."""
    _torch_patches.ddp_register_comm_hook_calls(before_register_comm_hook, after_register_comm_hook)
    if backend.allreduce_policy != "exact":
        _torch_patches.ddp_init_calls(after_ddp_init)


def _gossipcc_backend(process_group):
    """The gossipcc backend behind `process_group`; None if the group uses another backend."""
    try:
        return _backend.get_backend_object(process_group)
    except ValueError:  # the group uses another backend (get_backend_object says so)
        return None


_warned_policy_not_applied = []


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
            warnings.warn(
                f"gossipcc: the allreduce policy {requested[0]!r} (from {requested[1]}) is not applied to this "
                f"DistributedDataParallel model: its process group uses the {name!r} backend, and the policy "
                "applies to gossipcc process groups only; this model's gradients are averaged exactly by "
                f"{name!r}. Build DDP on a gossipcc group (init_process_group(backend=\"gossipcc\")) to get the "
                "policy (this warning is shown once per process)", UserWarning, stacklevel=4)
    return backend


def install_policy_hook(ddp_model, backend):
    """Registers the policy's PowerSGD hook on `ddp_model` (`model._gossipcc_policy_state`)."""
    options = _C.powersgd_policy_options(backend.allreduce_policy)
    state = PowerSGDState.from_policy(backend, ddp_model.module, options,
                                      process_group=getattr(ddp_model, "process_group", None))
    ddp_model.register_comm_hook(state, powerSGD_hook)
    ddp_model._gossipcc_policy_state = state
    return state


def after_ddp_init(ddp_model):
    backend = _policy_backend(ddp_model)
    if backend is None or backend.allreduce_policy == "exact":
        return
    install_policy_hook(ddp_model, backend)


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


def before_register_comm_hook(ddp_model, hook):
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


def after_register_comm_hook(ddp_model, state, hook):
    if _issues_collectives_in_callbacks(hook):
        # DDP's group, and the hook's own if its state names another one.
        for group in (getattr(ddp_model, "process_group", None), getattr(state, "process_group", None)):
            backend = _gossipcc_backend(group) if group is not None else None
            if backend is not None:
                backend.order_nested_collectives = True
