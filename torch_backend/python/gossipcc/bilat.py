"""AD-PSGD (BilatGossipDataParallel) over gossipcc's asynchronous bilateral exchange.

Usage (every rank; `import gossipcc` and init_process_group(backend="gossipcc") first)::

    model = gossipcc.BilatGossipDataParallel(net)    # net: the bare model, CPU parameters
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in batches:          # ranks may run at different speeds and step counts
        loss = loss_fn(model(x), y); opt.zero_grad(); loss.backward(); opt.step()
    model.finish()                # every rank, once, at the end of training

BilatGossipDataParallel(module, process_group=None, broadcast_init=True, deterministic=False);
the class docstring states the exchange, deterministic mode and checkpoints (at finish(), or any
step with deterministic=True).
"""
import threading

import torch
import torch.distributed as dist

from . import _C
from ._wrapper_utils import average_buffers, broadcast_from_first, check_params, flatten, refuse_ddp, resolve_group
from ._wrapper_utils import unflatten_into


class BilatGossipDataParallel(torch.nn.Module):
    """AD-PSGD (Lian et al. 2018) with gossipcc's asynchronous bilateral exchange.

    Usage (every rank)::

        model = gossipcc.BilatGossipDataParallel(net)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in batches:          # ranks may run at different speeds and step counts
            loss = loss_fn(model(x), y); opt.zero_grad(); loss.backward(); opt.step()
        model.finish()                # every rank, once, at the end of training
        model.average_parameters()    # optional: exact average

    Odd ranks are active, even ranks passive. An active rank, at each training forward, sends its
    parameters to its next passive peer (bipartite-exponential neighbours in turn), receives
    that peer's and both sides set x <- (x + x_peer) / 2; it never waits for a global step.
    A passive rank serves requests in a background thread, on a side buffer S: before each
    request the thread adds the passive rank's optimizer updates made since the last one into
    S, and after it the change the averaging made to S is queued; the training thread adds the
    queued change to its parameters at its next forward. So a passive rank answers with its
    parameters as of its latest forward (at most one local step stale), and the pair average
    is exact on S: sum over ranks of the parameters changes only by optimizer updates. The
    thread starts at the passive rank's first training forward (or finish()), so that a
    checkpoint can be loaded first; active ranks asking before then wait for it.
    finish(): active ranks tell their peers they are done; passive ranks wait until every
    active peer is done, stop the thread and fold the last changes.

    deterministic=True: one fixed serialization of AD-PSGD, for reproducible runs and bit-exact
    checkpoints. Ranks move in lock step: at each training forward, the active ranks exchange
    in ascending rank order, each with its scheduled passive peer (the same peer schedule),
    and a passive rank answers on its current parameters, in the training thread (no side
    buffer, no staleness). A small all-reduce before each step checks that every rank is at
    the same step, and one after each active rank's exchange orders the answers, so every rank
    must take the same number of training forwards; the asynchrony (nobody waits for a
    straggler) is given up. Same mixing rule, same schedule, same sum conservation.

    Checkpoints. state_dict() returns {"module": the module's state dict, "adpsgd": {world_size,
    rank, active, deterministic, step (training forwards), exchanges (active: requests sent,
    the position in its peer schedule; passive: requests answered)}}; load_state_dict() restores
    it into a freshly constructed wrapper (same world size, rank, mode and model, before its
    first training forward), including the active rank's peer-schedule position. A checkpoint
    must be a consistent cut of the whole job, with no exchange in flight and no averaging
    change queued:
      - deterministic=True: every step boundary is one. Call state_dict() on every rank after the
        same step; a run restored from it continues bit for bit as the saved run did.
      - asynchronous (default): the quiescent point is finish() on every rank; state_dict()
        before it raises. The checkpoint holds the exact state at that point; a run restored
        from it (a new wrapper, on a new group if in the same job) continues from it with each
        active rank's peer schedule where it stopped, but which exchanges happen in which order
        afterwards depends on timing, as in any asynchronous run, so it is not bitwise
        reproducible. For a snapshot without stopping, model.module.state_dict() is
        approximate (a passive rank's queued averaging changes are not in it).
    """

    def __init__(self, module, process_group=None, broadcast_init=True, deterministic=False):
        super().__init__()
        refuse_ddp(module, "BilatGossipDataParallel", "gossipcc.BilatGossipDataParallel(model)")
        if not isinstance(deterministic, bool):
            raise ValueError(f"BilatGossipDataParallel: deterministic must be True or False, got {deterministic!r}")
        self.module = module
        self.deterministic = deterministic
        self.process_group, self._backend, self.rank, self.world_size = resolve_group(process_group)
        self._params = list(module.parameters())
        check_params(self._params, "BilatGossipDataParallel")
        if self._params[0].device.type != "cpu":
            raise ValueError("BilatGossipDataParallel: the asynchronous bilateral exchange needs CPU parameters")
        if broadcast_init:
            broadcast_from_first(self.process_group, self._params + list(module.buffers()))
        self.active = self.rank % 2 == 1
        self.exchanges = 0  # active: exchanges made; passive: requests answered
        self._steps = 0     # training exchanges (forwards) taken
        self._finished = False
        self._error = None
        self._thread = None
        # Passive ranks in asynchronous mode serve from a thread, started at the first forward.
        self._threaded = not self.active and self.world_size > 1 and not deterministic
        if self._threaded:
            self._lock = threading.Lock()
        # Deterministic mode: every active rank's passive peers, taken in turn (by step).
        self._schedule = {a: list(_C.async_bilateral_passive_peers(a, self.world_size))
                          for a in range(1, self.world_size, 2)} if deterministic else None

    def forward(self, *inputs, **kwargs):
        if self.training and not self._finished:
            self.exchange()
        return self.module(*inputs, **kwargs)

    def exchange(self):
        """The step's gossip (called by every training-mode forward)."""
        if self._finished:
            raise RuntimeError("BilatGossipDataParallel.exchange: finish() was called; no more exchanges")
        self._raise_thread_error()
        with torch.no_grad():
            if self.deterministic:
                self._lockstep_exchange()
            elif self.active:
                p = flatten(self._params)
                self._backend.async_bilateral_exchange([p]).wait()
                unflatten_into(p, self._params)
                self.exchanges += 1
            elif self._threaded:
                if self._thread is None:
                    self._start_serving()
                self._sync_with_server()
        self._steps += 1

    def _lockstep_exchange(self):
        """Deterministic mode: one step of the fixed serialization (see the class docstring)."""
        # Every rank at the same step, and every active rank's request counter on the group (which
        # picks its peer) where this wrapper's schedule expects it; else every rank raises.
        group_count = _serve_stats(self._backend)[0] if self.active else self.exchanges
        check = torch.tensor([float(self._steps), -float(self._steps), float(group_count != self.exchanges)],
                             dtype=torch.float64)
        dist.all_reduce(check, op=dist.ReduceOp.MAX, group=self.process_group)
        who = f"BilatGossipDataParallel(deterministic=True) on rank {self.rank} at step {self._steps}"
        if check[0].item() != -check[1].item():
            raise RuntimeError(f"{who}: ranks are at different steps (from {-check[1].item():.0f} to "
                               f"{check[0].item():.0f}); every rank must take the same number of training forwards "
                               f"(and restore from the same step). Nothing was exchanged")
        if check[2].item() != 0:
            mine = f" (here: {group_count} on the group, {self.exchanges} in this wrapper)" if self.active else ""
            raise RuntimeError(f"{who}: an active rank's exchange counter on the group differs from its wrapper's"
                               f"{mine}: a second wrapper on this group, or a checkpoint loaded without restoring the group's "
                               f"counter (one BilatGossipDataParallel per process group). Nothing was exchanged")
        for a, peers in self._schedule.items():  # ascending active ranks
            if self.rank == a or peers[self._steps % len(peers)] == self.rank:
                p = flatten(self._params)
                if self.active:
                    self._backend.async_bilateral_exchange([p]).wait()
                else:
                    self._backend.async_bilateral_serve([p], 1).wait()
                unflatten_into(p, self._params)
                self.exchanges += 1
            # The next active rank asks only after this exchange is done: a passive rank that
            # both ask answers them in rank order.
            dist.barrier(group=self.process_group)

    def _start_serving(self):
        with torch.no_grad():
            self._p_ref = flatten(self._params)            # parameters last written by this thread
            self._side = self._p_ref.clone()               # S, owned by the serve thread
            self._to_serve = torch.zeros_like(self._side)  # optimizer updates not yet in S
            self._to_main = torch.zeros_like(self._side)   # averaging changes not yet in params
        # The group's counter is cumulative (and a restored wrapper continues its own count).
        self._served_before = _serve_stats(self._backend)[0] - self.exchanges
        self._thread = threading.Thread(target=self._serve_loop, name="gossipcc-bilat-serve", daemon=True)
        self._thread.start()

    def _sync_with_server(self):
        p = flatten(self._params)
        with self._lock:
            self._to_serve.add_(p - self._p_ref)
            p.add_(self._to_main)
            self._to_main.zero_()
        unflatten_into(p, self._params)
        self._p_ref = p

    def _serve_loop(self):
        try:
            while True:
                with self._lock:
                    self._side.add_(self._to_serve)
                    self._to_serve.zero_()
                before = self._side.clone()
                work = self._backend.async_bilateral_serve([self._side], 1)
                work.wait()
                exchanges, all_finished = _serve_stats(self._backend)
                with self._lock:
                    self._to_main.add_(self._side - before)
                    self.exchanges = exchanges - self._served_before
                if all_finished:
                    return
        except BaseException as e:  # noqa: BLE001 - re-raised on the training thread
            self._error = e

    def _raise_thread_error(self):
        if self._error is not None:
            raise RuntimeError(f"BilatGossipDataParallel (rank {self.rank}): the serving thread failed: "
                               f"{self._error}") from self._error

    def finish(self):
        """Every rank, once, after its last training step (see the class docstring)."""
        if self._finished:
            return
        with torch.no_grad():
            if self.active:
                p = flatten(self._params)
                self._backend.async_bilateral_finish([p]).wait()
            elif self._threaded:
                if self._thread is None:
                    self._start_serving()
                self._thread.join()
                self._thread = None
                self._raise_thread_error()
                self._sync_with_server()
            elif self.world_size > 1:  # deterministic passive rank: only the "done" messages are left
                before = _serve_stats(self._backend)[0]
                p = flatten(self._params)
                self._backend.async_bilateral_serve([p], -1).wait()
                unflatten_into(p, self._params)
                self.exchanges += _serve_stats(self._backend)[0] - before
        self._finished = True

    def average_parameters(self):
        """Collective, after finish(): parameters (and floating buffers) <- exact average,
        bitwise equal on every rank."""
        if not self._finished:
            raise RuntimeError("BilatGossipDataParallel.average_parameters: call finish() first "
                               "(passive ranks are still serving exchanges)")
        with torch.no_grad():
            avg = flatten(self._params)
            dist.all_reduce(avg, group=self.process_group)
            avg.div_(self.world_size)
            broadcast_from_first(self.process_group, [avg])
            unflatten_into(avg, self._params)
            average_buffers(self.process_group, self.world_size, list(self.module.buffers()))

    # ----------------------------------------------------------------------------- state
    @property
    def step(self):
        """Training forwards (exchanges attempted: an active rank's requests, a passive rank's
        syncs with its serving thread) taken, counting those before a restored checkpoint."""
        return self._steps

    def adpsgd_state(self):
        return {"world_size": self.world_size, "rank": self.rank, "active": self.active,
                "deterministic": self.deterministic, "step": self._steps, "exchanges": self.exchanges}

    def state_dict(self, *args, **kwargs):
        """{"module": module state dict, "adpsgd": counters and the peer-schedule position} at a
        consistent cut (see "Checkpoints" in the class docstring): deterministic mode, after the
        same step on every rank; asynchronous mode, after finish() on every rank. Called with
        nn.Module's arguments (a parent module collecting its children's state) it behaves as
        nn.Module.state_dict."""
        if args or kwargs:
            return super().state_dict(*args, **kwargs)
        if not self.deterministic and not self._finished and self.world_size > 1:
            raise RuntimeError(
                "BilatGossipDataParallel.state_dict: asynchronous AD-PSGD has no consistent state while "
                "exchanges may be in flight and a passive rank's averaging changes are queued; call finish() "
                "on every rank first (the quiescent point), or construct with deterministic=True to save "
                "after any step (model.module.state_dict() is an approximate snapshot)")
        return {"module": self.module.state_dict(), "adpsgd": self.adpsgd_state()}

    def load_state_dict(self, state, strict=True):
        """Restores a state_dict() into a freshly constructed wrapper (before its first training
        forward): same world size, rank, mode and model, else ValueError naming what differs.
        Nothing is modified when it raises."""
        who = "BilatGossipDataParallel.load_state_dict"
        if not isinstance(state, dict) or not isinstance(state.get("adpsgd"), dict) or "module" not in state:
            keys = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise ValueError(f"{who}: expected the dict state_dict() returns, with 'module' and 'adpsgd'; got {keys}")
        if self._steps or self.exchanges or self._thread is not None or self._finished:
            raise RuntimeError(f"{who}: load into a freshly constructed wrapper, before its first training forward "
                               f"(this one has taken {self._steps} steps{', and finished' if self._finished else ''})")
        saved = state["adpsgd"]
        for key in ("world_size", "rank", "deterministic", "step", "exchanges"):
            if key not in saved:
                raise ValueError(f"{who}: the checkpoint's 'adpsgd' state has no {key!r} (keys: {sorted(saved)})")
        for key, mine in (("world_size", self.world_size), ("rank", self.rank), ("deterministic", self.deterministic)):
            if saved[key] != mine:
                raise ValueError(f"{who}: the checkpoint was saved with {key}={saved[key]!r}, this wrapper has "
                                 f"{key}={mine!r}")
        step, exchanges = saved["step"], saved["exchanges"]
        for key, value in (("step", step), ("exchanges", exchanges)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{who}: the checkpoint's {key} must be an integer >= 0, got {value!r}")
        if self.deterministic and self.active and exchanges != step:
            raise ValueError(f"{who}: a deterministic active rank exchanges once per step, but the checkpoint has "
                             f"step={step} and exchanges={exchanges}")
        _check_same_model(who, self.module.state_dict(), state["module"])
        self.module.load_state_dict(state["module"], strict=strict)
        if self.active and self.world_size > 1:
            self._backend.async_bilateral_restore(exchanges).wait()  # the next peer in its schedule
        self._steps, self.exchanges = step, exchanges


def _check_same_model(who, mine, saved):
    """ValueError naming the first difference between two modules' state dicts (keys, shapes, dtypes)."""
    if not isinstance(saved, dict):
        raise ValueError(f"{who}: the checkpoint's 'module' is a {type(saved).__name__}, not a state dict")
    missing = [k for k in mine if k not in saved]
    unexpected = [k for k in saved if k not in mine]
    if missing or unexpected:
        raise ValueError(f"{who}: the checkpoint is of a different model: missing keys {missing}, "
                         f"unexpected keys {unexpected}")
    for key, t in mine.items():
        s = saved[key]
        if not torch.is_tensor(s) or tuple(s.shape) != tuple(t.shape) or s.dtype != t.dtype:
            what = (f"a {type(s).__name__}" if not torch.is_tensor(s) else f"{tuple(s.shape)} {s.dtype}")
            raise ValueError(f"{who}: the checkpoint is of a different model: {key!r} is {what} in the checkpoint, "
                             f"{tuple(t.shape)} {t.dtype} in this model")


def _serve_stats(backend):
    """(requests answered so far, every active peer finished) of this passive rank."""
    stats = backend.async_bilateral_stats()
    if isinstance(stats, dict):
        return int(stats["exchanges"]), bool(stats["all_active_finished"])
    return int(stats.exchanges), bool(stats.all_active_finished)
