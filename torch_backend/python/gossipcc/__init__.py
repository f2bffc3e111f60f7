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
(all-reduce SGD with uneven step counts).
"""
import datetime
import functools
import os
import time

import torch
import torch.distributed as dist

from ._torch_check import check_torch as _check_torch
from .version import __version__

_check_torch(torch)  # before _C: ImportError naming both versions if torch is not the one built for
from . import _C  # noqa: E402
from ._C import (AbortedError, CommError, InvalidArgumentError, MismatchError, PeerError,
                 ProcessGroupGossipcc, TimeoutError)

BACKEND_NAME = "gossipcc"
ENV_ALLREDUCE = "GOSSIPCC_ALLREDUCE"

_configured = {"allreduce": None}
CONFIGURE_SOURCE = "gossipcc.configure(allreduce=...)"


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


def _policy_and_source():
    """(policy text, where it comes from) for a group created now."""
    if _configured["allreduce"] is not None:
        return _configured["allreduce"], CONFIGURE_SOURCE
    return os.environ.get(ENV_ALLREDUCE) or "exact", ENV_ALLREDUCE


def allreduce_policy():
    """The policy a process group created now would get (normal form). An existing group's:
    ``get_backend_object(group).allreduce_policy``."""
    return _C.parse_allreduce_policy(_policy_and_source()[0])


# Every gossipcc backend created and not yet shut down, by id. destroy_process_group and
# interpreter exit shut them down (see _shutdown_on_destroy).
_live_backends = {}


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
    import warnings
    warnings.warn(
        f"gossipcc: {name}={os.environ[name]!r} names {len(names)} interfaces; gossipcc listens on the first "
        f"only ({names[0]!r}) and does not use {', '.join(map(repr, names[1:]))} (ProcessGroupGloo spreads its "
        f"connections over every interface of the list; gossipcc's connections share one listening device). "
        f"Set {name}={names[0]} to silence this warning (shown once per process)", UserWarning, stacklevel=2)


def _create_backend(store, rank, size, timeout):
    # Called by torch.distributed.init_process_group / new_group. The rendezvous gets what is
    # left of init_process_group's timeout: torch's store may have used some (its TCPStore
    # waits for every worker first), and every rank must fail init within the timeout.
    rendezvous_timeout = None
    started = _init_started.get("at")
    if started is not None:
        rendezvous_timeout = max(timeout - datetime.timedelta(seconds=time.monotonic() - started),
                                 datetime.timedelta(seconds=1))
    _warn_unused_interfaces()
    policy, source = _policy_and_source()
    backend = ProcessGroupGossipcc(store, rank, size, timeout, policy, rendezvous_timeout, source)
    _live_backends[id(backend)] = backend
    return backend


def _shutdown_backends(backends):
    for backend in backends:
        _live_backends.pop(id(backend), None)
        backend.shutdown()  # releases the GIL; runs the last completion callbacks, joins our threads


_init_started = {}


def _time_init_process_group():
    """Wraps init_process_group to note when it started (see _create_backend)."""
    from torch.distributed import distributed_c10d
    original = distributed_c10d.init_process_group
    if getattr(original, "_gossipcc_wrapped", False):
        return

    @functools.wraps(original)
    def init_process_group(*args, **kwargs):
        _init_started["at"] = time.monotonic()
        try:
            return original(*args, **kwargs)
        finally:
            _init_started.pop("at", None)

    init_process_group._gossipcc_wrapped = True
    distributed_c10d.init_process_group = init_process_group
    dist.init_process_group = init_process_group


def _shutdown_on_destroy():
    """destroy_process_group shuts the destroyed gossipcc groups down before torch forgets them,
    and interpreter exit shuts down whatever is left.

    A process group often outlives destroy_process_group (DDP holds it) and so would keep its
    threads, which complete operations and run their future callbacks, into interpreter
    finalisation, where a thread that takes the GIL is killed mid-C++ (std::terminate). After
    shutdown every pending operation has failed with a clear error, its callbacks have run and
    every gossipcc thread has been joined: once destroy_process_group returns, no thread of
    ours touches Python. Later calls on the group fail naming the shutdown (as ProcessGroupNCCL
    after destroy)."""
    import atexit
    from torch.distributed import distributed_c10d
    original = distributed_c10d.destroy_process_group
    if getattr(original, "_gossipcc_wrapped", False):
        return

    def destroy_process_group(group=None):
        if group is None or group is distributed_c10d.GroupMember.WORLD:
            targets = list(_live_backends.values())  # the default group takes every group with it
        else:
            try:
                targets = [get_backend_object(group)]
            except (ValueError, RuntimeError, AttributeError):
                targets = []
        _shutdown_backends(targets)
        return original(group)

    destroy_process_group.__doc__ = original.__doc__
    destroy_process_group._gossipcc_wrapped = True
    distributed_c10d.destroy_process_group = destroy_process_group
    dist.destroy_process_group = destroy_process_group
    atexit.register(lambda: _shutdown_backends(list(_live_backends.values())))


def _torch_lacks_libuv():
    """True for a torch 2.x built without libuv (Debian's), whose TCPStore refuses use_libuv."""
    if int(torch.__version__.split(".")[0]) < 2:
        return False
    try:
        from torch._C._distributed_c10d import TCPStore
        TCPStore("127.0.0.1", 0, 1, True, use_libuv=True, wait_for_workers=False)
    except RuntimeError as e:
        return "libuv" in str(e)
    except Exception:  # noqa: BLE001 - a probe only; torch decides later
        pass
    return False


def _default_tcpstore_without_libuv():
    """Debian's torch 2.x is built without libuv, yet its TCPStore (env://, tcp://, torchrun)
    asks for libuv unless USE_LIBUV=0: every rendezvous would fail with "use_libuv was
    requested but PyTorch was build without libuv support". Default USE_LIBUV to 0 there."""
    if "USE_LIBUV" not in os.environ and _torch_lacks_libuv():
        os.environ["USE_LIBUV"] = "0"
    # torch 1.x's TCPStore has no use_libuv argument (and never used libuv).
    if os.environ.get("USE_LIBUV") == "0" and int(torch.__version__.split(".")[0]) >= 2:
        _tcpstores_respect_use_libuv()


def _tcpstores_respect_use_libuv():
    # Some of torch 2.x's own TCPStore constructions (torchrun's static rendezvous, workers
    # joining the agent's store) omit use_libuv and so get the C++ default (libuv): pass the
    # environment's choice through where they look the class up.
    import importlib
    for name in ("torch.distributed.rendezvous", "torch.distributed.elastic.rendezvous.static_tcp_rendezvous",
                 "torch.distributed.elastic.rendezvous.c10d_rendezvous_backend"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        original = getattr(module, "TCPStore", None)
        if original is None or getattr(original, "_gossipcc_wrapped", False):
            continue

        def make_store(*args, _original=original, **kwargs):
            kwargs.setdefault("use_libuv", os.environ.get("USE_LIBUV", "1") == "1")
            return _original(*args, **kwargs)

        make_store._gossipcc_wrapped = True
        module.TCPStore = make_store
    # The dynamic (c10d) rendezvous hosts the agent's store through dist.TCPStore directly.
    try:
        from torch.distributed.elastic.rendezvous import dynamic_rendezvous
    except ImportError:
        return
    handler = getattr(dynamic_rendezvous, "DynamicRendezvousHandler", None)
    original = getattr(handler, "_create_tcp_store_server", None)
    if original is not None and not getattr(original, "_gossipcc_wrapped", False):
        def create_tcp_store_server(self, master_addr, master_port):
            return dist.TCPStore(host_name=master_addr, port=master_port, is_master=True, multi_tenant=True,
                                 use_libuv=os.environ.get("USE_LIBUV", "1") == "1")

        create_tcp_store_server._gossipcc_wrapped = True
        handler._create_tcp_store_server = create_tcp_store_server


def _register():
    if BACKEND_NAME.upper() in dist.Backend.__dict__ or BACKEND_NAME in getattr(dist.Backend, "backend_list", []):
        return  # already registered (register_backend raises on a second call)
    if _C.TORCH_HAS_BACKEND_CLASS:
        dist.Backend.register_backend(BACKEND_NAME, _create_backend, devices=["cpu", "cuda"])
    else:
        dist.Backend.register_backend(BACKEND_NAME, _create_backend)


_default_tcpstore_without_libuv()
_register()
_time_init_process_group()
_shutdown_on_destroy()

from . import ddp as _ddp  # noqa: E402  (installs the DDP allreduce-policy hook)


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


from .gossip import BilatGossipDataParallel, GossipDataParallel, PeerLostWarning  # noqa: E402
from .distlearn import AllReduceEA, AllReduceSGD  # noqa: E402
from .diloco import DiLoCo  # noqa: E402

__all__ = [
    "GossipDataParallel", "BilatGossipDataParallel", "AllReduceEA", "AllReduceSGD", "PeerLostWarning", "DiLoCo",
    "BACKEND_NAME", "ENV_ALLREDUCE", "configure", "allreduce_policy", "get_backend_object",
    "ProcessGroupGossipcc", "CommError", "InvalidArgumentError", "MismatchError", "TimeoutError",
    "PeerError", "AbortedError",
]
