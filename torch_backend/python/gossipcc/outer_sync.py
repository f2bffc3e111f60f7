"""DiLoCo's outer transports: how a fragment's outer gradient delta travels (``outer_sync``).

One class per transport, chosen once when DiLoCo is constructed (``parse``); diloco.py calls
the same four methods whatever it is:
  attach(...)            once, after every rank agreed on the arguments
  launch(f, delta, k)    starts averaging fragment f's delta (k: that fragment's outer step),
                         asynchronously; returns (Work or None, finish), finish() -> the average
  final_average(flat)    in sync(): makes every rank's theta_global one (gossip only)
  state() / check_state(state) / load_state(state)   its part of DiLoCo's checkpoint

| outer_sync          | class         | collective                                         |
|---------------------|---------------|----------------------------------------------------|
| "exact"             | ExactSync     | dist.all_reduce (any backend), / group size        |
| "powersgd:rank=r"   | PowerSGDSync  | ProcessGroupGossipcc.powersgd_allreduce            |
| "quantized:bits=b"  | QuantizedSync | ProcessGroupGossipcc.quantized_allreduce, residuals |
| "gossip"            | GossipSync    | ProcessGroupGossipcc.push_sum_round, one peer      |
"""
import torch
import torch.distributed as dist

from . import _C


class OuterSync:
    """The part every transport shares: where it sends (attach) and an empty checkpoint part."""

    name = None
    needs_gossipcc = True  # runs a gossipcc collective: the group must be a gossipcc one
    powersgd = None        # PowerSGDSync: the native PowerSGD state
    residuals = None       # QuantizedSync: per fragment (this rank's residual, its owned blocks')

    def check_params(self, params, text):
        """ValueError if the model's parameters cannot travel this way."""

    def attach(self, group, world_size, backend, params, fragment_params, global_sizes):
        self.group, self.world_size, self.backend = group, world_size, backend
        self.params, self.fragment_params = params, fragment_params

    def final_average(self, flat):
        """Every transport but gossip leaves every rank with the same theta_global already."""

    def state(self):
        return {"powersgd": None, "quantized_residuals": None}

    def check_state(self, state):
        """ValueError if `state` (a DiLoCo checkpoint) does not fit; nothing is changed."""

    def load_state(self, state):
        pass


class ExactSync(OuterSync):
    name = "exact"
    needs_gossipcc = False

    def launch(self, f, delta, k):
        work = dist.all_reduce(delta, group=self.group, async_op=True)
        return work, lambda: delta.div_(self.world_size)


class PowerSGDSync(OuterSync):
    """Each parameter of the fragment compressed with its own shape, keyed "param<i>"."""

    def __init__(self, options, name):
        self.options, self.name = options, name

    def attach(self, *args):
        super().attach(*args)
        self.powersgd = _C.PowerSGD(self.options)

    def launch(self, f, delta, k):
        idx = self.fragment_params[f]
        views, offset = [], 0
        for i in idx:
            n = self.params[i].numel()
            views.append(delta[offset:offset + n])
            offset += n
        shapes = [list(self.params[i].shape) for i in idx]
        work = self.backend.powersgd_allreduce(views, shapes, self.powersgd, [f"param{i}" for i in idx])
        return work, lambda: delta

    def state(self):
        return dict(super().state(), powersgd=self.powersgd.state_dict())

    def load_state(self, state):
        self.powersgd.load_state_dict(state["powersgd"])


class QuantizedSync(OuterSync):
    """b-bit blocks with error feedback per fragment (residuals updated in place by each averaging)."""

    def __init__(self, bits):
        self.bits, self.name = bits, f"quantized:bits={bits}"

    def check_params(self, params, text):
        if params[0].dtype != torch.float32:
            raise ValueError(f"DiLoCo: outer_sync {text!r} averages float32 only; the model's parameters are "
                             f"{params[0].dtype}")

    def attach(self, group, world_size, backend, params, fragment_params, global_sizes):
        super().attach(group, world_size, backend, params, fragment_params, global_sizes)
        self.residuals = [(torch.zeros(n), torch.zeros(n)) for n in global_sizes]

    def launch(self, f, delta, k):
        residual, owned = self.residuals[f]
        # The collective takes CPU buffers: a CUDA delta goes through host memory (one copy
        # each way per outer step, small beside the wire); the residuals stay on the CPU.
        host = delta if delta.device.type == "cpu" else delta.to("cpu")
        work = self.backend.quantized_allreduce([host], self.bits, True, residual, owned)
        return work, (lambda: host) if host is delta else (lambda: host.to(delta.device))

    def state(self):
        # Called after DiLoCo waited for the averagings in flight: their residual updates are in.
        return dict(super().state(), quantized_residuals=[(r.clone(), o.clone()) for r, o in self.residuals])

    def check_state(self, state):
        saved = state.get("quantized_residuals")
        if saved is None or len(saved) != len(self.residuals) or any(
                r.shape != mine[0].shape or o.shape != mine[1].shape or r.dtype != torch.float32
                or o.dtype != torch.float32 for (r, o), mine in zip(saved, self.residuals)):
            raise ValueError("DiLoCo.load_state_dict: the checkpoint's quantized residuals are missing or do "
                             "not fit this model's fragments")

    def load_state(self, state):
        self.residuals = [(r.clone(), o.clone()) for r, o in state["quantized_residuals"]]


class GossipSync(OuterSync):
    """One push-sum round per outer step with one peer of the time-varying exponential graph;
    each rank keeps its own theta_global until sync()."""

    name = "gossip"

    def launch(self, f, delta, k):
        weight = torch.ones(1, dtype=torch.float64)
        # One round per outer step; the round index (the same on every rank) picks the peer.
        round_index = k * len(self.fragment_params) + f
        work = self.backend.push_sum_round([delta], weight, round_index, "exponential:peers=1", None)
        return work, lambda: delta.div_(weight.item())

    def final_average(self, flat):
        dist.all_reduce(flat, group=self.group)
        flat.div_(self.world_size)


def _option_keys(rest):
    """{lower-case key: value} of a "key=value,..." string."""
    items = [kv.strip() for kv in rest.split(",") if kv.strip()] if rest else []
    return {k.strip().lower(): v.strip() for k, _, v in (kv.partition("=") for kv in items)}


def parse(text):
    """The transport an outer_sync string names (not yet attached); ValueError naming what is
    wrong. Case-insensitive; its .name is the lower-case normal form (PowerSGD's options go to
    their parser as given: it ignores the case of keys too)."""
    if not isinstance(text, str):
        raise ValueError(f"DiLoCo: outer_sync must be a string, got {type(text).__name__}")
    name, _, rest = text.strip().partition(":")
    name, rest = name.strip().lower(), rest.strip()
    if name == "exact" and not rest:
        return ExactSync()
    if name == "gossip" and not rest:
        return GossipSync()
    if name == "powersgd":
        keys = _option_keys(rest)
        if "rank" not in keys and "matrix_approximation_rank" not in keys:
            raise ValueError(f"DiLoCo: outer_sync {text!r}: powersgd needs rank=<r> (e.g. 'powersgd:rank=4')")
        # The outer step is rare: compress from the first one.
        given_start = "start_iter" in keys or "start_powersgd_iter" in keys
        return PowerSGDSync(rest if given_start else rest + ",start_iter=0", "powersgd:" + rest.lower())
    if name == "quantized":
        keys = _option_keys(rest)
        unknown = sorted(set(keys) - {"bits"})
        if unknown:
            raise ValueError(f"DiLoCo: outer_sync {text!r}: unknown key(s) {unknown}; expected 'quantized:bits=8' "
                             "or 'quantized:bits=4'")
        if keys.get("bits") not in ("4", "8"):
            raise ValueError(f"DiLoCo: outer_sync {text!r}: quantized needs bits=8 or bits=4, got "
                             f"{keys.get('bits', 'none')!r} (e.g. 'quantized:bits=8')")
        return QuantizedSync(int(keys["bits"]))
    raise ValueError(f"DiLoCo: unknown outer_sync {text!r}: expected 'exact', 'powersgd:rank=<r>[,...]', 'gossip' "
                     "or 'quantized:bits=8|4'")
