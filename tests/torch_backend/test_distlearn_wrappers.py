"""AllReduceEA (elastic averaging) and AllReduceSGD (uneven step counts) on 4 CPU ranks:
training lowers the loss; EASGD conserves sum(x) + center and keeps the centers identical;
the uneven run ends bitwise equal; checkpoints resume bit for bit."""
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
    results = {"easgd": easgd(rank, world_size), "uneven": uneven(rank, world_size)}
    dist.destroy_process_group()
    return results


@pytest.fixture(scope="module")
def results():
    return run_ranks(worker, WORLD, timeout=240)


def test_elastic_averaging(results):
    assert all(len(r["easgd"]) == 40 for r in results)  # the checks run inside the worker


def test_uneven_allreduce_sgd(results):
    assert [r["uneven"] for r in results] == [28, 32, 36, 40]
