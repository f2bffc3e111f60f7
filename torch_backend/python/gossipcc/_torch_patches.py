"""Every change gossipcc makes to torch, in one module; nothing else in the package patches torch.

Each patch is one function below: what it replaces, why (two lines), the torch versions it
applies to, and when it is applied. A patch wraps attributes (default_use_libuv_off sets an
environment variable instead); a wrapper carries the function it wraps as ``_gossipcc_original``
(``is_patched`` tells), and applying a patch twice changes nothing.

  patch                         replaces                                       torch / applied
  time_init_process_group       dist.init_process_group                        1.13, 2.x / at import
  default_use_libuv_off         the USE_LIBUV variable (default 0)             2.x without libuv / at import
  tcpstores_pass_use_libuv      TCPStore of 3 rendezvous modules, the dynamic  2.x with USE_LIBUV=0 / at import
                                rendezvous' store server
  shut_down_on_destroy          dist.destroy_process_group (+ atexit)          1.13, 2.x / first gossipcc group
  ddp_register_comm_hook_calls  DistributedDataParallel.register_comm_hook     1.13, 2.x / first gossipcc group,
                                                                               or a policy is asked for
  ddp_init_calls                DistributedDataParallel.__init__               1.13, 2.x / a policy other than
                                                                               "exact" is asked for
  torchrun_std_from_str         torch.distributed.elastic's Std.from_str       1.13 on Python >= 3.11 /
                                                                               python -m gossipcc.torchrun

The patches take what gossipcc does at those points as arguments (callbacks), so this module
depends on torch only.
"""
import atexit
import functools
import importlib
import os
import re
import time

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d


def torch_major():
    return int(torch.__version__.split(".")[0])


def is_patched(owner, attr):
    """Whether owner.attr is a gossipcc wrapper (of this module)."""
    return getattr(getattr(owner, attr, None), "_gossipcc_original", None) is not None


def _replace(owner, attr, make):
    """owner.attr <- make(original), unless a gossipcc wrapper is there already; the wrapper."""
    current = getattr(owner, attr)
    if getattr(current, "_gossipcc_original", None) is not None:
        return current
    wrapper = make(current)
    wrapper._gossipcc_original = current
    setattr(owner, attr, wrapper)
    return wrapper


# ---- at import ---------------------------------------------------------------------------
_init_started = {}


def init_started_at():
    """time.monotonic() at the start of the init_process_group call now running, else None."""
    return _init_started.get("at")


def time_init_process_group():
    """Why: torch hands a backend's creator the whole init timeout, part of which its store may
    have spent; the rendezvous must get what is left (init_started_at). Torch 1.13, 2.x."""
    def make(original):
        @functools.wraps(original)
        def init_process_group(*args, **kwargs):
            _init_started["at"] = time.monotonic()
            try:
                return original(*args, **kwargs)
            finally:
                _init_started.pop("at", None)
        return init_process_group

    dist.init_process_group = _replace(distributed_c10d, "init_process_group", make)


def torch_lacks_libuv():
    """True for a torch 2.x built without libuv (Debian's), whose TCPStore refuses use_libuv."""
    if torch_major() < 2:
        return False
    try:
        from torch._C._distributed_c10d import TCPStore
        TCPStore("127.0.0.1", 0, 1, True, use_libuv=True, wait_for_workers=False)
    except RuntimeError as e:
        return "libuv" in str(e)
    except Exception:  # noqa: BLE001 - a probe only; torch decides later
        pass
    return False


def default_use_libuv_off():
    """Why: Debian's torch 2.x lacks libuv, yet its TCPStore asks for it unless USE_LIBUV=0, so
    every rendezvous fails; sets USE_LIBUV=0 where unset. Torch 2.x built without libuv only."""
    if "USE_LIBUV" not in os.environ and torch_lacks_libuv():
        os.environ["USE_LIBUV"] = "0"


_RENDEZVOUS_MODULES = ("torch.distributed.rendezvous", "torch.distributed.elastic.rendezvous.static_tcp_rendezvous",
                       "torch.distributed.elastic.rendezvous.c10d_rendezvous_backend")


def _use_libuv():
    return os.environ.get("USE_LIBUV", "1") == "1"


def tcpstores_pass_use_libuv():
    """Why: some of torch's own TCPStore constructions (torchrun's static rendezvous, workers
    joining the agent's store, the dynamic rendezvous' host) ignore USE_LIBUV; they pass it on.
    Torch 2.x with USE_LIBUV=0 (1.x's TCPStore has no use_libuv argument and never uses libuv)."""
    for name in _RENDEZVOUS_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if getattr(module, "TCPStore", None) is None:
            continue

        def make(original):
            def make_store(*args, **kwargs):
                kwargs.setdefault("use_libuv", _use_libuv())
                return original(*args, **kwargs)
            return make_store

        _replace(module, "TCPStore", make)
    try:
        from torch.distributed.elastic.rendezvous import dynamic_rendezvous
    except ImportError:
        return
    handler = getattr(dynamic_rendezvous, "DynamicRendezvousHandler", None)
    if getattr(handler, "_create_tcp_store_server", None) is None:
        return

    def make_server(original):
        def create_tcp_store_server(self, master_addr, master_port):
            return dist.TCPStore(host_name=master_addr, port=master_port, is_master=True, multi_tenant=True,
                                 use_libuv=_use_libuv())
        return create_tcp_store_server

    _replace(handler, "_create_tcp_store_server", make_server)


def apply_at_import():
    """The patches `import gossipcc` applies: each where its torch needs it."""
    time_init_process_group()
    default_use_libuv_off()
    if os.environ.get("USE_LIBUV") == "0" and torch_major() >= 2:
        tcpstores_pass_use_libuv()


# ---- once a gossipcc process group exists --------------------------------------------------
def shut_down_on_destroy(shutdown_group, shutdown_all):
    """Why: torch shuts down only NCCL groups at destroy; a gossipcc group that outlives it (DDP
    holds it) would run callbacks into interpreter finalisation, where a thread taking the GIL
    is killed mid-C++. destroy_process_group(group) calls shutdown_group(group) first, and
    interpreter exit calls shutdown_all(). Torch 1.13, 2.x."""
    def make(original):
        def destroy_process_group(group=None):
            shutdown_group(group)
            return original(group)
        destroy_process_group.__doc__ = original.__doc__
        return destroy_process_group

    if not is_patched(distributed_c10d, "destroy_process_group"):
        atexit.register(shutdown_all)
    dist.destroy_process_group = _replace(distributed_c10d, "destroy_process_group", make)


def ddp_register_comm_hook_calls(before, after):
    """Why: torch's PowerSGD hooks issue collectives inside future callbacks, whose order gossipcc
    must fix (after(model, state, hook)), and DDP takes one hook, which the allreduce policy may
    have taken (before(model, hook) refuses). Torch 1.13, 2.x."""
    from torch.nn.parallel import DistributedDataParallel

    def make(original):
        @functools.wraps(original)
        def register_comm_hook(self, state, hook, *args, **kwargs):
            before(self, hook)
            result = original(self, state, hook, *args, **kwargs)
            after(self, state, hook)
            return result
        return register_comm_hook

    _replace(DistributedDataParallel, "register_comm_hook", make)


def ddp_init_calls(after_init):
    """Why: the allreduce policy reaches unmodified DDP code through the comm hook it registers on
    every DDP model of a gossipcc group (after_init(model), once DDP is built). Torch 1.13, 2.x."""
    from torch.nn.parallel import DistributedDataParallel

    def make(original):
        @functools.wraps(original)
        def __init__(self, *args, **kwargs):
            original(self, *args, **kwargs)
            after_init(self)
        return __init__

    _replace(DistributedDataParallel, "__init__", make)


# ---- python -m gossipcc.torchrun ---------------------------------------------------------------
def std_from_str_is_broken():
    """torch 1.13's Std on Python >= 3.11: iterating the IntFlag no longer yields NONE (0)."""
    from torch.distributed.elastic.multiprocessing import api
    return not any(s == 0 for s in api.Std)


def torchrun_std_from_str():
    """Why: torch 1.13's launcher fails on Python >= 3.11 before starting a worker ("'NoneType'
    object has no attribute 'get'"): Std.from_str looks flags up by iterating the IntFlag; it
    parses them by value instead. Torch 1.13 on Python >= 3.11 (std_from_str_is_broken)."""
    from torch.distributed.elastic.multiprocessing import api
    if is_patched(api.Std, "from_str"):
        return

    def from_str(cls, vm):
        if re.fullmatch(r"[0-3]", vm):
            return cls(int(vm))
        if re.fullmatch(r"(\d+:[0-3],)*\d+:[0-3]", vm):
            return {int(k): cls(int(v)) for k, v in (item.split(":") for item in vm.split(","))}
        raise ValueError(f"{vm} does not match: <0|1|2|3> or <local_rank:<0|1|2|3>,...>")

    from_str._gossipcc_original = api.Std.from_str
    api.Std.from_str = classmethod(from_str)
