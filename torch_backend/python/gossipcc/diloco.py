"""DiLoCo and Streaming DiLoCo: many local (inner) steps, a rare synchronised outer step.

Douillard et al., "DiLoCo: Distributed Low-Communication Training of Language Models" (2023) and
"Streaming DiLoCo with overlapping communication" (2025). Usage, as in torchft (every rank;
`import gossipcc` and init_process_group first)::

    inner = torch.optim.AdamW(model.parameters(), lr=4e-4)
    outer = torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True)
    diloco = gossipcc.DiLoCo(model, inner, outer, sync_every=500)
    for x, y in batches:
        loss_fn(model(x), y).backward()
        inner.step(); inner.zero_grad()
        diloco.step()                      # counts inner steps; synchronises every H-th call
    diloco.sync()                          # every rank: one model (theta_global), to evaluate and save

sync() ends training on one model: it applies averagings in flight, takes a last outer step over
the inner steps not yet synchronised (all of them in a run shorter than sync_every) and sets
every rank's parameters to theta_global, bitwise equal on every rank ("gossip": their exact
average); see DiLoCo.sync. flush() only applies the averagings in flight, locally.

The outer step of a fragment (the whole model when fragments=1), at the inner steps t with
(t + offset) % H == 0, offset = fragment * H // fragments (staggered):
  1. outer gradient  delta = theta_global - theta_local   (theta_global: the fragment at its
                                                          last synchronisation)
  2. average it across ranks (outer_sync below); with overlap=tau the averaging runs in the
     background and steps 3-4 happen tau inner steps later
  3. theta_global <- outer_optimizer step from theta_global with gradient avg(delta)
  4. theta_local  <- mix * theta_local + (1 - mix) * theta_global   (mix = 0: DiLoCo's reset)

outer_sync (how delta travels; case-insensitive, kept in lower case as .outer_sync; one
transport object each, outer_sync.py, as .transport):
  "exact"             the process group's all-reduce (any backend), divided by the group size
  "powersgd:rank=r"   gossipcc's PowerSGD collective (low rank, error feedback, warm start),
                      each parameter with its own shape; other PowerSGD keys may follow
                      ("powersgd:rank=4,min_compression_rate=2"); gossipcc backend only
  "gossip"            decentralised DiLoCo: one push-sum round with one peer of the time-varying
                      exponential graph per outer step, instead of an average over all ranks;
                      each rank then keeps its own theta_global; gossipcc backend only
  "quantized:bits=b"  gossipcc's quantized all-reduce (compression/quantized_allreduce.h), b = 8 or 4:
                      delta travels as b-bit integers with a float32 scale per block of 256
                      (1.02 or 0.52 bytes per element instead of 4; speed: docs/benchmarks.md,
                      "(f) Quantized all-reduce"), with error feedback kept per fragment: what
                      quantization dropped from this rank's delta (and from the average of the
                      blocks this rank owns) is added to the next outer step's, so nothing is
                      lost for good. Per element the average is within about 1/(2^(b-1)-1) times
                      the ranks' mean block maximum |delta + residual| of the exact one (the
                      header states the bound), and bitwise the same on every rank, so every
                      rank keeps the same theta_global. A checkpoint holds the residuals.
                      float32 parameters (else ValueError); gossipcc backend only; CUDA
                      parameters' delta is copied to the CPU and back around the collective

H = 1, fragments = 1, outer SGD with lr 1 and no momentum, exact: every step equals DDP's step
(theta - lr_inner * mean gradient), to rounding.

Every rank must construct DiLoCo with the same arguments and a model with bitwise equal
parameters (both checked at construction: a ValueError on every rank, naming what differs).
Also refused at construction, on every rank: a model wrapped in DistributedDataParallel (DDP
would all-reduce every gradient, every step: pass the bare module), and an inner or outer
optimizer that is not over the model's parameters (every trainable one, nothing else; the
error names the missing and the extra ones). The training loop steps the inner optimizer only:
a call of outer_optimizer.step() outside DiLoCo (e.g. the two optimizers passed swapped) is a
ValueError at the next step(), saying which optimizer goes where.
state_dict()/load_state_dict() carry DiLoCo's own state (inner step, every fragment's theta_global,
the outer optimizer's state, averages in flight, PowerSGD's memory, the quantized transport's
residuals); save the model and the inner
optimizer beside it, as for any optimizer. A run resumed from them continues bit for bit.
"""
import hashlib
import types

import torch
import torch.distributed as dist

from . import outer_sync as _outer_sync
from .backend import get_backend_object
from ._wrapper_utils import check_params, flatten, global_rank, refuse_ddp, unflatten_into


def _count_outside_steps(opt):
    """Wraps opt.step (on the instance) so that calls made outside DiLoCo are counted; returns the
    counter {"outside": calls, "inside": DiLoCo is stepping}. The wrapper stays a bound method of
    opt (an LR scheduler attached before or after wraps it in turn and still counts), and a later
    DiLoCo over the same optimizer replaces it instead of stacking."""
    calls = {"outside": 0, "inside": False}
    current = opt.step
    original = getattr(current, "_gossipcc_unwrapped", current)
    # A method bound to opt is called on `self`, so that a copy of the optimizer steps itself.
    func = original.__func__ if getattr(original, "__self__", None) is opt else None

    def step(self, *args, **kwargs):
        if not calls["inside"]:
            calls["outside"] += 1
        return func(self, *args, **kwargs) if func is not None else original(*args, **kwargs)

    for marker in ("_with_counter", "_wrapped_by_lr_sched"):  # torch's LR schedulers' own wrappers
        if hasattr(original, marker):
            setattr(step, marker, getattr(original, marker))
    step._gossipcc_unwrapped = original
    opt.step = types.MethodType(step, opt)
    return calls


def split_fragments(params, fragments):
    """Consecutive groups of parameter indices, every parameter in exactly one, element counts
    as even as consecutive groups allow (each group non-empty)."""
    n = len(params)
    total = sum(p.numel() for p in params)
    bounds, start, acc = [], 0, 0
    for f in range(fragments):
        if f == fragments - 1:
            bounds.append(list(range(start, n)))
            break
        target = total * (f + 1) / fragments
        end = start + 1  # at least one parameter
        acc += params[start].numel()
        # Take more while the next one brings the sum closer to the target and leaves one
        # parameter for every remaining fragment.
        while end < n - (fragments - 1 - f) and abs(acc + params[end].numel() - target) <= abs(acc - target):
            acc += params[end].numel()
            end += 1
        bounds.append(list(range(start, end)))
        start = end
    return bounds


class _Pending:
    """A fragment's averaging in flight: the Work, what to read when it completes, when to apply."""

    def __init__(self, apply_at, work, finish):
        self.apply_at = apply_at
        self.work = work          # None once the result is in `result`
        self.finish = finish      # () -> averaged delta (flat), called after work completes
        self.result = None

    def get(self):
        if self.result is None:
            if self.work is not None:
                self.work.wait()
            self.result = self.finish()
            self.work = self.finish = None
        return self.result


class DiLoCo:
    """DiLoCo / Streaming DiLoCo over a process group; see the module docstring."""

    def __init__(self, model, inner_optimizer, outer_optimizer=None, sync_every=500, fragments=1, overlap=0,
                 mix=0.0, outer_sync="exact", process_group=None):
        if not dist.is_initialized():
            raise RuntimeError("DiLoCo: call torch.distributed.init_process_group first")
        self.group = process_group
        self.rank, self.world_size = dist.get_rank(process_group), dist.get_world_size(process_group)
        self.params = list(model.parameters()) if isinstance(model, torch.nn.Module) else []
        self.outer_sync = outer_sync  # its normal form once checked
        # Construction is collective: a rank whose arguments are bad does not raise alone (the
        # others would wait in the agreement below until the timeout); every rank learns of it
        # in the same all-gather and raises.
        try:
            self._check_arguments(model, inner_optimizer, sync_every, fragments, overlap, mix, outer_sync,
                                  outer_optimizer, process_group)
            local_error = None
        except ValueError as e:
            local_error = e
        self._check_agreement(sync_every, fragments, overlap, mix, self.outer_sync, local_error)
        if outer_optimizer is None:
            outer_optimizer = torch.optim.SGD(self.params, lr=0.7, momentum=0.9, nesterov=True)
        self.inner_optimizer, self.outer_optimizer = inner_optimizer, outer_optimizer
        self.sync_every, self.fragments, self.overlap, self.mix = sync_every, fragments, overlap, float(mix)
        # Calls of outer_optimizer.step() made outside DiLoCo (the training loop stepping it: the
        # optimizers swapped), refused at the next step() or sync().
        self._outer_calls = _count_outside_steps(outer_optimizer)
        self.fragment_params = split_fragments(self.params, fragments)
        self.offsets = [f * sync_every // fragments for f in range(fragments)]
        with torch.no_grad():
            self._global = [flatten([self.params[i] for i in idx]) for idx in self.fragment_params]
        self.inner_steps = 0
        self.outer_steps = [0] * fragments  # synchronisations started, per fragment
        self._last_launch = [0] * fragments  # inner step of each fragment's latest synchronisation
        self._pending = {}
        self.transport.attach(self.group, self.world_size, self.backend, self.params, self.fragment_params,
                              [g.numel() for g in self._global])

    # ---- checks --------------------------------------------------------------------------
    def _check_arguments(self, model, inner_optimizer, sync_every, fragments, overlap, mix, outer_sync,
                         outer_optimizer, process_group):
        """This rank's arguments; ValueError naming the first bad one. Sets transport, backend,
        outer_sync (normal form)."""
        refuse_ddp(model, "DiLoCo", "gossipcc.DiLoCo(model, inner_optimizer, outer_optimizer, ...)")
        if isinstance(sync_every, bool) or not isinstance(sync_every, int) or sync_every < 1:
            raise ValueError(f"DiLoCo: sync_every (H) must be an integer >= 1, got {sync_every!r}")
        check_params(self.params, "DiLoCo")
        if isinstance(fragments, bool) or not isinstance(fragments, int) or not 1 <= fragments <= len(self.params):
            raise ValueError(f"DiLoCo: fragments must be an integer in [1, {len(self.params)}] (the model has "
                             f"{len(self.params)} parameter tensors), got {fragments!r}")
        if isinstance(overlap, bool) or not isinstance(overlap, int) or not 0 <= overlap < sync_every:
            raise ValueError(f"DiLoCo: overlap (tau) must be an integer in [0, sync_every) = [0, {sync_every}), "
                             f"got {overlap!r}")
        if not isinstance(mix, (int, float)) or isinstance(mix, bool) or not 0.0 <= mix <= 1.0:
            raise ValueError(f"DiLoCo: mix (alpha) must be a number in [0, 1], got {mix!r}")
        self.transport = _outer_sync.parse(outer_sync)
        self.outer_sync = self.transport.name
        self.transport.check_params(self.params, outer_sync)
        self.backend = None
        if self.transport.needs_gossipcc:
            try:
                self.backend = get_backend_object(process_group)
            except Exception as e:  # noqa: BLE001 - named below
                raise ValueError(f"DiLoCo: outer_sync {outer_sync!r} needs a gossipcc process group ({e})") from e
        self._check_optimizer(model, inner_optimizer, "inner_optimizer", "torch.optim.AdamW(model.parameters(), lr=4e-4)")
        if outer_optimizer is not None:
            if outer_optimizer is inner_optimizer:
                raise ValueError("DiLoCo: inner_optimizer and outer_optimizer are the same object; pass two "
                                 "optimizers over the model's parameters, the one your loop steps as inner_optimizer "
                                 "(e.g. AdamW) and a separate outer one (e.g. torch.optim.SGD(model.parameters(), "
                                 "lr=0.7, momentum=0.9, nesterov=True)), or leave outer_optimizer out for that default")
            self._check_optimizer(model, outer_optimizer, "outer_optimizer",
                                  "torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True)")

    @staticmethod
    def _check_optimizer(model, opt, role, example):
        """`opt` is a torch optimizer over the model's parameters: every trainable one (frozen ones,
        requires_grad=False, may be left out) and nothing else; ValueError naming the differences."""
        if not isinstance(opt, torch.optim.Optimizer):
            raise ValueError(f"DiLoCo: {role} must be a torch.optim.Optimizer over the model's parameters (e.g. "
                             f"{example}), got {type(opt).__name__}")
        names = {id(p): n for n, p in model.named_parameters()}
        theirs = [p for g in opt.param_groups for p in g["params"]]
        ids = {id(p) for p in theirs}
        missing = [n for n, p in model.named_parameters() if p.requires_grad and id(p) not in ids]
        extra = [tuple(p.shape) for p in theirs if id(p) not in names]
        if missing or extra:
            what = []
            if missing:
                what.append(f"it lacks the model's parameter(s) {missing}")
            if extra:
                what.append(f"it has {len(extra)} tensor(s) that are not the model's (shapes {extra})")
            raise ValueError(f"DiLoCo: {role} must be constructed over the parameters of the model given to DiLoCo "
                             f"(e.g. {example}): {'; '.join(what)}")

    def _check_outer_not_stepped(self):
        """ValueError if the training loop stepped outer_optimizer (DiLoCo's alone to step)."""
        n = self._outer_calls["outside"]
        if n:
            raise ValueError(
                f"DiLoCo on rank {self.rank}: outer_optimizer.step() was called {n} time(s) outside DiLoCo (seen at "
                f"inner step {self.inner_steps}); DiLoCo takes the outer step itself at each synchronisation and "
                "the training loop must step only the inner optimizer. The two optimizers look swapped: construct "
                "DiLoCo(model, inner_optimizer=<the optimizer your loop steps, e.g. AdamW(lr=4e-4)>, "
                "outer_optimizer=<e.g. SGD(lr=0.7, momentum=0.9, nesterov=True)>) from a fresh model")

    def _check_agreement(self, sync_every, fragments, overlap, mix, outer_sync, local_error):
        """One all-gather: whether each rank's arguments were valid, H, P, tau, alpha, the transport
        and a SHA-256 of the parameters. Any difference (or any rank's invalid arguments) is a
        ValueError on every rank, naming it."""
        def as_int(value):
            return value if isinstance(value, int) and not isinstance(value, bool) else -1
        h = hashlib.sha256()
        for p in self.params:
            h.update(p.detach().cpu().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
        mix_code = int(round(mix * 2**30)) if isinstance(mix, (int, float)) and not isinstance(mix, bool) else -1
        config = [0 if local_error is None else 1, as_int(sync_every), as_int(fragments), as_int(overlap), mix_code,
                  int.from_bytes(hashlib.sha256(repr(outer_sync).encode()).digest()[:7], "little"),
                  int.from_bytes(h.digest()[:7], "little")]
        mine = torch.tensor(config, dtype=torch.int64)
        everyone = [torch.zeros_like(mine) for _ in range(self.world_size)]
        dist.all_gather(everyone, mine, group=self.group)
        invalid = [r for r, t in enumerate(everyone) if int(t[0]) != 0]
        if local_error is not None:
            raise ValueError(f"{local_error} (rank {self.rank}" +
                             (f"; also invalid on rank(s) {[r for r in invalid if r != self.rank]})"
                              if len(invalid) > 1 else ")")) from local_error
        if invalid:
            raise ValueError(f"DiLoCo on rank {self.rank}: rank(s) {invalid} passed invalid arguments (their errors "
                             "name them); nothing was created")
        names = ["sync_every", "fragments", "overlap", "mix", "outer_sync", "parameters (bitwise)"]
        for i, name in enumerate(names):
            values = [int(t[i + 1]) for t in everyone]
            if len(set(values)) > 1:
                differ = [r for r, v in enumerate(values) if v != values[0]]
                shown = "" if i >= 4 else f" (values by rank: {values})"
                hint = "; start every rank from the same model (e.g. broadcast rank 0's)" if i == 5 else ""
                raise ValueError(f"DiLoCo on rank {self.rank}: ranks disagree on {name}: rank(s) {differ} differ "
                                 f"from rank 0{shown}{hint}")

    # ---- the schedule --------------------------------------------------------------------
    def step(self):
        """Call once after every inner optimizer step: applies the averagings that are due and
        starts the synchronisations of the fragments whose turn it is (in fragment order)."""
        self._check_outer_not_stepped()
        self.inner_steps += 1
        t = self.inner_steps
        for f in sorted(self._pending):
            if self._pending[f].apply_at <= t:
                self._apply(f)
        for f in range(self.fragments):
            if (t + self.offsets[f]) % self.sync_every == 0:
                self._launch(f)
                if self.overlap == 0:
                    self._apply(f)

    def _launch(self, f):
        idx = self.fragment_params[f]
        with torch.no_grad():
            delta = self._global[f] - flatten([self.params[i] for i in idx])
        k = self.outer_steps[f]
        self.outer_steps[f] += 1
        self._last_launch[f] = self.inner_steps
        work, finish = self.transport.launch(f, delta, k)
        self._pending[f] = _Pending(self.inner_steps + self.overlap, work, finish)

    def _apply(self, f):
        avg = self._pending.pop(f).get()
        idx = self.fragment_params[f]
        frag = [self.params[i] for i in idx]
        with torch.no_grad():
            local = flatten(frag) if self.mix > 0 else None
            grads = [p.grad for p in self.params]
            try:
                for p in self.params:
                    p.grad = None
                unflatten_into(self._global[f], frag)
                # avg is this averaging's own tensor (popped above): the gradients can view it.
                offset = 0
                for p in frag:
                    n = p.numel()
                    p.grad = avg[offset:offset + n].view_as(p)
                    offset += n
                self._outer_calls["inside"] = True
                self.outer_optimizer.step()
            finally:
                self._outer_calls["inside"] = False
                for p, g in zip(self.params, grads):
                    p.grad = g
            self._global[f] = flatten(frag)
            if self.mix > 0:
                unflatten_into(local.mul_(self.mix).add_(self._global[f], alpha=1.0 - self.mix), frag)

    def flush(self):
        """Applies every averaging in flight now. Local (no communication): each rank keeps its
        own inner steps since the last synchronisation, so the ranks' models still differ; to end
        on one model (evaluate, save), call sync()."""
        for f in sorted(self._pending):
            self._apply(f)

    def sync(self):
        """Collective, every rank at the same inner step: brings every rank to one model, the
        synchronised parameters theta_global, bitwise equal on every rank. Call it at the end of
        training (or before evaluating or saving one model); training may go on after it.

        What it does, per fragment:
          - an averaging in flight (overlap > 0) is waited for and its outer step applied now, as
            it would have been at its step; the inner steps taken after it was launched are not
            in the result (as with mix = 0 at any overlapped outer step);
          - otherwise, if inner steps were taken since the fragment's last synchronisation (e.g. a
            run shorter than sync_every, or stopped between two), one outer step over them now,
            as at a scheduled synchronisation (outer_sync transport, outer_optimizer step);
          - the fragment's parameters <- its theta_global (mix is not applied: the end model is
            the synchronised one).
        This is DiLoCo's own output: the paper's algorithm returns theta_global after an outer
        step, and a round cut short is a round with fewer inner steps (torchft's LocalSGD and
        DiLoCo name the synchronisation sync() too). With outer_sync="gossip" each rank keeps
        its own theta_global; sync() then replaces it, on every rank, by their exact average
        over the group (an all-reduce). Finally rank 0's theta_global is broadcast, so that
        every rank holds the same bits whatever the transport's rounding.
        """
        self._check_outer_not_stepped()
        t = self.inner_steps
        for f in range(self.fragments):
            if f in self._pending:
                self._apply(f)
            elif self._last_launch[f] < t:
                self._launch(f)
                self._apply(f)
        with torch.no_grad():
            flat = torch.cat(self._global)
            self.transport.final_average(flat)
            dist.broadcast(flat, src=global_rank(self.group, 0), group=self.group)
            offset = 0
            for f, idx in enumerate(self.fragment_params):
                n = self._global[f].numel()
                self._global[f] = flat[offset:offset + n].clone()
                offset += n
                unflatten_into(self._global[f], [self.params[i] for i in idx])

    # ---- checkpoints ---------------------------------------------------------------------
    def _config(self):
        """What a checkpoint must have been saved with to load here."""
        return {"sync_every": self.sync_every, "fragments": self.fragments, "overlap": self.overlap,
                "mix": self.mix, "outer_sync": self.outer_sync, "world_size": self.world_size}

    def state_dict(self):
        """DiLoCo's state (see the module docstring); averagings in flight are waited for and
        kept, to be applied at their step after a resume."""
        pending = {f: {"apply_at": p.apply_at, "average": p.get().clone()} for f, p in self._pending.items()}
        state = {"config": self._config(),
                 "inner_steps": self.inner_steps, "outer_steps": list(self.outer_steps),
                 "last_launch": list(self._last_launch),
                 "global": [g.clone() for g in self._global], "pending": pending,
                 "outer_optimizer": self.outer_optimizer.state_dict()}
        # "powersgd", "quantized_residuals": after the averagings in flight were waited for above.
        state.update(self.transport.state())
        return state

    def load_state_dict(self, state):
        """Restores state_dict() of a DiLoCo with the same configuration and model (ValueError
        naming what differs; nothing is changed then)."""
        config = self._config()
        if not isinstance(state, dict) or "config" not in state or "last_launch" not in state:
            raise ValueError("DiLoCo.load_state_dict: expected the dict DiLoCo.state_dict() returns")
        for key, value in config.items():
            if state["config"].get(key) != value:
                raise ValueError(f"DiLoCo.load_state_dict: the checkpoint has {key}={state['config'].get(key)!r}, "
                                 f"this DiLoCo {value!r}")
        for f, (g, mine) in enumerate(zip(state["global"], self._global)):
            if g.shape != mine.shape or g.dtype != mine.dtype:
                raise ValueError(f"DiLoCo.load_state_dict: fragment {f} has {g.numel()} {g.dtype} elements in the "
                                 f"checkpoint, {mine.numel()} {mine.dtype} here: a checkpoint of another model?")
        self.transport.check_state(state)
        self.outer_optimizer.load_state_dict(state["outer_optimizer"])
        self.transport.load_state(state)
        self._global = [g.clone() for g in state["global"]]
        self.inner_steps = int(state["inner_steps"])
        self.outer_steps = list(state["outer_steps"])
        self._last_launch = [int(t) for t in state["last_launch"]]
        self._pending = {}
        for f, p in state["pending"].items():
            done = _Pending(int(p["apply_at"]), None, None)
            done.result = p["average"].clone()
            self._pending[int(f)] = done
