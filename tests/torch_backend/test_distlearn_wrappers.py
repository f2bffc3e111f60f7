"""AllReduceEA (elastic averaging) and AllReduceSGD (uneven step counts) on 4 CPU ranks:
training lowers the loss; EASGD conserves sum(x) + center and keeps the centers identical,
and every rank's parameters and the center match torch-distlearn's AllReduceEA computed here
(tau = 1 and 3, a checkpoint resumed mid-period); the uneven run ends bitwise equal;
checkpoints resume bit for bit."""
import copy

import pytest
import torch
import torch.distributed as dist

from launcher import run_ranks
from wrapper_common import batch, flat_params, gather, init, loss_drop, make_model

WORLD = 4


def step(model, opt, rank, i):
    x, y = batch(rank, i)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.item()


def center_flat(ea):
    return ea.state_dict()["center"]  # float64, exact


def easgd(rank, world_size):
    import gossipcc

    def make(seed):
        model = make_model(seed)
        ea = gossipcc.AllReduceEA(model, tau=4, alpha=0.3)
        return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), ea

    model, opt, ea = make(rank)  # different seeds: initialize() must give everyone rank 0's
    starts = gather(flat_params(model))
    assert all(torch.equal(s, starts[0]) for s in starts)
    assert torch.equal(center_flat(ea), starts[0].double())
    losses, averaged = [], 0
    for i in range(40):
        losses.append(step(model, opt, rank, i))
        before = sum(gather(flat_params(model).double())) + center_flat(ea)
        if ea.step():
            averaged += 1
            after = sum(gather(flat_params(model).double())) + center_flat(ea)
            assert torch.allclose(after, before, rtol=0, atol=1e-5), (after - before).abs().max()
            centers = gather(center_flat(ea))
            assert all(torch.equal(c, centers[0]) for c in centers)
    assert averaged == 10
    assert loss_drop(losses) < 0.5, losses

    saved = copy.deepcopy({"model": model.state_dict(), "opt": opt.state_dict(), "ea": ea.state_dict()})
    for i in range(40, 50):
        step(model, opt, rank, i)
        ea.step()
    continued = flat_params(model)
    fresh, fresh_opt, fresh_ea = make(7)
    fresh.load_state_dict(saved["model"])
    fresh_opt.load_state_dict(saved["opt"])
    fresh_ea.load_state_dict(saved["ea"])
    for i in range(40, 50):
        step(fresh, fresh_opt, rank, i)
        fresh_ea.step()
    assert torch.equal(flat_params(fresh), continued)
    assert torch.equal(center_flat(fresh_ea), center_flat(ea))

    with pytest.raises(Exception, match="tau"):
        gossipcc.AllReduceEA(make_model(0), tau=0, alpha=0.5)
    return losses


EPS32 = 2.0 ** -24  # float32 unit roundoff


def reference_average(xs, center, alpha):
    """torch-distlearn's AllReduceEA averaging (lua/AllReduceEA.lua), computed here from every
    rank's parameters xs (float32) and the center (float64, as gossipcc holds it):
    d_r = alpha (x_r - c) rounded to x's dtype; x_r <- x_r - d_r; c <- c + sum_r d_r (summed
    exactly here). Also returns (n + 1) u sum_r |d_r| elementwise: a bound on what gossipcc's
    center may gain over this one's in the averaging besides the gap it had (one rounding of
    each d_r in each, and the float32 all-reduce's rounding of sum_r d_r in whatever order)."""
    ds = [((x.double() - center) * alpha).to(x.dtype) for x in xs]
    rounding = (len(xs) + 1) * EPS32 * sum(d.double().abs() for d in ds)
    return [x - d for x, d in zip(xs, ds)], center + sum(d.double() for d in ds), rounding


def easgd_reference(rank, world_size, tau, alpha, steps=24, save_at=10):
    """Every step, each rank's parameters and the center against reference_average applied to
    the parameters gathered before the step; a checkpoint taken at step `save_at` (between two
    averagings when tau > 1) is restored into a fresh wrapper that repeats the steps after it."""
    import gossipcc

    def make(seed):
        model = make_model(seed)
        ea = gossipcc.AllReduceEA(model, tau=tau, alpha=alpha)
        return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), ea

    def run(model, opt, ea, first, last, ref, log):
        ref_center, drift = ref  # drift: bound on |gossipcc's center - ref_center| so far
        for i in range(first, last):
            step(model, opt, rank, i)
            xs = gather(flat_params(model))
            own_center = center_flat(ea)
            averaged = ea.step()
            assert averaged == ((i + 1) % tau == 0), (i, averaged)
            assert ea.steps == i + 1
            x = flat_params(model)
            if averaged:
                expected, ref_center, rounding = reference_average(xs, ref_center, alpha)
                # The same formula from this wrapper's own center: the same bits.
                own = xs[rank] - ((xs[rank].double() - own_center) * alpha).to(x.dtype)
                assert torch.equal(x, own), (i, (x - own).abs().max())
                # From the reference center, carried independently since the start: d differs
                # by at most alpha * drift plus its roundings, x - d by its roundings.
                d = (xs[rank] - expected[rank]).double().abs()
                bound = alpha * drift + 4 * EPS32 * (xs[rank].double().abs() + d) + 1e-12
                error = (x.double() - expected[rank].double()).abs()
                assert bool((error <= bound).all()), (i, (error - bound).max())
                # Both centers move by the same sum of alpha (x_r - c): a gap e becomes
                # (1 - n alpha) e, plus this averaging's roundings.
                drift = abs(1 - world_size * alpha) * drift + rounding + 1e-12
            else:
                assert torch.equal(x, xs[rank]) and torch.equal(center_flat(ea), own_center), i
            error = (center_flat(ea) - ref_center).abs()
            assert bool((error <= drift).all()), (i, (error - drift).max(), drift.max())
            log.append(x.clone())
        return ref_center, drift

    model, opt, ea = make(rank)
    ref_center = gather(flat_params(model))[0].double()  # everyone starts from rank 0's
    assert torch.equal(center_flat(ea), ref_center)
    ref = run(model, opt, ea, 0, save_at, (ref_center, torch.zeros_like(ref_center)), [])
    saved = copy.deepcopy({"model": model.state_dict(), "opt": opt.state_dict(), "ea": ea.state_dict()})
    continued = []
    run(model, opt, ea, save_at, steps, ref, continued)
    fresh, fresh_opt, fresh_ea = make(50 + rank)
    fresh.load_state_dict(saved["model"])
    fresh_opt.load_state_dict(saved["opt"])
    fresh_ea.load_state_dict(saved["ea"])
    assert fresh_ea.steps == save_at
    resumed = []
    run(fresh, fresh_opt, fresh_ea, save_at, steps, ref, resumed)
    assert all(torch.equal(a, b) for a, b in zip(resumed, continued)), "resumed run differs"
    assert torch.equal(center_flat(fresh_ea), center_flat(ea))
    return len(continued)


def uneven(rank, world_size):
    import gossipcc
    model = make_model(rank)
    sgd = gossipcc.AllReduceSGD(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    steps = 28 + 4 * rank  # uneven shards
    losses, contributors = [], []
    for i in range(steps):
        x, y = batch(rank, i)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        contributors.append(sgd.sum_and_normalize_gradients()[0])
        opt.step()
        losses.append(loss.item())
        if i < 28:  # everyone still contributes: replicas stay bitwise equal
            replicas = gather(flat_params(model))
            assert all(torch.equal(r, replicas[0]) for r in replicas), i
    sgd.finish()
    final = gather(flat_params(model))
    assert all(torch.equal(f, final[0]) for f in final), "not bitwise equal after finish()"
    assert loss_drop(losses) < 0.5, losses
    # Ranks 0..3 run 28, 32, 36, 40 steps: contributors per step 4 (28 steps), 3, 2, 1.
    expected = [4] * 28 + [3] * 4 + [2] * 4 + [1] * 4
    assert contributors == expected[:steps], contributors
    return steps


def worker(rank, world_size):
    # One set of processes for both (starting 4 Python processes costs more than the checks).
    init(rank, world_size)
    results = {"easgd": easgd(rank, world_size),
               "easgd_reference": [easgd_reference(rank, world_size, tau=1, alpha=0.5),
                                   easgd_reference(rank, world_size, tau=3, alpha=0.3)],
               "uneven": uneven(rank, world_size)}
    dist.destroy_process_group()
    return results


@pytest.fixture(scope="module")
def results():
    return run_ranks(worker, WORLD, timeout=240)


def test_elastic_averaging(results):
    assert all(len(r["easgd"]) == 40 for r in results)  # the checks run inside the worker


def test_elastic_averaging_matches_reference(results):
    assert all(r["easgd_reference"] == [14, 14] for r in results)  # steps checked after the checkpoint


def test_uneven_allreduce_sgd(results):
    assert [r["uneven"] for r in results] == [28, 32, 36, 40]


# AllReduceSGD.finish() follows torch-distlearn's synchronizeParameters: every rank ends with
# the parameters of the rank that contributed the most steps (the highest rank among ties),
# bit for bit. Three ranks train a linear model; the pytest process replays every rank's
# trajectory on its own (no process group): at step k the ranks with more than k steps
# contribute, the step's gradient is their sum divided by their number, each applies it with
# its own optimizer. Gradients are rounded to multiples of 2^-10 (and stay small), so their
# cross-rank float32 sum is exact in whatever order the all-reduce adds them: the replay need
# not know the ring's order, and every comparison is bitwise.
UNEVEN_RANKS = 3
UNEVEN_CASES = {
    # name: (steps per rank, learning rate per rank, momentum, the rank whose parameters win)
    "3/5/7": ((3, 5, 7), (0.1, 0.1, 0.1), 0.0, 2),
    # ranks 0 and 2 tie at 7 steps; different learning rates make their parameters differ
    "tie 7/5/7": ((7, 5, 7), (0.05, 0.1, 0.15), 0.0, 2),
    "tie 6/6/2": ((6, 6, 2), (0.15, 0.05, 0.1), 0.9, 1),
}


def linear_model(seed):
    torch.manual_seed(seed)
    return torch.nn.Linear(4, 1)


def linear_batch(rank, step):
    g = torch.Generator().manual_seed(100 * rank + step)
    x = torch.rand(3, 4, generator=g) * 2 - 1
    return x, x @ torch.tensor([[0.6], [-0.8], [0.6], [-0.8]]) + 0.5


def quantized_gradients(model, rank, step):
    """Backward of the batch's mean squared error; .grad rounded to multiples of 2^-10."""
    x, y = linear_batch(rank, step)
    model.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    with torch.no_grad():
        for p in model.parameters():
            p.grad.copy_(torch.round(p.grad * 1024) / 1024)


def replay(start, steps, lrs, momentum):
    """Every rank's parameters after its steps, computed in this process without a group."""
    models = [copy.deepcopy(start) for _ in steps]
    opts = [torch.optim.SGD(m.parameters(), lr=lr, momentum=momentum) for m, lr in zip(models, lrs)]
    for k in range(max(steps)):
        contributing = [r for r in range(len(steps)) if steps[r] > k]
        grads = []
        for r in contributing:
            quantized_gradients(models[r], r, k)
            grads.append([p.grad.clone() for p in models[r].parameters()])
        mean = [sum(gs) / len(contributing) for gs in zip(*grads)]  # exact sum, one rounding
        for r in contributing:
            for p, g in zip(models[r].parameters(), mean):
                p.grad.copy_(g)
            opts[r].step()
    return [flat_params(m) for m in models]


def uneven_run(rank, steps, lr, momentum, checkpoint_at=None):
    """One AllReduceSGD run of `steps` local steps; with checkpoint_at, the state is saved at that
    step, this run continues, and a fresh model, optimizer and wrapper restored from the save
    run the remaining steps too. Returns flat params, winner and counters of each."""
    import gossipcc

    def make(seed):
        model = linear_model(seed)
        sgd = gossipcc.AllReduceSGD(model)  # everyone starts from rank 0's parameters
        return model, torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum), sgd

    def train(model, opt, sgd, first):
        for k in range(first, steps):
            if k == checkpoint_at and first == 0:
                saved.append(copy.deepcopy({"model": model.state_dict(), "opt": opt.state_dict(),
                                            "sgd": sgd.state_dict()}))
            quantized_gradients(model, rank, k)
            sgd.sum_and_normalize_gradients()
            opt.step()
        winner = sgd.finish()
        assert winner == sgd.winner
        # Plain floats (exact for float32): tensors would travel to the pytest process through
        # shared memory that the exiting rank takes with it.
        return {"params": flat_params(model).tolist(), "winner": winner, "steps": sgd.steps,
                "state": sgd.state_dict()}

    saved = []
    runs = [train(*make(rank), first=0)]
    if checkpoint_at is not None:
        model, opt, sgd = make(10 + rank)
        model.load_state_dict(saved[0]["model"])  # after the constructor's broadcast
        opt.load_state_dict(saved[0]["opt"])
        sgd.load_state_dict(saved[0]["sgd"])
        assert sgd.steps == checkpoint_at
        runs.append(train(model, opt, sgd, first=checkpoint_at))
    return runs


def uneven_worker(rank, world_size):
    import gossipcc
    init(rank, world_size)
    out = {}
    for name, (steps, lrs, momentum, _) in UNEVEN_CASES.items():
        out[name] = uneven_run(rank, steps[rank], lrs[rank], momentum)
    # Checkpoint at step 2 (every rank still trains), with momentum: the resumed run must give
    # what the uninterrupted one does, bit for bit.
    out["checkpoint"] = uneven_run(rank, (3, 5, 7)[rank], 0.1, 0.9, checkpoint_at=2)

    sgd = gossipcc.AllReduceSGD(linear_model(0))
    with pytest.raises(ValueError, match="expected the dict state_dict"):
        sgd.load_state_dict({"steps_contributed": 1})
    with pytest.raises(ValueError, match="need 0 <= steps_since_sync <= steps_contributed <= collectives"):
        sgd.load_state_dict({"uneven_sgd": {"steps_contributed": 5, "collectives": 3}})
    with pytest.raises(ValueError, match="missing key 'collectives'"):
        sgd.load_state_dict({"uneven_sgd": {"steps_contributed": 5}})
    # A state saved before steps_since_sync existed: every contributed step counts (AllReduceSGD
    # synchronises only in finish()).
    sgd.load_state_dict({"uneven_sgd": {"steps_contributed": 4, "collectives": 6}})
    assert sgd.state_dict()["uneven_sgd"] == {"steps_contributed": 4, "collectives": 6, "steps_since_sync": 4}
    sgd.finish()
    # A model wrapped in DDP is refused before any collective, on every rank.
    ddp = torch.nn.parallel.DistributedDataParallel(linear_model(0))
    for make, who in ((lambda m: gossipcc.AllReduceEA(m, tau=2, alpha=0.5), "AllReduceEA"),
                      (gossipcc.AllReduceSGD, "AllReduceSGD")):
        with pytest.raises(ValueError, match=f"{who}: the model is wrapped in DistributedDataParallel, which "
                                             r"all-reduces .* pass the bare module instead"):
            make(ddp)
    dist.destroy_process_group()
    return out


@pytest.fixture(scope="module")
def uneven_results():
    return run_ranks(uneven_worker, UNEVEN_RANKS, timeout=240)


@pytest.mark.parametrize("name", list(UNEVEN_CASES))
def test_uneven_finish_gives_the_params_of_the_rank_with_most_steps(uneven_results, name):
    steps, lrs, momentum, winner = UNEVEN_CASES[name]
    reference = replay(linear_model(0), steps, lrs, momentum)
    # The case tests something: the winner's parameters differ from every rank that ran fewer
    # steps (or the same steps at another rate) and from the ranks' mean (the old finish()).
    for r in range(UNEVEN_RANKS):
        if r != winner:
            assert not torch.equal(reference[r], reference[winner]), (name, r)
    assert (sum(reference) / UNEVEN_RANKS - reference[winner]).abs().max() > 1e-3, name
    for rank, out in enumerate(uneven_results):
        (run,) = out[name]
        assert run["winner"] == winner, (name, rank, run["winner"])
        assert run["steps"] == steps[rank]
        got = torch.tensor(run["params"], dtype=torch.float32)
        assert torch.equal(got, reference[winner]), (
            f"{name}: rank {rank} ends at {run['params']}, the winner (rank {winner}) replayed at "
            f"{reference[winner].tolist()}; max diff {(got - reference[winner]).abs().max().item()}")


def test_uneven_checkpoint_resumes_bit_for_bit(uneven_results):
    reference = replay(linear_model(0), (3, 5, 7), (0.1, 0.1, 0.1), 0.9)
    for rank, out in enumerate(uneven_results):
        uninterrupted, resumed = out["checkpoint"]
        assert torch.equal(torch.tensor(uninterrupted["params"], dtype=torch.float32), reference[2]), rank
        assert resumed["params"] == uninterrupted["params"], (rank, resumed["params"], uninterrupted["params"])
        assert resumed["winner"] == uninterrupted["winner"] == 2
        assert resumed["state"] == uninterrupted["state"], (resumed["state"], uninterrupted["state"])
        assert resumed["state"]["uneven_sgd"]["steps_contributed"] == (3, 5, 7)[rank]


def test_uneven_winner_binding_states_the_rule():
    # UnevenAllReduceSGD.winner (docs/pytorch.md) names the rank finish() picks, as the cases above saw.
    import gossipcc
    for name, (steps, _, _, winner) in UNEVEN_CASES.items():
        assert gossipcc._C.UnevenAllReduceSGD.winner(list(steps)) == winner, name
