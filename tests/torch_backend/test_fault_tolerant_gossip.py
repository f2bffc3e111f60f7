"""GossipDataParallel(algorithm="sgp", fault_tolerant=True): a 4-rank job whose ranks are SIGKILLed
or SIGSTOPped mid-training goes on without them.

Each case: 4 ranks train a small classifier on their own data; a victim (never rank 0, which
hosts the TCPStore under env://) kills or stops itself at an agreed step; the survivors finish
the run, then run gossip-only rounds (no optimizer updates) so that push-sum reaches consensus.
Checked on every survivor: it saw a PeerLostWarning naming each dead rank; its membership is the
survivors; its loss kept falling after the death; its final model equals, to the consensus
tolerance, the survivors' average computed here independently of the wrapper's accounting
(rank 0's initial parameters plus the mean over survivors of the optimizer updates each made,
summed in float64 by the test); average_parameters() over the survivors gives the same value,
bitwise equal on every survivor. Printed: time from the death to each survivor's first step
completed after the recovery, and the final consensus spread (max |x_i - mean|).

No pass depends on wall-clock time: the bounds below are safety nets far above what a run takes.
GOSSIPCC_FT_TEST_FAULT_TOLERANT=0 runs the same cases with fault_tolerant=False, to see them fail.
"""
import datetime
import multiprocessing
import os
import pickle
import queue as queue_module
import signal
import tempfile
import time
import traceback
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

# Rank 0's store port: not bind(0)'s pick, which comes from the ephemeral range where another
# test's connection or listener may take it before rank 0 binds (seen with tests running side by
# side: a rank's store client reached some other process and got "Connection reset by peer").
from emulated_cluster import free_port

WORLD = 4
TIMEOUT_S = 3.0          # the group's timeout: a stalled rank is declared dead after it
# The clean-leave case has no death to detect: a timeout far above any stall of a loaded machine
# (a rank stalled past it would be dropped as dead, and the case would fail for that alone).
LEAVE_TIMEOUT_S = 20.0
STEPS = 60               # training steps (agreed step counter)
CONSENSUS_ROUNDS = 40    # gossip-only rounds after training
LR = 0.1
SAFETY_S = 300           # a whole case; expected well under a minute
TOLERANCE = 1e-4         # max |z_i - survivors' average| (float32 model, |params| ~ 1)
FAULT_TOLERANT = os.environ.get("GOSSIPCC_FT_TEST_FAULT_TOLERANT", "1") == "1"

TEACHER = torch.randn(20, 4, generator=torch.Generator().manual_seed(7))


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * (step % 8) + rank)
    x = torch.randn(32, 20, generator=g)
    return x, (x @ TEACHER).argmax(1)


def flat64(module):
    return torch.cat([p.detach().reshape(-1).double() for p in module.parameters()])


def worker(rank, init_method, deaths, barrier, out_dir, results, by_count=False):
    """deaths: {rank: (step, signal)}. by_count: the loop counts its own steps (as a user's
    `for step in range(STEPS)` does) instead of reading the agreed model.step."""
    try:
        import gossipcc
        barrier.wait()  # every rank has imported torch: the rendezvous below needs no slack
        dist.init_process_group("gossipcc", init_method=init_method, rank=rank, world_size=WORLD,
                                timeout=datetime.timedelta(seconds=TIMEOUT_S))
        torch.manual_seed(rank)  # different initial models: broadcast_init makes them rank 0's
        net = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
        model = gossipcc.GossipDataParallel(net, algorithm="sgp", fault_tolerant=FAULT_TOLERANT)
        init = flat64(net)
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        updates = torch.zeros_like(init)  # this rank's optimizer updates, summed in float64
        losses, completed = [], []        # (step, loss); (step, time, ranks dropped) per completed step
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for count in range(STEPS) if by_count else iter(lambda: model.step < STEPS, False):
                step = count if by_count else model.step
                if rank in deaths and deaths[rank][0] == step:
                    with open(os.path.join(out_dir, f"death_{rank}"), "w") as f:
                        f.write(repr(time.time()))
                    os.kill(os.getpid(), deaths[rank][1])  # SIGSTOP: frozen until the parent kills it
                x, y = batch(rank, step)
                loss = F.cross_entropy(model(x), y)  # this step's gossip round (or a recovery) first
                opt.zero_grad()
                loss.backward()
                before = flat64(net)
                opt.step()
                updates += flat64(net) - before
                losses.append((step, loss.item()))
                completed.append((model.step, time.time(), model.dead_ranks))
            for _ in range(CONSENSUS_ROUNDS):  # no optimizer updates: push-sum reaches consensus
                model.gossip_step()
        final = flat64(net)
        model.average_parameters()
        averaged = flat64(net)
        peer_lost = [str(w.message) for w in caught if issubclass(w.category, gossipcc.PeerLostWarning)]
        out = {"init": init, "updates": updates, "final": final, "averaged": averaged,
               "losses": losses, "completed": completed, "warnings": peer_lost,
               "alive": model.alive_ranks, "dead": model.dead_ranks, "step": model.step}
        # By value (plain pickle): through the queue a tensor would travel as a shared-memory
        # handle that the parent can open only while this process lives, and it may exit first
        # (seen once: "Connection reset by peer" in the parent's results.get).
        results.put((rank, pickle.dumps(out), None))
        del model
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - reported to the parent
        results.put((rank, None, traceback.format_exc()))


def run_case(deaths, store, by_count=False):
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    barrier = ctx.Barrier(WORLD)
    survivors = [r for r in range(WORLD) if r not in deaths]
    with tempfile.TemporaryDirectory(dir=os.environ.get("TEST_TMPDIR")) as tmp:
        if store == "tcp":  # env://: rank 0 hosts the TCPStore (and survives)
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
            init_method = "env://"
        else:
            init_method = "file://" + os.path.join(tmp, "init")
        procs = [ctx.Process(target=worker, args=(r, init_method, deaths, barrier, tmp, results, by_count))
                 for r in range(WORLD)]
        start = time.time()
        for p in procs:
            p.start()
        got, errors = {}, []
        try:
            while len(got) + len(errors) < len(survivors):
                rank, out, err = results.get(timeout=max(1.0, SAFETY_S - (time.time() - start)))
                if err:
                    errors.append(f"rank {rank}:\n{err}")
                else:
                    got[rank] = pickle.loads(out)
        except queue_module.Empty:
            errors.append(f"ranks {sorted(set(survivors) - set(got))} did not finish within {SAFETY_S} s")
        for r in survivors:
            procs[r].join(timeout=60)
        exit_codes = {r: procs[r].exitcode for r in survivors}
        for p in procs:  # the stopped (or stuck) ones
            if p.is_alive():
                p.kill()
            p.join()
        death_times = {}
        for r in deaths:
            path = os.path.join(tmp, f"death_{r}")
            if os.path.exists(path):
                with open(path) as f:
                    death_times[r] = float(f.read())
    assert not errors, "\n".join(errors)
    assert sorted(got) == survivors
    for r in survivors:
        assert exit_codes[r] == 0, f"rank {r} exited with {exit_codes[r]}"
    for r in deaths:
        assert procs[r].exitcode == -signal.SIGKILL, f"victim {r}: exit code {procs[r].exitcode}"
    return got, death_times


def check_and_report(got, death_times, deaths):
    survivors = sorted(got)
    first_death = min(death_times.values())
    for r in survivors:
        out = got[r]
        assert out["alive"] == survivors, f"rank {r}: alive {out['alive']}"
        assert out["dead"] == sorted(deaths), f"rank {r}: dead {out['dead']}"
        assert out["step"] == STEPS + CONSENSUS_ROUNDS, f"rank {r}: step {out['step']}"
        for d in deaths:
            named = [w for w in out["warnings"] if f"rank {d} died or stalled" in w]
            assert len(named) == 1, f"rank {r}: warnings {out['warnings']}"
        # Loss kept falling: the last 5 steps against the 5 before the first death.
        death_step = min(s for s, _ in deaths.values())
        before = [l for s, l in out["losses"] if death_step - 5 <= s < death_step]
        last = [l for _, l in out["losses"][-5:]]
        print(f"rank {r}: loss {out['losses'][0][1]:.4f} at the start, {sum(before) / len(before):.4f} before "
              f"the death, {sum(last) / len(last):.4f} at the end")
        assert sum(last) / len(last) < sum(before) / len(before), f"rank {r}: {out['losses']}"
        # Death -> the first training step completed with the dead rank dropped (the step whose
        # gossip recovered and settled, then its forward, backward and optimizer step).
        for d, t in sorted(death_times.items()):
            after = [(s, tc) for s, tc, dropped in out["completed"] if d in dropped]
            print(f"rank {r}: first step completed {after[0][1] - t:.2f} s after rank {d} was "
                  f"{'killed' if deaths[d][1] == signal.SIGKILL else 'stopped'} at step {deaths[d][0]} "
                  f"(agreed step {after[0][0]} after it)")
    # Independent reference: every rank started from rank 0's parameters; the survivors' average
    # is that plus the mean of the survivors' own optimizer updates.
    init = got[survivors[0]]["init"]
    for r in survivors:
        assert torch.equal(got[r]["init"], init)
    expected = init + sum(got[r]["updates"] for r in survivors) / len(survivors)
    finals = torch.stack([got[r]["final"] for r in survivors])
    spread = (finals - finals.mean(0)).abs().max().item()
    error = (finals - expected).abs().max().item()
    # With the dead ranks' updates, for contrast (what the survivors must NOT converge to).
    print(f"final consensus spread max|x_i - mean| = {spread:.3g}; max|x_i - survivors' average| = {error:.3g} "
          f"(|average| max {expected.abs().max().item():.3g}, mean update norm "
          f"{sum(got[r]['updates'].norm() for r in survivors).item() / len(survivors):.3g})")
    assert error < TOLERANCE, f"survivors' models are {error} from the survivors' average"
    averaged = got[survivors[0]]["averaged"]
    for r in survivors:
        assert torch.equal(got[r]["averaged"], averaged), f"rank {r}: average_parameters differs"
    assert (averaged - expected).abs().max().item() < TOLERANCE


@pytest.mark.parametrize("case", ["kill", "kill_twice", "stop", "kill_loop_by_count"])
def test_survivors_train_on_and_converge_to_their_average(case):
    """kill_loop_by_count: the loop counts its own steps (for step in range(STEPS)) and every
    survivor makes exactly STEPS + CONSENSUS_ROUNDS gossip steps: after a recovery in which some
    survivors had completed one round more than others, their calls must stay paired (step ==
    calls on every survivor; no survivor finishes a call early and is then dropped by the others)."""
    by_count = case == "kill_loop_by_count"
    if case in ("kill", "kill_loop_by_count"):
        deaths, store = {2: (15, signal.SIGKILL)}, "tcp"
    elif case == "kill_twice":
        deaths, store = {2: (15, signal.SIGKILL), 1: (35, signal.SIGKILL)}, "tcp"
    else:
        deaths, store = {3: (15, signal.SIGSTOP)}, "file"
    got, death_times = run_case(deaths, store, by_count)
    check_and_report(got, death_times, deaths)


def test_bad_options_are_refused():
    """fault_tolerant=True with another algorithm, bad dtypes, bad graphs: ValueError at construction."""
    from launcher import run_ranks
    run_ranks(_bad_options, 2)


def _bad_options(rank, world_size):
    import gossipcc
    from launcher import init_method
    dist.init_process_group("gossipcc", init_method=init_method(), rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=30))
    net = torch.nn.Linear(4, 2)
    for kwargs, text in [(dict(algorithm="osgp", synch_freq=1), "needs algorithm=\"sgp\""),
                         (dict(algorithm="dpsgd"), "needs algorithm=\"sgp\""),
                         (dict(fault_tolerant="yes"), "True or False")]:
        with pytest.raises(ValueError, match=text):
            gossipcc.GossipDataParallel(net, fault_tolerant=kwargs.pop("fault_tolerant", True), **kwargs)
    with pytest.raises(ValueError, match="CPU float32 or float64"):
        gossipcc.GossipDataParallel(torch.nn.Linear(4, 2).half(), fault_tolerant=True)
    with pytest.raises(ValueError, match="edges"):  # fits 2 ranks, not the 1 a death leaves
        gossipcc.GossipDataParallel(net, graph="edges:0>1,1>0", fault_tolerant=True)
    model = gossipcc.GossipDataParallel(net, fault_tolerant=True)
    assert model.alive_ranks == [0, 1] and model.dead_ranks == [] and model.step == 0
    model(torch.randn(3, 4))
    assert model.step == 1
    with pytest.raises(ValueError, match="fault_tolerant=True"):
        model.load_state_dict(model.state_dict())
    # The binding's own checks, at the call on this rank alone.
    pg = gossipcc.get_backend_object()
    with pytest.raises(ValueError, match="state is None"):
        pg.fault_tolerant_push_sum_round([torch.zeros(4)], None)
    with pytest.raises(ValueError, match="float32 or float64 only"):
        pg.fault_tolerant_push_sum_round([torch.zeros(4, dtype=torch.float16)], model._ft)
    dist.destroy_process_group()


LEAVE_TRAIN, LEAVE_MIX = 25, 20   # per phase: training steps, then gossip-only rounds


def test_a_clean_leave_is_not_a_death():
    """Ranks 2 and 3 end on purpose at consensus (rank 3 by leave(), rank 2 by deleting its
    wrapper); ranks 0 and 1 train on and mix. Checked on the survivors: no PeerLostWarning, the
    leavers listed in left_ranks (not dead_ranks), equal alive sets, and the final models equal
    what push-sum guarantees when nothing is undone: the 4-rank consensus at the leave (rank 0's
    initial parameters plus the mean of the 4 ranks' first-phase updates) plus the survivors'
    second-phase updates summed and divided by their sum of weights (sum x / sum w), computed
    here from the updates each rank recorded. Were the leavers treated as dead, the survivors
    would undo their exchanges with them and converge to their own first-phase mean instead."""
    from launcher import run_ranks
    out = run_ranks(_leave_worker, WORLD, timeout=SAFETY_S)
    init = out[0]["init"]
    consensus = init + sum(o["updates1"] for o in out) / WORLD
    for r in (2, 3):
        assert torch.allclose(out[r]["at_leave"], consensus, atol=TOLERANCE, rtol=0), f"rank {r} not at consensus"
        assert "left the group" in out[r]["after_leave_error"], out[r]["after_leave_error"]
    survivors = [0, 1]
    weights = sum(out[r]["weight"] for r in survivors)
    expected = consensus + sum(out[r]["updates2"] for r in survivors) / weights
    for r in survivors:
        o = out[r]
        assert o["warnings"] == [], f"rank {r}: {o['warnings']}"
        assert (o["alive"], o["left"], o["dead"]) == (survivors, [2, 3], []), f"rank {r}: {o}"
        assert o["step"] == 2 * (LEAVE_TRAIN + LEAVE_MIX), f"rank {r}: step {o['step']}"
        error = (o["final"] - expected).abs().max().item()
        print(f"rank {r}: max|x - expected| = {error:.3g} (sum of weights {weights:.6f}); "
              f"had the leavers been undone: {(o['final'] - init - sum(out[q]['updates1'] for q in survivors) / 2 - sum(out[q]['updates2'] for q in survivors) / weights).abs().max().item():.3g} away")
        assert error < TOLERANCE, f"rank {r}: {error} from the survivors' sum x / sum w"


def _leave_worker(rank, world_size):
    import gc
    import gossipcc
    from launcher import init_method
    dist.init_process_group("gossipcc", init_method=init_method(), rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=LEAVE_TIMEOUT_S))
    torch.manual_seed(rank)
    net = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    model = gossipcc.GossipDataParallel(net, algorithm="sgp", fault_tolerant=True)
    init = flat64(net)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    result = {"init": init}

    def train(steps):
        updates = torch.zeros_like(init)
        for step in range(steps):
            x, y = batch(rank, step)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            before = flat64(net)
            opt.step()
            updates += flat64(net) - before
        for _ in range(LEAVE_MIX):
            model.gossip_step()
        return updates

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result["updates1"] = train(LEAVE_TRAIN)
        if rank >= 2:
            result["at_leave"] = flat64(net)
            ft = model._ft
            if rank == 3:
                model.leave()
                try:
                    model(torch.randn(2, 20))
                    result["after_leave_error"] = "no error"
                except ValueError as e:
                    result["after_leave_error"] = str(e)
            else:
                del model, opt
                gc.collect()
                result["after_leave_error"] = "left the group" if ft.has_left else "wrapper deleted, not left"
            return result
        result["updates2"] = train(LEAVE_TRAIN)
    result.update(final=flat64(net), weight=model.ps_weight, alive=model.alive_ranks, left=model.left_ranks,
                  dead=model.dead_ranks, step=model.step,
                  warnings=[str(w.message) for w in caught if issubclass(w.category, gossipcc.PeerLostWarning)])
    return result
