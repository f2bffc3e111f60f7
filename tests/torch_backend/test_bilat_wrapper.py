"""BilatGossipDataParallel (AD-PSGD, asynchronous bilateral exchange) on 4 CPU ranks:
pure mixing conserves the sum of the parameters and shrinks their spread; training with
uneven step counts lowers the loss; finish() + average_parameters() leave every rank equal."""
import torch
import torch.distributed as dist

from launcher import run_ranks
from wrapper_common import batch, flat_params, gather, init, loss_drop, make_model

WORLD = 4


def mixing_only(rank, world_size):
    """No optimizer: the exchanges alone. Sum over ranks conserved (pairwise averages of the
    side buffer, folded back exactly), spread shrinks."""
    import gossipcc
    model = gossipcc.BilatGossipDataParallel(make_model(100 + rank), broadcast_init=False)
    start = flat_params(model).double()
    starts = gather(start)
    total = sum(starts)
    mean = total / world_size
    spread0 = max((s - mean).abs().max().item() for s in starts)
    for _ in range(30):
        model.exchange()
    model.finish()
    end = gather(flat_params(model).double())
    assert torch.allclose(sum(end), total, rtol=0, atol=1e-4), (sum(end) - total).abs().max()
    spread = max((e - mean).abs().max().item() for e in end)
    assert spread < 0.5 * spread0, (spread, spread0)
    return model.exchanges


def training(rank, world_size):
    import gossipcc
    # A group of its own: the asynchronous exchange's end-of-training state belongs to a group.
    model = gossipcc.BilatGossipDataParallel(make_model(0), process_group=dist.new_group())
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    # Uneven step counts (no global step is needed); enough steps that the loss halves on every
    # rank whatever the (timing-dependent) order of exchanges.
    for step in range(60 + 5 * rank):
        x, y = batch(rank, step)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    model.finish()
    assert loss_drop(losses) < 0.5, losses
    model.average_parameters()
    after = gather(flat_params(model))
    assert all(torch.equal(a, after[0]) for a in after)
    return model.exchanges


def worker(rank, world_size):
    init(rank, world_size)
    mixing_exchanges = mixing_only(rank, world_size)
    training_exchanges = training(rank, world_size)
    dist.destroy_process_group()
    return mixing_exchanges, training_exchanges


def test_bilat_gossip_data_parallel():
    results = run_ranks(worker, WORLD)
    # Active (odd) ranks exchange once per step; passive ones answered every request.
    assert results[1][0] == 30 and results[3][0] == 30, results
    assert results[0][0] + results[2][0] == 60, results
