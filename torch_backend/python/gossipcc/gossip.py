"""The gossip data-parallel wrapper: SGP, OSGP, D-PSGD (GossipDataParallel), over gossipcc's
native gossip collectives.

Usage (every rank; `import gossipcc` and init_process_group(backend="gossipcc") first)::

    model = gossipcc.GossipDataParallel(net, algorithm="sgp")      # or "osgp", "dpsgd"
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in batches:
        loss = loss_fn(model(x), y)      # a training-mode forward runs this step's gossip first
        opt.zero_grad(); loss.backward(); opt.step()
    model.average_parameters()           # exact average (evaluation, end of training)

No gradient is all-reduced: each rank takes optimizer steps on its own data and the gossip
mixes parameters with a few peers per step. The gossip round runs at the start of every
training-mode forward (one forward per optimizer step; wrap extra forwards, e.g. gradient
accumulation, in `with model.no_gossip():`); eval-mode forwards do not gossip.

GossipDataParallel(module, process_group=None, graph=None, peers_per_step=1,
                   algorithm="sgp", synch_freq=0, broadcast_init=True, fault_tolerant=False)
  algorithm  "sgp":   push-sum (Assran et al. 2019). Each rank keeps the push-sum numerator x
                      and weight w; the module's parameters hold the de-biased z = x / w for the
                      forward pass. The optimizer's update of z is added to x (x <- x - lr*g,
                      the paper's update), then one synchronous push-sum round mixes (x, w).
             "osgp":  overlapped push-sum: the round starts at one forward and runs in the
                      background; it is folded in max(1, synch_freq) steps later (the default
                      synch_freq=0 means 1, the next step). Folding adds (round result - snapshot sent) to x, so optimizer updates
                      made meanwhile are kept and sum(x), sum(w) are conserved with the round in
                      flight (the local x and w keep the full snapshot until the fold).
             "dpsgd": symmetric gossip with Metropolis weights (Lian et al. 2017), no weight.
             algorithm and graph ignore case ("SGP" is "sgp", "Ring" is "ring").
  graph      peer graph spec (docs/gossip.md): default "exponential:peers=<peers_per_step>" for
             SGP/OSGP and "ring" for D-PSGD (which needs a symmetric graph, e.g. "ring",
             "hypercube", "complete"); a graph that is directed at
             some step is refused at construction, on every rank.
  broadcast_init  start every rank from rank 0's parameters and buffers (as DDP does).
  module     the bare model: a DistributedDataParallel (or a model containing one) is refused
             on every rank (DDP would all-reduce every gradient and defeat the gossip).
  fault_tolerant  SGP only: push-sum that survives dead or stalled peers (the C++
             FaultTolerantPushSum, docs/reliability.md "Dropping a dead peer"). When a rank dies,
             the survivors agree on who is left (within the group's timeout plus a join window
             of twice that), settle the push-sum mass exactly among themselves and go on; each
             survivor gets a PeerLostWarning naming the dead rank. The de-biased models then
             converge to the survivors' average (the dead rank's own share, its initial value
             and its updates, is lost). Every survivor's `.step` counts its own gossip steps, so
             a loop may count its steps or read `.step`; read `.alive_ranks`. A rank that ends
             on purpose (leave(), or its wrapper is deleted, or its interpreter exits) marks
             itself as left: the others drop it as departed (`.left_ranks`, no warning) and keep
             the mass they hold, so they converge to their own weighted average (at consensus,
             they stay where they were). The group's store must survive (a FileStore, or a
             TCPStore whose host, rank 0 under env://, does not die). CPU float32/float64
             parameters.

AD-PSGD (BilatGossipDataParallel) is in bilat.py.

Buffers (BatchNorm running statistics) are not gossiped: each rank's follow its own data.
average_parameters() averages floating-point buffers exactly and takes rank 0's other buffers.
All parameters must share one dtype and device (they travel as one message per round); move
the model to its device before wrapping it. state_dict()/load_state_dict() carry the gossip
state (step, push-sum weight and numerator; an OSGP round in flight is folded first). Call
flush() or average_parameters() before destroying the process group so that no OSGP round is
left in flight.
"""
import contextlib
import warnings
import weakref

import torch
import torch.distributed as dist

from . import _C
from ._wrapper_utils import (average_buffers, broadcast_from_first, check_params, flatten, refuse_ddp,
                             resolve_group, unflatten_into)

ALGORITHMS = ("sgp", "osgp", "dpsgd")


class PeerLostWarning(RuntimeWarning):
    """A fault-tolerant GossipDataParallel dropped a dead or stalled rank and trains on without it."""


def _leave_quietly(ft):
    """weakref.finalize of a fault-tolerant wrapper: a clean leave; nothing to report to at exit."""
    try:
        ft.leave()
    except Exception:  # noqa: BLE001 - e.g. the store's host has already exited
        pass


def _check_undirected(graph, world_size):
    """ValueError if `graph` (a valid spec) is directed at some step of its period (checked up to
    4096 steps with the peer graph's own PeerGraph::IsSymmetricAt, which the symmetric gossip
    round checks at each step). The same answer on every rank: it depends on the spec and the
    world size only."""
    step = _C.peer_graph_directed_step(graph, world_size, 4096)
    if step is None:
        return
    out = [set(_C.peer_graph_out_peers(graph, world_size, r, step)) for r in range(world_size)]
    i, j = next((i, j) for i in range(world_size) for j in out[i] if j != i and i not in out[j])
    raise ValueError(f"GossipDataParallel: algorithm=\"dpsgd\" needs a symmetric (undirected) graph; "
                     f"graph {graph!r} on {world_size} ranks is directed at step {step} (rank {i} "
                     f"sends to {j}, not {j} to {i}). Use e.g. graph=\"ring\" (the default), "
                     "\"hypercube\" or \"complete\", or algorithm=\"sgp\", which works on directed "
                     "graphs")


def _graph_spec(algorithm, graph, peers_per_step):
    if not isinstance(peers_per_step, int) or peers_per_step < 1:
        raise ValueError(f"GossipDataParallel: peers_per_step must be an integer >= 1, got {peers_per_step!r}")
    if graph is None:
        graph = "ring" if algorithm == "dpsgd" else "exponential"
    if not isinstance(graph, str) or not graph.strip():
        raise ValueError(f"GossipDataParallel: graph must be a spec string such as \"exponential\", got {graph!r}")
    graph = graph.strip().lower()  # specs ignore case; kept in lower case (.graph)
    if graph == "exponential":
        return f"exponential:peers={peers_per_step}"
    if peers_per_step != 1:
        raise ValueError(f"GossipDataParallel: peers_per_step={peers_per_step} applies to graph=\"exponential\" only; "
                         f"graph {graph!r} fixes its own peers")
    return graph


class GossipDataParallel(torch.nn.Module):
    """SGP / OSGP / D-PSGD data parallelism (see the module docstring)."""

    def __init__(self, module, process_group=None, graph=None, peers_per_step=1, algorithm="sgp",
                 synch_freq=0, broadcast_init=True, fault_tolerant=False):
        super().__init__()
        refuse_ddp(module, "GossipDataParallel", "gossipcc.GossipDataParallel(model, algorithm=...)")
        algorithm = str(algorithm).lower()
        if algorithm not in ALGORITHMS:
            raise ValueError(f"GossipDataParallel: algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
        if not isinstance(fault_tolerant, bool):
            raise ValueError(f"GossipDataParallel: fault_tolerant must be True or False, got {fault_tolerant!r}")
        if fault_tolerant and algorithm != "sgp":
            raise ValueError(f"GossipDataParallel: fault_tolerant=True needs algorithm=\"sgp\" (synchronous "
                             f"push-sum), got {algorithm!r}")
        if not isinstance(synch_freq, int) or synch_freq < 0:
            raise ValueError(f"GossipDataParallel: synch_freq must be an integer >= 0, got {synch_freq!r}")
        if algorithm != "osgp" and synch_freq != 0:
            raise ValueError(f"GossipDataParallel: synch_freq (staleness) applies to algorithm=\"osgp\" only, "
                             f"got synch_freq={synch_freq} with {algorithm!r}")
        self.module = module
        self.algorithm = algorithm
        self.graph = _graph_spec(algorithm, graph, peers_per_step)
        # Steps between starting a round and folding it in: 0 = synchronous.
        self.staleness = max(1, synch_freq) if algorithm == "osgp" else 0
        self.process_group, self._backend, self.rank, self.world_size = resolve_group(process_group)
        _C.peer_graph_info(self.graph, self.world_size)  # InvalidArgumentError (a ValueError) naming the spec
        if algorithm == "dpsgd":
            _check_undirected(self.graph, self.world_size)
        self._params = list(module.parameters())
        check_params(self._params, "GossipDataParallel")
        self.fault_tolerant = fault_tolerant
        if fault_tolerant and (self._params[0].device.type != "cpu" or
                               self._params[0].dtype not in (torch.float32, torch.float64)):
            raise ValueError(f"GossipDataParallel: fault_tolerant=True needs CPU float32 or float64 parameters, "
                             f"got {self._params[0].dtype} on {self._params[0].device}")
        if broadcast_init:
            broadcast_from_first(self.process_group, self._params + list(module.buffers()))
        # Fault-tolerant push-sum state (C++; owns its communicator); None otherwise.
        self._ft = self._backend.fault_tolerant_push_sum(self.graph) if fault_tolerant else None
        self._ft_epoch = 0
        self._ft_dead_warned = set()
        if self._ft is not None:
            # The end of this wrapper (deleted, or the interpreter exits) is a clean leave.
            weakref.finalize(self, _leave_quietly, self._ft)

        self._gossip_on_forward = True
        self._local_step = 0  # gossip steps so far
        self._rounds = 0      # gossip rounds started; round r uses the graph at step r
        self._pushsum = algorithm in ("sgp", "osgp")
        # Push-sum state: numerator x (flat), weight w (float64 CPU, as the native round wants),
        # and z_ref, the de-biased parameters last written into the module (so that the
        # optimizer's update since then is params - z_ref).
        self._x = flatten(self._params) if self._pushsum else None
        self._z_ref = self._x.clone() if self._pushsum else None
        self._w = torch.ones(1, dtype=torch.float64)
        self._pending = None  # OSGP round in flight: (work, sent snapshot, result buffer, weight snapshot, weight buffer, started)

    # ----------------------------------------------------------------------------- training
    def forward(self, *inputs, **kwargs):
        if self.training and self._gossip_on_forward:
            self.gossip_step()
        return self.module(*inputs, **kwargs)

    @contextlib.contextmanager
    def no_gossip(self):
        """Forwards inside this context do not gossip (e.g. the extra micro-batches of gradient
        accumulation: gossip once per optimizer step)."""
        previous = self._gossip_on_forward
        self._gossip_on_forward = False
        try:
            yield
        finally:
            self._gossip_on_forward = previous

    def gossip_step(self):
        """This step's gossip (called by every training-mode forward; call it directly only if
        you do not run the forward through the wrapper). Every rank must call it once per step."""
        with torch.no_grad():
            if self._pushsum:
                self._pushsum_step()
            else:
                p = flatten(self._params)
                self._backend.symmetric_gossip_round([p], self._rounds, self.graph).wait()
                unflatten_into(p, self._params)
                self._rounds += 1
        self._local_step += 1

    def _absorb_optimizer_update(self):
        """x <- x + (params - z_ref): the optimizer's update of the de-biased parameters goes into
        the numerator unscaled (SGP's x <- x - lr * grad f(z))."""
        p = flatten(self._params)
        if self._w.item() == 1.0 and self._pending is None:
            self._x.copy_(p)  # z_ref == x exactly when w == 1: x + (p - x) is p, without rounding
        else:
            self._x.add_(p - self._z_ref)
        self._z_ref = p

    def _write_debiased(self):
        w = self._w.item()
        z = self._x.clone() if w == 1.0 else self._x / w
        unflatten_into(z, self._params)
        self._z_ref = z

    def _pushsum_step(self):
        if self._ft is not None and self._ft.has_left:
            raise ValueError(f"GossipDataParallel on rank {self.rank}: this rank left the group (leave()) at step "
                             f"{self._ft.step}; it takes no more gossip steps")
        self._absorb_optimizer_update()
        if self._ft is not None:
            self._backend.fault_tolerant_push_sum_round([self._x], self._ft).wait()
            self._w.fill_(self._ft.weight)
            self._rounds = self._ft.step
            if self._ft.epoch != self._ft_epoch:
                self._warn_recovery()
        elif self.staleness == 0:
            self._backend.push_sum_round([self._x], self._w, self._rounds, self.graph).wait()
            self._rounds += 1
        else:
            if self._pending is not None and self._local_step - self._pending[5] >= self.staleness:
                self._fold()
            if self._pending is None:
                self._start_round()
        self._write_debiased()

    def _warn_recovery(self):
        report = self._ft.last_recovery
        for dead in report["dead"]:
            if dead in self._ft_dead_warned:
                continue
            warnings.warn(f"gossipcc GossipDataParallel on rank {self.rank}: rank {dead} died or stalled and "
                          f"was dropped (recovery {report['epoch']}, at step {report['step']}); training goes on "
                          f"with ranks {report['members']}, whose models converge to their own average "
                          f"(rank {dead}'s share of the model is lost)", PeerLostWarning, stacklevel=4)
            self._ft_dead_warned.add(dead)
        self._ft_epoch = self._ft.epoch

    def leave(self):
        """fault_tolerant=True: this rank stops gossiping on purpose. It marks itself as left in
        the group's store and closes its connections; the others drop it as departed at their
        next round with it (`left_ranks`, no PeerLostWarning) and keep the mass they hold, so
        they converge to their own weighted average (nothing of what they exchanged with it is
        undone, as it is for a dead rank). This rank's parameters keep its de-biased model;
        later training forwards raise ValueError. Also done when the wrapper is deleted or the
        interpreter exits. Idempotent."""
        if self._ft is None:
            raise ValueError("GossipDataParallel.leave: needs fault_tolerant=True (without it every rank must "
                             "take every step)")
        with torch.no_grad():
            self._absorb_optimizer_update()
            self._write_debiased()
        self._ft.leave()

    def _start_round(self):
        sent = self._x.clone()
        buffer = self._x.clone()
        w_sent = self._w.clone()
        w_buffer = self._w.clone()
        work = self._backend.push_sum_round([buffer], w_buffer, self._rounds, self.graph)
        self._rounds += 1
        self._pending = (work, sent, buffer, w_sent, w_buffer, self._local_step)

    def _fold(self):
        """Waits for the round in flight and adds (result - snapshot) to x and w."""
        work, sent, buffer, w_sent, w_buffer, _ = self._pending
        self._pending = None
        work.wait()
        self._x.add_(buffer - sent)
        self._w.add_(w_buffer - w_sent)

    def flush(self):
        """Folds the OSGP round in flight now (no-op otherwise) and rewrites the de-biased
        parameters. Local: waits only for messages peers have already sent."""
        with torch.no_grad():
            if self._pushsum:
                self._absorb_optimizer_update()
                if self._pending is not None:
                    self._fold()
                self._write_debiased()

    sync_comms = flush  # the SGP reference's name

    def average_parameters(self):
        """Collective: every rank's parameters <- the exact average (push-sum: sum x / sum w, the
        value push-sum converges to), bitwise equal on every rank; push-sum weight reset to 1.
        Floating-point buffers are averaged too. For evaluation and the end of training.

        fault_tolerant=True: over the surviving ranks only, and the push-sum state (x, w) is left
        as it is (so that the mass records stay exact): the parameters hold the average until the
        next training forward rewrites x / w. Other buffers keep their own values. If a rank
        dies during it, it raises; the next training step recovers."""
        if self._ft is not None:
            with torch.no_grad():
                self._absorb_optimizer_update()
                avg = torch.empty_like(self._x)
                self._ft.average(self._backend, [self._x], avg)
                unflatten_into(avg, self._params)
                self._z_ref = avg
                floating = [b for b in self.module.buffers()
                            if b.dtype in (torch.float32, torch.float64) and b.device.type == "cpu"]
                if floating:
                    flat = [b.detach().reshape(-1).clone() for b in floating]
                    self._ft.mean_over_members(self._backend, flat)
                    for b, f in zip(floating, flat):
                        b.copy_(f.view_as(b))
            return
        with torch.no_grad():
            if self._pushsum:
                self.flush()
                x = self._x.clone()
                w = self._w.clone()
                dist.all_reduce(x, group=self.process_group)
                dist.all_reduce(w, group=self.process_group)
                avg = x / w.item()
            else:
                avg = flatten(self._params)
                dist.all_reduce(avg, group=self.process_group)
                avg.div_(self.world_size)
            broadcast_from_first(self.process_group, [avg])
            unflatten_into(avg, self._params)
            if self._pushsum:
                self._x.copy_(avg)
                self._z_ref = avg.clone()
                self._w.fill_(1.0)
            average_buffers(self.process_group, self.world_size, list(self.module.buffers()))

    # ----------------------------------------------------------------------------- state
    @property
    def ps_weight(self):
        """This rank's push-sum weight (1.0 for D-PSGD). With an OSGP round in flight it is the
        weight before that round's keep-share, matching the numerator's accounting, so the
        weights of all ranks always sum to the world size."""
        return self._w.item()

    @property
    def step(self):
        """Training forwards (gossip steps) taken. fault_tolerant=True: the fault-tolerant
        state's step counter, one per gossip step (settling rounds after a recovery are not
        steps), equal on every survivor that took the same steps."""
        if self._ft is not None:
            return self._ft.step
        return self._local_step

    @property
    def alive_ranks(self):
        """Ranks (of the process group) still training: all of them unless fault_tolerant=True
        dropped some."""
        if self._ft is not None:
            return list(self._ft.members)
        return list(range(self.world_size))

    @property
    def dead_ranks(self):
        """Ranks dropped by fault_tolerant=True as dead or stalled so far (empty otherwise)."""
        return list(self._ft.dead) if self._ft is not None else []

    @property
    def left_ranks(self):
        """Ranks that left on purpose (leave(), or their wrapper ended) and were dropped as
        departed, fault_tolerant=True (empty otherwise)."""
        return list(self._ft.departed) if self._ft is not None else []

    @property
    def in_flight(self):
        return self._pending is not None

    def gossip_state(self):
        state = {"algorithm": self.algorithm, "graph": self.graph, "staleness": self.staleness,
                 "step": self._local_step, "rounds": self._rounds, "ps_weight": self._w.item(),
                 "numerator": None if self._x is None else self._x.clone()}
        if self._ft is not None:
            state["fault_tolerant"] = {"step": self._ft.step, "epoch": self._ft.epoch,
                                       "alive_ranks": list(self._ft.members), "dead_ranks": list(self._ft.dead)}
        return state

    def state_dict(self, *args, finish_gossip=True, **kwargs):
        """{"module": module state dict (de-biased parameters), "gossip": step counters, push-sum
        weight and numerator}. Folds an OSGP round in flight first (its messages cannot be
        saved), so every rank should call it at the same step. Called with nn.Module's
        arguments (destination, prefix, keep_vars: a parent module collecting its children's
        state) it behaves as nn.Module.state_dict."""
        if args or kwargs:
            return super().state_dict(*args, **kwargs)
        if not finish_gossip and self._pending is not None:
            raise RuntimeError("GossipDataParallel.state_dict: a gossip round is in flight; "
                               "finish_gossip=False would lose it")
        self.flush()
        return {"module": self.module.state_dict(), "gossip": self.gossip_state()}

    def load_state_dict(self, state):
        """Restores a state_dict() (same algorithm, graph and model)."""
        if self._ft is not None:
            raise ValueError("GossipDataParallel.load_state_dict: not supported with fault_tolerant=True (the "
                             "push-sum mass records that make a recovery exact cannot be restored); load "
                             "state['module'] into a fresh wrapper instead")
        gossip = state["gossip"]
        for key in ("algorithm", "graph", "staleness"):
            if gossip[key] != getattr(self, key):
                raise ValueError(f"GossipDataParallel.load_state_dict: checkpoint has {key}={gossip[key]!r}, "
                                 f"this wrapper {key}={getattr(self, key)!r}")
        if self._pending is not None:
            self._fold()  # do not leave a transfer writing into buffers we drop
        self.module.load_state_dict(state["module"])
        self._local_step = int(gossip["step"])
        self._rounds = int(gossip["rounds"])
        self._w.fill_(float(gossip["ps_weight"]))
        if self._pushsum:
            numerator = gossip["numerator"]
            if numerator.shape != self._x.shape:
                raise ValueError(f"GossipDataParallel.load_state_dict: numerator has {numerator.numel()} elements, "
                                 f"the model {self._x.numel()}")
            self._x.copy_(numerator)
            self._z_ref = flatten(self._params)
