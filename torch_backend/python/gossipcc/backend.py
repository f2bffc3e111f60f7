"""The gossipcc process groups of this process: creating one (with the allreduce policy it
gets), finding the one behind a torch group, and shutting them down.

The allreduce policy of a group created now: the one set by ``gossipcc.configure`` (ddp.py),
else the ``GOSSIPCC_ALLREDUCE`` environment variable, else ``"exact"``.
"""
import datetime
import os
import time
import warnings

import torch
import torch.distributed as dist

from . import _C
from ._C import ProcessGroupGossipcc

BACKEND_NAME = "gossipcc"
ENV_ALLREDUCE = "GOSSIPCC_ALLREDUCE"
CONFIGURE_SOURCE = "gossipcc.configure(allreduce=...)"

_configured = {"allreduce": None}

# Every gossipcc backend created and not yet shut down, by id.
_live_backends = {}


def set_configured_policy(allreduce, new_groups_only):
    """The body of gossipcc.configure (ddp.py): validates the policy and keeps it for groups
    created from now on; RuntimeError while a group exists, unless new_groups_only."""
    if allreduce is not None:
        _C.parse_allreduce_policy(allreduce)
    if _live_backends and not new_groups_only:
        policies = sorted({b.allreduce_policy for b in _live_backends.values()})
        raise RuntimeError(
            f"gossipcc.configure(allreduce={allreduce!r}) after init_process_group: a gossipcc process group "
            f"exists already and keeps the policy it was created with ({', '.join(map(repr, policies))}), so "
            "this call would change nothing for it. Call gossipcc.configure() before "
            "dist.init_process_group(), or pass new_groups_only=True to set the policy of groups created "
            "afterwards (dist.new_group(backend=\"gossipcc\"))")
    _configured["allreduce"] = allreduce


def policy_and_source():
    """(policy text, where it comes from) for a group created now."""
    if _configured["allreduce"] is not None:
        return _configured["allreduce"], CONFIGURE_SOURCE
    return os.environ.get(ENV_ALLREDUCE) or "exact", ENV_ALLREDUCE


def allreduce_policy():
    """The policy a process group created now would get (normal form). An existing group's:
    ``get_backend_object(group).allreduce_policy``."""
    return _C.parse_allreduce_policy(policy_and_source()[0])


_warned_interfaces = []


def _warn_unused_interfaces():
    """gossipcc listens on the first interface of GOSSIPCC_SOCKET_IFNAME / GLOO_SOCKET_IFNAME
    (its meshes share one listening device; ProcessGroupGloo spreads its pairs over all of
    them): a list of several warns once per process, naming the interfaces not used."""
    name = "GOSSIPCC_SOCKET_IFNAME" if os.environ.get("GOSSIPCC_SOCKET_IFNAME") else "GLOO_SOCKET_IFNAME"
    names = [n for n in os.environ.get(name, "").split(",") if n]
    if len(names) < 2 or _warned_interfaces:
        return
    _warned_interfaces.append(name)
    warnings.warn(
        f"gossipcc: {name}={os.environ[name]!r} names {len(names)} interfaces; gossipcc listens on the first "
        f"only ({names[0]!r}) and does not use {', '.join(map(repr, names[1:]))} (ProcessGroupGloo spreads its "
        f"connections over every interface of the list; gossipcc's connections share one listening device). "
        f"Set {name}={names[0]} to silence this warning (shown once per process)", UserWarning, stacklevel=2)


def create(store, rank, size, timeout, started_at):
    """A new ProcessGroupGossipcc. started_at: time.monotonic() when init_process_group started
    (None: not inside one); the rendezvous then gets what is left of `timeout`, so that every
    rank fails init within it."""
    rendezvous_timeout = None
    if started_at is not None:
        rendezvous_timeout = max(timeout - datetime.timedelta(seconds=time.monotonic() - started_at),
                                 datetime.timedelta(seconds=1))
    _warn_unused_interfaces()
    policy, source = policy_and_source()
    backend = ProcessGroupGossipcc(store, rank, size, timeout, policy, rendezvous_timeout, source)
    _live_backends[id(backend)] = backend
    _check_local_world_size(backend, rank, size)
    return backend


def _check_local_world_size(backend, rank, size):
    """torchrun's LOCAL_WORLD_SIZE against the ranks the backend found on this host (whole-world
    groups only): a mismatch warns, since the two-level all-reduce groups ranks by the hosts
    found (GOSSIPCC_TOPOLOGY)."""
    local = os.environ.get("LOCAL_WORLD_SIZE")
    world = os.environ.get("WORLD_SIZE")
    if not local or not local.isdigit() or world != str(size):
        return
    topology = backend.topology()
    here = next(h for h in topology["hosts"] if rank in h)
    if len(here) != int(local):
        warnings.warn(
            f"gossipcc: LOCAL_WORLD_SIZE={local} but rank {rank} found {len(here)} rank(s) on its host "
            f"({topology['description']}); the hierarchical all-reduce (GOSSIPCC_TOPOLOGY) follows the hosts "
            f"found (ranks in one network namespace of one machine share a host)", UserWarning, stacklevel=3)


def get_backend_object(group=None):
    """The ProcessGroupGossipcc behind `group` (default: the default group)."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    if isinstance(pg, ProcessGroupGossipcc):
        return pg
    if hasattr(pg, "_get_backend"):  # torch 2.x: a ProcessGroup dispatching to backends
        # gossipcc may serve one device type only ("cuda:gossipcc,cpu:gloo"): either counts.
        for device in ("cpu", "cuda"):
            try:
                backend = pg._get_backend(torch.device(device))
            except RuntimeError:  # no backend for this device type in the group
                continue
            if isinstance(backend, ProcessGroupGossipcc):
                return backend
    raise ValueError("gossipcc: the process group does not use the gossipcc backend")


def _shutdown(backends):
    for backend in backends:
        _live_backends.pop(id(backend), None)
        backend.shutdown()  # releases the GIL; runs the last completion callbacks, joins our threads


def shutdown_group(group=None):
    """Shuts down the gossipcc backends that destroy_process_group(group) destroys: every one
    for the default group (it takes every group with it), else the group's own, if gossipcc.
    Afterwards every pending operation has failed, its callbacks have run and every gossipcc
    thread of those groups has been joined; later calls fail naming the shutdown."""
    if group is None or group is dist.distributed_c10d.GroupMember.WORLD:
        targets = list(_live_backends.values())
    else:
        try:
            targets = [get_backend_object(group)]
        except (ValueError, RuntimeError, AttributeError):
            targets = []
    _shutdown(targets)


def shutdown_all():
    """Shuts down every gossipcc backend still alive (interpreter exit)."""
    _shutdown(list(_live_backends.values()))
