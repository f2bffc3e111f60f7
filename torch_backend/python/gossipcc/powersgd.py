"""Deprecated names of the allreduce policy's PowerSGD hook, kept for one release: the policy
now uses gossipcc.hooks' one PowerSGD hook and state.

    PolicyHookState(backend, module, options)  ->  gossipcc.hooks.PowerSGDState.from_policy(...)
    policy_hook                                ->  gossipcc.hooks.powerSGD_hook
    install_policy_hook                        ->  gossipcc.ddp.install_policy_hook
"""
import warnings

from . import ddp as _ddp
from . import hooks as _hooks


def _deprecated(old, new):
    warnings.warn(f"gossipcc.powersgd.{old} is deprecated; use {new}", DeprecationWarning, stacklevel=3)


def PolicyHookState(backend, module, options):  # noqa: N802 - the old class name
    """Deprecated: gossipcc.hooks.PowerSGDState.from_policy(backend, module, options)."""
    _deprecated("PolicyHookState", "gossipcc.hooks.PowerSGDState.from_policy")
    return _hooks.PowerSGDState.from_policy(backend, module, options)


def policy_hook(state, bucket):
    """Deprecated: gossipcc.hooks.powerSGD_hook."""
    _deprecated("policy_hook", "gossipcc.hooks.powerSGD_hook")
    return _hooks.powerSGD_hook(state, bucket)


def install_policy_hook(ddp_model, backend):
    """Deprecated: gossipcc.ddp.install_policy_hook."""
    _deprecated("install_policy_hook", "gossipcc.ddp.install_policy_hook")
    return _ddp.install_policy_hook(ddp_model, backend)
