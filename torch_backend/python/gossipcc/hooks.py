"""DDP communication hooks on gossipcc's own collectives.

    model = DistributedDataParallel(module)                # process group with backend "gossipcc"
    state = gossipcc.hooks.PowerSGDState(process_group=None, matrix_approximation_rank=2,
                                         start_powerSGD_iter=10)
    model.register_comm_hook(state, gossipcc.hooks.powerSGD_hook)

or, for decentralised training (D-PSGD) with no all-reduce at all:

    state = gossipcc.hooks.GossipHookState(graph="ring")
    model.register_comm_hook(state, gossipcc.hooks.gossip_hook)

``powerSGD_hook`` is a drop-in for ``torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook``
(same state options, picklable state) that compresses each parameter's gradient with its own
shape through the native collective ``ProcessGroupGossipcc.powersgd_allreduce``. It is also the
hook the "powersgd" allreduce policy registers on unmodified DDP models (ddp.py), with a state
made by ``PowerSGDState.from_policy``.
``gossip_hook`` mixes each bucket's parameters with the graph neighbours' (a symmetric gossip
round, Metropolis weights) while the backward pass runs and hands DDP the *local* gradient, so
that the optimizer step completes the D-PSGD update ``x <- W x - lr * grad f(x)``.
See docs/pytorch.md.
"""
import logging

import torch
import torch.distributed as dist

from . import _C
from . import backend as _backend

logger = logging.getLogger(__name__)

__all__ = ["PowerSGDState", "powerSGD_hook", "GossipHookState", "gossip_hook"]


def _group_size(process_group):
    return (process_group if process_group is not None else dist.group.WORLD).size()


class _ParameterKeys:
    """Stable per-parameter keys for per-tensor state.

    DDP rebuilds its buckets after the first iteration, so state is keyed by parameter, not by
    bucket. Three ways, fixed at construction (`mode`):
      "names"      a parameter's name in ``module.named_parameters()`` (bind(module));
      "positions"  "param<i>", i its position in ``module.parameters()`` (bind(module));
      "first_seen" "param0", "param1", ... in the order the hook first sees the parameters: the
                   same on every rank and in every process running the same model, because DDP
                   calls hooks in bucket order and its first-iteration buckets are deterministic.
    With a bound module, each key also knows its parameter's shape and dtype (`layout`).
    """

    def __init__(self, mode="first_seen"):
        self.mode = mode
        self.by_id = {}
        self.layout = {}  # key -> (label in messages, shape, dtype name)
        self.next_index = 0

    def bind(self, module):
        if self.mode == "first_seen":
            self.mode = "names"
        named = list(module.named_parameters())
        keys = ([name for name, _ in named] if self.mode == "names" else [f"param{i}" for i in range(len(named))])
        self.by_id = {id(p): key for key, (_, p) in zip(keys, named)}
        self.layout = {key: (repr(name) if self.mode == "names" else str(i), tuple(p.shape),
                             str(p.dtype).replace("torch.", ""))
                       for i, (key, (name, p)) in enumerate(zip(keys, named))}

    def keys(self, params):
        out = []
        for p in params:
            key = self.by_id.get(id(p))
            if key is None:
                if self.mode != "first_seen":
                    raise ValueError("gossipcc PowerSGDState: a parameter of the bucket is not among the module's "
                                     "parameters that key the state (after loading a pickled state, call "
                                     "state.set_module(ddp_model.module))")
                key = f"param{self.next_index}"
                self.next_index += 1
                self.by_id[id(p)] = key
            out.append(key)
        return out


def _policy_fields(options):
    """PyTorch's option names for a native options string ("rank=2,start_iter=10,...")."""
    given = dict(kv.split("=", 1) for kv in options.split(",") if "=" in kv)
    return dict(matrix_approximation_rank=int(given.get("rank", 1)),
                min_compression_rate=float(given.get("min_compression_rate", 2)),
                use_error_feedback=given.get("error_feedback", "1") == "1",
                warm_start=given.get("warm_start", "1") == "1",
                orthogonalization_epsilon=float(given.get("epsilon", 0)),
                random_seed=int(given.get("seed", 0)),
                batch_tensors_with_same_shape=given.get("batch_same_shape", "0") == "1")


class PowerSGDState:
    """State of :func:`powerSGD_hook`.

    ``PowerSGDState(process_group, ...)`` takes the options of PyTorch's ``PowerSGDState`` (same
    names, defaults and checks) plus, keyword-only, ``module``: the model (DDP's ``.module``),
    whose parameter names then key the per-parameter state. As PyTorch's, the hook counts
    iterations and averages exactly (one all-reduce per bucket) before ``start_powerSGD_iter``,
    and logs compression statistics.

    ``PowerSGDState.from_policy(backend, module, options)`` is the state of the allreduce
    policy's hook: the native options string decides everything, its ``start_iter`` included
    (exact averaging per parameter through the native collective, counted per key), keys are
    "param<i>" by position in ``module.parameters()`` and the hook logs nothing.

    Checkpoints: ``pickle``/``torch.save`` carry the options, the iteration counter and every
    parameter's error-feedback memory and warm-start Q (the native state, as bytes); the
    process group is dropped and re-attached to the default group on load, as PyTorch does
    (set ``state.process_group`` after loading for another group). ``state_dict()`` /
    ``load_state_dict()`` carry the native state alone and check it against the model's
    parameters (a state keyed by a module: names or positions).
    """

    __slots__ = [
        "process_group", "matrix_approximation_rank", "start_powerSGD_iter", "min_compression_rate",
        "use_error_feedback", "warm_start", "orthogonalization_epsilon", "random_seed",
        "compression_stats_logging_frequency", "batch_tensors_with_same_shape", "iter",
        "total_numel_before_compression", "total_numel_after_compression", "next_stats_report",
        "_native", "_keys", "_options", "_pytorch_schedule", "_backend",
    ]

    def __init__(self, process_group, matrix_approximation_rank=1, start_powerSGD_iter=1_000,
                 min_compression_rate=2, use_error_feedback=True, warm_start=True,
                 orthogonalization_epsilon=0, random_seed=0, compression_stats_logging_frequency=10_000,
                 batch_tensors_with_same_shape: bool = False, *, module=None):
        if (use_error_feedback or warm_start) and start_powerSGD_iter <= 1:
            raise ValueError(
                "Expect `start_powerSGD_iter` > 1 if `use_error_feedback` or `warm_start` is enabled, "
                "because PowerSGD can only be applied after the first two iterations in DDP.")
        self._set_options(process_group, matrix_approximation_rank, start_powerSGD_iter, min_compression_rate,
                          use_error_feedback, warm_start, orthogonalization_epsilon, random_seed,
                          compression_stats_logging_frequency, batch_tensors_with_same_shape)
        # The hook decides when compression starts (like PyTorch's, by iteration): the native
        # collective compresses from its first call (start_iter=0).
        self._pytorch_schedule = True
        self._options = self._native_options()
        self._native = _C.PowerSGD(self._options)
        self._backend = None
        self._keys = _ParameterKeys()
        if module is not None:
            self._keys.bind(module)

    @classmethod
    def from_policy(cls, backend, module, options, process_group=None):
        """The allreduce policy's state for a DDP model of `backend`'s group (see the class)."""
        self = cls.__new__(cls)
        self._set_options(process_group, start_powerSGD_iter=0, compression_stats_logging_frequency=10_000,
                          **_policy_fields(options))
        self._pytorch_schedule = False
        self._options = options
        self._native = _C.PowerSGD(options)
        self._backend = backend
        self._keys = _ParameterKeys("positions")
        self._keys.bind(module)
        return self

    def _set_options(self, process_group, matrix_approximation_rank, start_powerSGD_iter, min_compression_rate,
                     use_error_feedback, warm_start, orthogonalization_epsilon, random_seed,
                     compression_stats_logging_frequency, batch_tensors_with_same_shape):
        self.process_group = process_group
        self.matrix_approximation_rank = matrix_approximation_rank
        self.start_powerSGD_iter = start_powerSGD_iter
        self.min_compression_rate = min_compression_rate
        self.use_error_feedback = use_error_feedback
        self.warm_start = warm_start
        self.orthogonalization_epsilon = orthogonalization_epsilon
        self.random_seed = random_seed
        self.compression_stats_logging_frequency = max(1, compression_stats_logging_frequency)
        self.batch_tensors_with_same_shape = batch_tensors_with_same_shape
        self.iter = 0
        self.total_numel_before_compression = 0
        self.total_numel_after_compression = 0
        self.next_stats_report = 0

    def _native_options(self):
        return ",".join([
            f"rank={int(self.matrix_approximation_rank)}",
            "start_iter=0",
            f"min_compression_rate={float(self.min_compression_rate)!r}",
            f"error_feedback={int(bool(self.use_error_feedback))}",
            f"warm_start={int(bool(self.warm_start))}",
            f"epsilon={float(self.orthogonalization_epsilon)!r}",
            f"seed={int(self.random_seed)}",
            f"batch_same_shape={int(bool(self.batch_tensors_with_same_shape))}",
        ])

    @property
    def native(self):
        """The gossipcc._C.PowerSGD doing the work (state per parameter key)."""
        return self._native

    @property
    def powersgd(self):
        """Alias of ``native`` (the name of the policy's state before the two hooks were one)."""
        return self._native

    @property
    def backend(self):
        """The gossipcc backend the hook runs on: the policy's, else the process group's now."""
        return self._backend if self._backend is not None else _backend.get_backend_object(self.process_group)

    def parameter_keys(self, params):
        """The state keys of `params` (assigning new ones on first sight)."""
        return self._keys.keys(params)

    def set_module(self, module):
        """Keys state by ``module``'s parameters (names, or positions for a policy's state) from
        now on (call before training)."""
        self._keys.bind(module)

    def maybe_increase_iter(self, bucket):
        # Bucket 0 is the last to be reduced in an iteration: count iterations there.
        if bucket.is_last():
            self.iter += 1
        if self._pytorch_schedule and self.iter == self.start_powerSGD_iter:
            logger.info("Start to apply PowerSGD after %d iterations.", self.iter)

    def compression_stats(self):
        """(compress_rate, numel_before_compression, numel_after_compression), as PyTorch's."""
        rate = (self.total_numel_before_compression / self.total_numel_after_compression
                if self.total_numel_after_compression > 0 else 0)
        return rate, self.total_numel_before_compression, self.total_numel_after_compression

    def _record(self, stats):
        self.total_numel_before_compression += stats["elements_before"]
        self.total_numel_after_compression += stats["elements_after"]
        if self.iter >= self.next_stats_report:
            rate, before, after = self.compression_stats()
            logger.info("Compression stats: iter %d, total before compression %d, total after compression %d, "
                        "rate %.2f", self.iter, before, after, rate)
            self.next_stats_report = self.iter + self.compression_stats_logging_frequency

    # ---- checkpoints ----------------------------------------------------------------------
    def state_dict(self):
        """{"options", "powersgd"}: every parameter's error feedback, warm-start Q and step count."""
        return {"options": self._native.options, "powersgd": self._native.state_dict()}

    def load_state_dict(self, state):
        """Restores state_dict(). The state must come from a model with the same parameters:
        every saved key must name a parameter of this model with the saved shape and dtype
        (ValueError naming the first that does not; nothing is loaded then). The options must
        agree in rank and error feedback (the native layer's check)."""
        who = "PowerSGDState.load_state_dict"
        if not isinstance(state, dict) or "powersgd" not in state:
            raise ValueError(f"{who}: expected the dict state_dict() returns, with key 'powersgd'")
        if self._keys.mode == "first_seen":
            raise ValueError(f"{who}: this state keys parameters in the order the hook first sees them, so a "
                             "checkpoint cannot be checked against the model: construct it with module=, or "
                             "checkpoint the state itself (pickle / torch.save)")
        layout, n = self._keys.layout, len(self._keys.layout)
        saved = _C.PowerSGD.checkpoint_tensors(state["powersgd"])
        for key in saved:  # first the keys (a model with other parameters), then their shapes
            if key not in layout:
                known = f"{n} parameters (param0..param{n - 1})" if self._keys.mode == "positions" else \
                    f"no parameter of that name ({n} parameters)"
                raise ValueError(f"{who}: the state has key {key!r} but this model has {known}: a checkpoint of "
                                 "another model?")
        for key, (shape, dtype, _) in saved.items():
            label, want_shape, want_dtype = layout[key]
            if (tuple(shape), dtype) != (want_shape, want_dtype):
                raise ValueError(f"{who}: the state's {key} has shape {list(shape)} {dtype} but this model's "
                                 f"parameter {label} has shape {list(want_shape)} {want_dtype}: a checkpoint of "
                                 "another model?")
        self._native.load_state_dict(state["powersgd"])

    def __getstate__(self):
        state = {slot: getattr(self, slot) for slot in self.__slots__
                 if slot not in ("process_group", "_native", "_keys", "_backend")}
        state["_native_state"] = self._native.state_dict()
        state["_keys_mode"] = self._keys.mode
        return state

    def __setstate__(self, state):
        state = dict(state)
        native_state = state.pop("_native_state")
        mode = state.pop("_keys_mode", "names" if state.pop("_keys_by_name", False) else "first_seen")
        self.process_group = dist.distributed_c10d._get_default_group()
        logger.warning("NOTE: Process group will be set to a default group (i.e. the world size). If a different "
                       "group is desired, please set `self.process_group` after PowerSGD state is loaded.")
        self._pytorch_schedule = True
        self._backend = None
        for slot, value in state.items():
            setattr(self, slot, value)
        if not hasattr(self, "_options"):
            self._options = self._native_options()
        self._native = _C.PowerSGD(self._options)
        self._native.load_state_dict(native_state)
        # Parameter ids do not survive a process: first-seen keys are re-assigned in the same
        # order; name and position keys need the module again (set_module), else the hook raises.
        self._keys = _ParameterKeys(mode)


def _allreduce_mean_future(process_group, tensor):
    """PyTorch's default hook: tensor / world_size, all-reduced; a future of the tensor."""
    tensor.div_(_group_size(process_group))
    work = dist.all_reduce(tensor, group=process_group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def powerSGD_hook(state: PowerSGDState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Per-parameter PowerSGD through the native collective; a drop-in for PyTorch's
    ``powerSGD_hook``. Plain averaging (all-reduce) for the first ``start_powerSGD_iter``
    iterations, then each parameter's gradient is compressed as its own matrix (vectors and
    matrices not worth compressing are averaged exactly, in one packed all-reduce).

    Returns at once: the future completes when the native asynchronous collective (on
    gossipcc's algorithm lane) does, so the compression and communication of this bucket
    overlap the rest of the backward pass. Buckets are issued in DDP's bucket order on every
    rank, so their collectives pair up."""
    buffer = bucket.buffer()
    # Keys are assigned from the first call on, so that every process (a fresh one resuming
    # from a checkpoint included) assigns them in its first iteration's bucket order.
    keys = state.parameter_keys(bucket.parameters())
    if state.iter < state.start_powerSGD_iter:
        state.maybe_increase_iter(bucket)
        return _allreduce_mean_future(state.process_group, buffer)
    grads = bucket.gradients()
    # The per-parameter gradients are views into `buffer`: averaging them in place averages
    # the buffer DDP copies back into .grad. (A non-contiguous view goes through a copy.)
    work_tensors = [g if g.is_contiguous() else g.contiguous() for g in grads]
    work = state.backend.powersgd_allreduce(work_tensors, None, state.native, keys)
    state.maybe_increase_iter(bucket)

    def finish(fut):
        fut.value()  # re-raises the collective's error
        for g, w in zip(grads, work_tensors):
            if g is not w:
                g.copy_(w)
        if state._pytorch_schedule:
            state._record(state.native.last_stats)
        return buffer

    return work.get_future().then(finish)


class GossipHookState:
    """State of :func:`gossip_hook` (D-PSGD through DDP).

    process_group: a gossipcc group (None: the default group). graph: an undirected peer graph
    spec (``"ring"``, ``"complete"``, ``"hypercube"``, ``"edges:..."``); mixing uses
    Metropolis weights. ``step`` counts iterations (the graph may vary with it);
    ``state_dict``/``load_state_dict`` (and pickling) carry it.
    """

    def __init__(self, process_group=None, graph="ring", start_step=0):
        self.process_group = process_group
        self.graph = graph
        self.step = int(start_step)
        if self.step < 0:
            raise ValueError(f"gossip_hook: start_step must be >= 0, got {start_step}")
        # Validates the spec now (a ValueError listing the valid graphs), for this group's size.
        _C.peer_graph_info(graph, _group_size(process_group))

    def state_dict(self):
        return {"graph": self.graph, "step": self.step}

    def load_state_dict(self, state):
        self.graph = state["graph"]
        self.step = int(state["step"])

    def __getstate__(self):
        return self.state_dict()

    def __setstate__(self, state):
        self.process_group = None
        self.load_state_dict(state)


def gossip_hook(state: GossipHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Mixes the bucket's parameters with the graph neighbours' while the backward pass runs
    and returns the bucket's LOCAL gradient (no all-reduce): with the optimizer step this is
    D-PSGD, ``x <- W x - lr * grad f(x)``, the gradient taken at the pre-mixing x.

    When writing parameters is safe: DDP calls the hook once every gradient in the bucket has
    been accumulated, i.e. after every autograd node that uses these parameters has run (a
    parameter's gradient is complete only after all its uses), so nothing in this backward
    pass reads them again. The hook still snapshots the parameters into a flat buffer and the
    gossip round mixes that copy on gossipcc's algorithm lane; the mixed values are written
    into the parameters only in the future's callback, when the round is complete. DDP waits
    for every bucket's future before ``backward()`` returns, so the optimizer step and the next
    forward pass see the mixed parameters. Buckets are issued in bucket order on every rank, so
    the rounds pair up across ranks.
    """
    backend = _backend.get_backend_object(state.process_group)
    buffer = bucket.buffer()
    params = bucket.parameters()
    with torch.no_grad():
        flat = torch.cat([p.detach().reshape(-1) for p in params]) if params else buffer.new_empty(0)
    work = backend.symmetric_gossip_round([flat], state.step, graph=state.graph)
    if bucket.is_last():
        state.step += 1

    def write_back(fut):
        fut.value()  # re-raises the round's error
        with torch.no_grad():
            offset = 0
            for p in params:
                n = p.numel()
                p.copy_(flat[offset:offset + n].view_as(p))
                offset += n
        return buffer

    return work.get_future().then(write_back)
