"""torch-distlearn's two algorithms for PyTorch models, over gossipcc's native collectives:
elastic averaging (AllReduceEA, synchronous EASGD) and all-reduce SGD with uneven step counts
(AllReduceSGD).

Elastic averaging (every rank)::

    ea = gossipcc.AllReduceEA(model, tau=10, alpha=0.2)   # all ranks start from rank 0's params
    for x, y in batches:
        loss_fn(model(x), y).backward(); opt.step(); opt.zero_grad()
        ea.step()                 # every tau-th call: d = alpha (x - c); x -= d; c += allreduce(d)

Each rank trains on its own; every `tau` steps its parameters x are pulled towards the shared
center c and the center towards the ranks. sum_i x_i + c is conserved by each averaging;
every rank's copy of c stays identical. `ea.center()` returns the center (the model to
evaluate); `ea.average()` averages now regardless of tau.

All-reduce SGD with uneven steps (every rank; ranks may run different numbers of steps)::

    sgd = gossipcc.AllReduceSGD(model)                      # all ranks start from rank 0's params
    for x, y in my_shard:                                   # any number of batches per rank
        opt.zero_grad(); loss_fn(model(x), y).backward()
        sgd.sum_and_normalize_gradients()                   # grads <- sum / (ranks contributing)
        opt.step()
    sgd.finish()        # joins with zeros until every rank is done; then every rank takes the
                        # params of the rank that ran the most steps (bitwise)

Parameters must share one dtype and one device. Pass the bare module: a DistributedDataParallel
(or a model containing one) is refused on every rank, since DDP would all-reduce every gradient
at every backward on top of the method's own communication.
"""
import torch

from . import _C
from ._wrapper_utils import broadcast_from_first, check_params, refuse_ddp, resolve_group


class AllReduceEA:
    """Synchronous elastic averaging (torch-distlearn AllReduceEA); see the module docstring."""

    def __init__(self, module, tau, alpha, process_group=None):
        refuse_ddp(module, "AllReduceEA", "gossipcc.AllReduceEA(model, tau=..., alpha=...)")
        self.module = module
        self.process_group, self._backend, self.rank, self.world_size = resolve_group(process_group)
        self._params = list(module.parameters())
        check_params(self._params, "AllReduceEA")
        self._ea = _C.ElasticAveraging(tau, alpha)  # validates tau >= 1, 0 < alpha <= 1
        self.tau, self.alpha = tau, alpha
        with torch.no_grad():
            self._ea.initialize(self._backend, self._tensors())

    def _tensors(self):
        tensors = [p.data for p in self._params]
        for i, t in enumerate(tensors):
            if not t.is_contiguous():
                raise ValueError(f"AllReduceEA: parameter {i} is not contiguous")
        return tensors

    def step(self):
        """Once per local step, after the optimizer step (collective every tau-th call).
        Returns True when it averaged."""
        with torch.no_grad():
            return bool(self._ea.step(self._backend, self._tensors()))

    def average(self):
        """One elastic averaging now (collective), independent of tau."""
        with torch.no_grad():
            self._ea.average(self._backend, self._tensors())

    def center(self):
        """The center as tensors shaped like the parameters (a copy, in the parameters' dtype)."""
        flat = self._ea.center  # float64, flattened over the parameters in order
        out, offset = [], 0
        for p in self._params:
            out.append(flat[offset:offset + p.numel()].view_as(p).to(p.dtype).clone())
            offset += p.numel()
        return out

    def load_center_into_model(self):
        """Parameters <- the center (e.g. to evaluate or export the consensus model)."""
        with torch.no_grad():
            for p, c in zip(self._params, self.center()):
                p.copy_(c)

    @property
    def steps(self):
        """Local steps counted (step() calls since initialisation or the restored checkpoint)."""
        return self._ea.local_step

    def state_dict(self):
        """{"tau", "alpha", "step", "center"} for checkpoints."""
        return self._ea.state_dict()

    def load_state_dict(self, state):
        """Restores state_dict() (same tau and alpha; the center must match the parameters)."""
        center = state["center"]
        total = sum(p.numel() for p in self._params)
        if center.numel() != total:
            raise ValueError(f"AllReduceEA.load_state_dict: the center has {center.numel()} elements, "
                             f"the parameters {total}")
        self._ea.load_state_dict(state)


class AllReduceSGD:
    """All-reduce SGD with uneven step counts (torch-distlearn AllReduceSGD); see the module docstring."""

    def __init__(self, module, process_group=None, broadcast_init=True):
        refuse_ddp(module, "AllReduceSGD", "gossipcc.AllReduceSGD(model)")
        self.module = module
        self.process_group, self._backend, self.rank, self.world_size = resolve_group(process_group)
        self._params = list(module.parameters())
        check_params(self._params, "AllReduceSGD")
        # Gradients of the trainable parameters only (frozen ones get no .grad, so that weight
        # decay cannot move them); every parameter is synchronised at the end.
        self._trainable = [p for p in self._params if p.requires_grad]
        if not self._trainable:
            raise ValueError("AllReduceSGD: the module has no trainable parameters (requires_grad)")
        self._sgd = _C.UnevenAllReduceSGD()
        self._finished = False
        self.last_contributors = self.world_size
        self.ranks_training = self.world_size
        self.winner = None  # the rank whose parameters finish() gave everyone
        if broadcast_init:
            broadcast_from_first(self.process_group, self._params + list(module.buffers()))

    def _grads(self):
        grads = []
        for p in self._trainable:
            if p.grad is None:  # every rank must send the same sizes: an absent gradient is zero
                p.grad = torch.zeros_like(p)
            if not p.grad.is_contiguous():
                p.grad = p.grad.contiguous()
            grads.append(p.grad)
        return grads

    def sum_and_normalize_gradients(self):
        """Collective, after backward: every gradient <- (sum over the ranks contributing this
        step) / (their number). Returns (contributors, ranks still training)."""
        if self._finished:
            raise RuntimeError("AllReduceSGD: sum_and_normalize_gradients after finish()")
        with torch.no_grad():
            contributors, still = self._sgd.sum_and_normalize(self._backend, self._grads())
        self.last_contributors, self.ranks_training = int(contributors), int(still)
        return self.last_contributors, self.ranks_training

    def finish(self):
        """Collective, once after this rank's last step: joins the other ranks' remaining steps
        with zero gradients until every rank is done; then every rank takes, bitwise, the
        parameters of the rank that contributed the most steps (the highest rank among ties),
        the only one that applied every averaged update; torch-distlearn's "the node with the
        most steps wins". Returns that rank (also `self.winner`). Gradients are left zeroed."""
        if self._finished:
            return self.winner
        with torch.no_grad():
            scratch = [torch.zeros_like(p) for p in self._trainable]
            while self._sgd.join_until_all_done(self._backend, scratch):
                for s in scratch:
                    s.zero_()
            self.winner = int(self._sgd.synchronize_parameters(self._backend, [p.data for p in self._params]))
            for p in self._trainable:
                if p.grad is not None:
                    p.grad.zero_()
        self._finished = True
        return self.winner

    @property
    def steps(self):
        """Steps this rank contributed (sum_and_normalize_gradients calls, checkpoints included)."""
        return self._sgd.steps_contributed

    def state_dict(self):
        """{"uneven_sgd": {"steps_contributed", "collectives", "steps_since_sync"}}: the counters
        that decide finish()'s winner. Save it with the module's and the optimizer's state."""
        return {"uneven_sgd": self._sgd.state_dict()}

    def load_state_dict(self, state):
        """Restores state_dict() on a fresh wrapper (load the module's parameters after
        constructing it: the constructor broadcasts rank 0's)."""
        if not isinstance(state, dict) or "uneven_sgd" not in state:
            raise ValueError("AllReduceSGD.load_state_dict: expected the dict state_dict() returns, "
                             "with key 'uneven_sgd'")
        self._sgd.load_state_dict(state["uneven_sgd"])

