"""BilatGossipDataParallel (AD-PSGD, asynchronous bilateral exchange) on 4 CPU ranks:
pure mixing conserves the sum of the parameters and shrinks their spread, and each exchange
is a pair average (every passive rank's history a chain of them, checked here); training with
uneven step counts lowers the loss; finish() + average_parameters() leave every rank equal.
deterministic=True: every step equals the serialization computed here, and a checkpoint
resumes bit for bit; asynchronous mode: checkpoints at finish() restore the state and each
active rank's peer schedule; bad checkpoints are refused naming what differs."""
import copy

import pytest
import torch
import torch.distributed as dist

from launcher import run_ranks
from wrapper_common import batch, flat_params, gather, init, loss_drop, make_model

WORLD = 4
# Each active rank's passive peers for 4 ranks, taken in turn (algorithms/async_bilateral_exchange.h):
# its bipartite-exponential neighbours a +- 1 and a +- (1 + 2) mod 4 that are even, ascending.
PEERS = {1: [0, 2], 3: [0, 2]}
SAVE_AT, END = 13, 20  # 13 is odd: a restored active rank must continue with the second peer


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


ASYNC_EXCHANGES = 12


def pair_chain(start, exchanges, end, tol=1e-9):
    """True if the passive rank's history is a chain of pair averages: `exchanges` is, per active
    rank, its exchanges with this passive rank in order, as (x_a before, x_a after); the passive
    value each met is q = 2 after - before (after = (x_a + q) / 2) and after it the passive rank
    held `after`. Some interleaving of the active ranks' lists must start from `start`, have each
    q equal the value the previous exchange left, and end at `end` (the order of the two active
    ranks' requests depends on timing, so every interleaving is tried)."""
    lists = list(exchanges.values())

    def close(a, b):
        return (a - b).abs().max().item() < tol

    def walk(positions, value):
        if all(i == len(lst) for i, lst in zip(positions, lists)):
            return close(value, end)
        for n, (i, lst) in enumerate(zip(positions, lists)):
            if i < len(lst):
                before, after = lst[i]
                if close(2 * after - before, value):
                    nxt = list(positions)
                    nxt[n] += 1
                    if walk(tuple(nxt), after):
                        return True
        return False

    return walk(tuple(0 for _ in lists), start)


def async_pair_averages(rank, world_size):
    """Asynchronous mode, no optimizer (float64): each active rank records its parameters before
    and after each exchange; afterwards every passive rank's history must be a chain of pair
    averages with the active ranks' requests in some order (pair_chain) that starts from its
    initial parameters and ends at its final ones. A no-op exchange, or one that updates only
    one side of the pair, fails it."""
    import gossipcc
    net = make_model(200 + rank).double()
    model = gossipcc.BilatGossipDataParallel(net, process_group=dist.new_group(), broadcast_init=False)
    start = flat_params(model).clone()
    records = torch.zeros(ASYNC_EXCHANGES, 2, start.numel(), dtype=torch.float64)
    for k in range(ASYNC_EXCHANGES):
        before = flat_params(model).clone()
        model.exchange()
        records[k, 0], records[k, 1] = before, flat_params(model)
    model.finish()
    starts, ends, all_records = gather(start), gather(flat_params(model).clone()), gather(records)
    changed = 0
    for p in range(0, world_size, 2):
        exchanges = {a: [(all_records[a][k, 0], all_records[a][k, 1]) for k in range(ASYNC_EXCHANGES)
                         if PEERS[a][k % len(PEERS[a])] == p] for a in PEERS}
        assert pair_chain(starts[p], exchanges, ends[p]), f"passive rank {p}: not a chain of pair averages"
        changed += sum(1 for lst in exchanges.values() for b, a in lst if (a - b).abs().max().item() > 1e-6)
    assert changed > 0
    return True


def reference_step(xs, step):
    """One step of deterministic AD-PSGD computed here from every rank's parameters: the active
    ranks in ascending order, each with its scheduled passive peer, both <- (x_a + x_p) / 2."""
    xs = [x.clone() for x in xs]
    for a in sorted(PEERS):
        p = PEERS[a][step % len(PEERS[a])]
        xs[a] = xs[p] = (xs[a] + xs[p]) / 2
    return xs


def train_deterministic(model, opt, rank, first, last):
    """Steps first..last-1; before each optimizer step the parameters must equal
    reference_step of those gathered before the step's forward, bit for bit."""
    out = []
    for i in range(first, last):
        xs = gather(flat_params(model))
        x, y = batch(rank, i)
        loss = torch.nn.functional.cross_entropy(model(x), y)  # the step's exchanges, then the forward
        expected = reference_step(xs, i)[rank]
        assert torch.equal(flat_params(model), expected), (i, (flat_params(model) - expected).abs().max())
        opt.zero_grad()
        loss.backward()
        opt.step()
        out.append(flat_params(model))
    assert model.step == last
    return out


def deterministic(rank, world_size):
    """deterministic=True: each step against reference_step; a checkpoint after step SAVE_AT,
    restored into a fresh wrapper on a new group, continues bit for bit as the saved run did."""
    import gossipcc

    def make(seed):
        model = gossipcc.BilatGossipDataParallel(make_model(seed), process_group=dist.new_group(),
                                                 broadcast_init=False, deterministic=True)
        return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    model, opt = make(rank)
    train_deterministic(model, opt, rank, 0, SAVE_AT)
    saved = copy.deepcopy({"model": model.state_dict(), "opt": opt.state_dict()})
    # Steps 0..12: both active ranks ask rank 0 at even steps, rank 2 at odd ones.
    served = {0: 2 * 7, 2: 2 * 6}
    assert saved["model"]["adpsgd"] == {"world_size": 4, "rank": rank, "active": rank % 2 == 1,
                                        "deterministic": True, "step": SAVE_AT,
                                        "exchanges": served.get(rank, SAVE_AT)}, saved["model"]["adpsgd"]
    continued = train_deterministic(model, opt, rank, SAVE_AT, END)
    model.finish()
    final_state = model.state_dict()["adpsgd"]

    fresh, fresh_opt = make(50 + rank)
    fresh.load_state_dict(saved["model"])
    fresh_opt.load_state_dict(saved["opt"])
    assert fresh.step == SAVE_AT and fresh.exchanges == saved["model"]["adpsgd"]["exchanges"]
    resumed = train_deterministic(fresh, fresh_opt, rank, SAVE_AT, END)
    fresh.finish()
    for i, (a, b) in enumerate(zip(continued, resumed)):
        assert torch.equal(a, b), (SAVE_AT + i, (a - b).abs().max())
    assert fresh.state_dict()["adpsgd"] == final_state
    return saved["model"], final_state["exchanges"]


def asynchronous_checkpoint(rank, world_size):
    """Asynchronous mode: state_dict() refuses before finish(); after it, a fresh wrapper (new
    group) restores parameters and counters, and each active rank's next exchange goes to the
    next peer of its schedule (step 9: the second)."""
    import gossipcc
    model = gossipcc.BilatGossipDataParallel(make_model(0), process_group=dist.new_group())
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with pytest.raises(RuntimeError, match=r"call finish\(\) on every rank first"):
        model.state_dict()
    for i in range(9):
        x, y = batch(rank, i)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with pytest.raises(RuntimeError, match=r"call finish\(\) on every rank first"):
        model.state_dict()
    model.finish()
    state = copy.deepcopy(model.state_dict())
    exchanges = state["adpsgd"]["exchanges"]
    assert {k: v for k, v in state["adpsgd"].items() if k != "exchanges"} == {
        "world_size": 4, "rank": rank, "active": rank % 2 == 1, "deterministic": False, "step": 9}
    # 9 requests from each active rank, all answered by the passive ones.
    counts = gather(torch.tensor([float(exchanges)], dtype=torch.float64))
    assert counts[1].item() == counts[3].item() == 9 and counts[0].item() + counts[2].item() == 18, counts

    group = dist.new_group()
    fresh = gossipcc.BilatGossipDataParallel(make_model(5), process_group=group)
    fresh.load_state_dict(state)
    assert torch.equal(flat_params(fresh), flat_params(model))
    assert fresh.step == 9 and fresh.exchanges == exchanges
    x, y = batch(rank, 9)
    fresh(x)  # one exchange
    if rank % 2 == 1:
        assert gossipcc.get_backend_object(group).async_bilateral_stats()["last_peer"] == PEERS[rank][9 % 2]
        assert fresh.exchanges == 10
    with pytest.raises(RuntimeError, match="freshly constructed wrapper, before its first training forward"):
        fresh.load_state_dict(state)
    fresh.finish()
    answered = gather(torch.tensor([float(fresh.exchanges - exchanges)], dtype=torch.float64))
    assert answered[0].item() + answered[2].item() == 2, answered  # one request from each active rank
    return state


def bad_checkpoints(rank, world_size, saved):
    """Checkpoints that do not fit are refused, naming what differs, and change nothing."""
    import gossipcc

    def wrapper(module, group=None, deterministic=True):
        return gossipcc.BilatGossipDataParallel(module, process_group=group, broadcast_init=False,
                                                deterministic=deterministic)

    def refused(w, state, match):
        before = flat_params(w.module)
        with pytest.raises(ValueError, match=match):
            w.load_state_dict(state)
        assert torch.equal(flat_params(w.module), before) and w.step == 0 and w.exchanges == 0

    wider = torch.nn.Sequential(torch.nn.Linear(20, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    refused(wrapper(wider), saved,
            r"different model: '0.weight' is \(32, 20\) torch.float32 in the checkpoint, "
            r"\(16, 20\) torch.float32 in this model")
    refused(wrapper(make_model(0).double()), saved, r"'0.weight' is .* torch.float32 in the checkpoint, .* torch.float64")
    refused(wrapper(torch.nn.Linear(20, 4)), saved,
            r"different model: missing keys \['weight', 'bias'\], unexpected keys \['0.weight'")
    refused(wrapper(make_model(0), deterministic=False), saved,
            "saved with deterministic=True, this wrapper has deterministic=False")
    other_rank = copy.deepcopy(saved)
    other_rank["adpsgd"]["rank"] = (rank + 2) % 4
    refused(wrapper(make_model(0)), other_rank, f"saved with rank={(rank + 2) % 4}, this wrapper has rank={rank}")
    refused(wrapper(make_model(0)), saved["module"], r"expected the dict state_dict\(\) returns")
    negative = copy.deepcopy(saved)
    negative["adpsgd"]["exchanges"] = -1
    refused(wrapper(make_model(0)), negative, "the checkpoint's exchanges must be an integer >= 0, got -1")
    with pytest.raises(ValueError, match="exchanges must be >= 0, got -1"):  # the binding's own check
        gossipcc.get_backend_object().async_bilateral_restore(-1)
    pair = dist.new_group([0, 1])  # every rank creates it
    if rank < 2:
        refused(wrapper(make_model(0), group=pair), saved, "saved with world_size=4, this wrapper has world_size=2")
    with pytest.raises(ValueError, match="deterministic must be True or False"):
        gossipcc.BilatGossipDataParallel(make_model(0), deterministic=1)
    # A model wrapped in DDP is refused before any collective, on every rank.
    ddp = torch.nn.parallel.DistributedDataParallel(make_model(0))
    with pytest.raises(ValueError, match=r"BilatGossipDataParallel: the model is wrapped in DistributedDataParallel, "
                                         r"which all-reduces .* pass the bare module instead "
                                         r"\(gossipcc.BilatGossipDataParallel\(model\)"):
        gossipcc.BilatGossipDataParallel(ddp)


def worker(rank, world_size):
    init(rank, world_size)
    mixing_exchanges = mixing_only(rank, world_size)
    training_exchanges = training(rank, world_size)
    assert async_pair_averages(rank, world_size)
    saved, deterministic_exchanges = deterministic(rank, world_size)
    asynchronous_checkpoint(rank, world_size)
    bad_checkpoints(rank, world_size, saved)
    dist.destroy_process_group()
    return mixing_exchanges, training_exchanges, deterministic_exchanges


def test_bilat_gossip_data_parallel():
    results = run_ranks(worker, WORLD, timeout=240)
    # Active (odd) ranks exchange once per step; passive ones answered every request.
    assert results[1][0] == 30 and results[3][0] == 30, results
    assert results[0][0] + results[2][0] == 60, results
    # Deterministic: 20 steps; rank 0 answers both active ranks at the 10 even steps, rank 2 at the odd ones.
    assert [r[2] for r in results] == [20, 20, 20, 20], results
