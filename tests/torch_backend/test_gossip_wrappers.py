"""GossipDataParallel (SGP, OSGP, D-PSGD) on 4 CPU ranks: consensus without training (the
de-biased parameters reach the exact mean, sums conserved), training (loss falls, push-sum
weights sum to the world size every step, also with a round in flight), forced averaging
(bitwise equal), checkpoint resume (bitwise identical continuation), every rank's parameters
and push-sum weight after a few training steps against a simulation of each algorithm's update
computed in the test (OSGP at staleness 1, 2 and 3), and bad arguments."""
import copy

import pytest
import torch
import torch.distributed as dist

from launcher import run_ranks
from wrapper_common import batch, flat_params, gather, gather_scalar, init, loss_drop, make_model

WORLD = 4
# Non-regular on 4 ranks (rank 0 sends to two peers, rank 2 hears from two), so push-sum
# weights really move away from 1 and the de-biasing matters.
IRREGULAR = "edges:0>1,1>2,2>3,3>0,0>2"

CONFIGS = {
    "sgp": dict(algorithm="sgp"),
    "sgp_irregular": dict(algorithm="sgp", graph=IRREGULAR),
    "sgp_2peers": dict(algorithm="sgp", peers_per_step=2),
    "osgp": dict(algorithm="osgp", synch_freq=1),
    "osgp_irregular_stale2": dict(algorithm="osgp", graph=IRREGULAR, synch_freq=2),
    "dpsgd": dict(algorithm="dpsgd", graph="ring"),
}


def consensus(rank, config):
    """No optimizer: every rank starts from different parameters; gossip alone must drive the
    de-biased parameters to the exact mean of the initial ones, conserving sum(x), sum(w)."""
    import gossipcc
    model = gossipcc.GossipDataParallel(make_model(100 + rank), broadcast_init=False, **config)
    start = flat_params(model).double()
    mean = sum(gather(start)) / WORLD
    for _ in range(40):
        model.gossip_step()
        assert abs(sum(gather_scalar(model.ps_weight)) - WORLD) < 1e-9
        if model._pushsum:  # the conserved numerator (in flight: the full snapshot is still counted)
            total = sum(gather(model._x.double()))
            assert torch.allclose(total, WORLD * mean, rtol=0, atol=1e-5), (total - WORLD * mean).abs().max()
    model.flush()
    err = (flat_params(model).double() - mean).abs().max().item()
    assert err < 1e-4, f"rank {rank}: de-biased parameters {err} from the mean after 40 rounds"
    return model.ps_weight


def train_steps(model, opt, rank, start, steps, weights=None):
    losses = []
    for step in range(start, start + steps):
        x, y = batch(rank, step)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if weights is not None:
            weights.append((gather_scalar(model.ps_weight), model.in_flight))
    return losses


def training(rank, config):
    import gossipcc

    def make(seed):
        model = gossipcc.GossipDataParallel(make_model(seed), **config)
        return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    model, opt = make(0)
    weights = []
    losses = train_steps(model, opt, rank, 0, 30, weights)
    for ws, _ in weights:
        assert abs(sum(ws) - WORLD) < 1e-9, ws
    assert loss_drop(losses) < 0.5, losses

    # Checkpoint at step 30, continue 10 steps; a fresh wrapper restored from it must continue
    # bit for bit the same.
    saved = copy.deepcopy({"model": model.state_dict(), "opt": opt.state_dict()})
    train_steps(model, opt, rank, 30, 10)
    continued = flat_params(model)
    fresh, fresh_opt = make(1)
    fresh.load_state_dict(saved["model"])
    fresh_opt.load_state_dict(saved["opt"])
    train_steps(fresh, fresh_opt, rank, 30, 10)
    assert torch.equal(flat_params(fresh), continued), (flat_params(fresh) - continued).abs().max()
    fresh.flush()  # no round may be left in flight when the group is destroyed

    # Forced exact averaging: bitwise equal everywhere, weight 1, at the push-sum consensus
    # value sum x / sum w (after the flush has folded the last optimizer update into x).
    model.flush()
    before = sum(gather(flat_params(model).double() * model.ps_weight)) / sum(gather_scalar(model.ps_weight))
    model.average_parameters()
    after = gather(flat_params(model))
    assert all(torch.equal(a, after[0]) for a in after)
    assert torch.allclose(after[0].double(), before, atol=1e-5), (after[0].double() - before).abs().max()
    assert model.ps_weight == 1.0
    return {"losses": losses, "weights": weights}


def worker(rank, world_size):
    # One set of processes runs every configuration (starting 4 Python processes that import
    # torch costs more than the checks themselves).
    init(rank, world_size)
    results = {}
    for name, config in CONFIGS.items():
        consensus(rank, config)
        results[name] = training(rank, config)
    results["simulated"] = {name: simulated(rank, name) for name in SIM_CONFIGS}
    results["buffers"] = buffers_averaged(rank)
    results["subgroup"] = subgroup(rank)
    results["bad_arguments"] = bad_arguments(rank)
    dist.destroy_process_group()
    return results


@pytest.fixture(scope="module")
def results():
    return run_ranks(worker, WORLD, timeout=240)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_gossip_data_parallel(results, name):
    weights = results[0][name]["weights"]
    if name.startswith(("sgp_irregular", "osgp_irregular")):
        # The irregular graph really exercised the weights (else the de-biasing is untested).
        assert any(abs(w - 1.0) > 1e-3 for ws, _ in weights for w in ws)
    if name.startswith("osgp"):
        assert any(in_flight for _, in_flight in weights), "no round was ever in flight"


def buffers_averaged(rank):
    """BatchNorm statistics stay local during training; average_parameters() averages them."""
    import gossipcc
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(20, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    model = gossipcc.GossipDataParallel(net, algorithm="sgp")
    train_steps(model, torch.optim.SGD(model.parameters(), lr=0.1), rank, 0, 3)
    assert model.step == 3
    with model.no_gossip():  # e.g. gradient accumulation: no gossip step (every rank skips it)
        model(batch(rank, 99)[0])
    assert model.step == 3
    bn = net[1]
    means = gather(bn.running_mean.clone())
    assert not torch.equal(means[0], means[1])  # each rank's statistics follow its own data
    model.average_parameters()
    after = gather(bn.running_mean.clone())
    assert all(torch.equal(a, after[0]) for a in after)
    assert torch.allclose(after[0], sum(means) / WORLD, atol=1e-6)
    assert gather(bn.num_batches_tracked.view(1).clone()) == [torch.tensor([4])] * WORLD
    return True


def test_batchnorm_buffers(results):
    assert all(r["buffers"] for r in results)  # the checks run inside the worker


def subgroup(rank):
    """A wrapper on a group of ranks 1..3 (group rank 0 is global rank 1)."""
    import gossipcc
    group = dist.new_group([1, 2, 3])  # collective: every rank calls it
    if rank == 0:
        return True
    model = gossipcc.GossipDataParallel(make_model(rank), process_group=group, algorithm="osgp")
    members = [torch.empty_like(flat_params(model)) for _ in range(3)]
    dist.all_gather(members, flat_params(model), group=group)
    assert all(torch.equal(m, flat_params(make_model(1))) for m in members)  # global rank 1's
    train_steps(model, torch.optim.SGD(model.parameters(), lr=0.1), rank, 0, 5)
    model.average_parameters()
    dist.all_gather(members, flat_params(model), group=group)
    assert all(torch.equal(m, members[0]) for m in members)
    return True


def test_subgroup(results):
    assert all(r["subgroup"] for r in results)  # the checks run inside the worker


def bad_arguments(rank):
    import gossipcc
    model = make_model(0)
    cases = [
        (dict(algorithm="adam"), "algorithm must be one of"),
        (dict(algorithm="sgp", synch_freq=2), "applies to algorithm=\"osgp\" only"),
        (dict(algorithm="osgp", synch_freq=-1), "synch_freq must be an integer >= 0"),
        (dict(graph="ring", peers_per_step=2), "peers_per_step=2 applies to graph=\"exponential\" only"),
        (dict(peers_per_step=0), "peers_per_step must be an integer >= 1"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            gossipcc.GossipDataParallel(model, **kwargs)
    with pytest.raises(ValueError, match="one dtype"):
        mixed = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2).double())
        gossipcc.GossipDataParallel(mixed)
    # An unknown graph is refused at construction, naming the spec.
    with pytest.raises(ValueError, match="petersen"):
        gossipcc.GossipDataParallel(model, graph="petersen")
    # D-PSGD needs a symmetric graph (a directed ring on 4 ranks is not): refused at construction,
    # on every rank, naming the step and the edge.
    for graph in ("ring:directed=1", "directed_exponential", "bipartite_exponential"):
        with pytest.raises(ValueError, match=r"dpsgd\" needs a symmetric \(undirected\) graph; graph '[^']+' on 4 "
                                             r"ranks is directed at step 0 \(rank 0 sends to"):
            gossipcc.GossipDataParallel(model, algorithm="dpsgd", graph=graph)
    for graph in ("ring", "hypercube", "complete", "edges:0>1,1>0,1>2,2>1,2>3,3>2"):
        gossipcc.GossipDataParallel(model, algorithm="dpsgd", graph=graph)  # symmetric: accepted
    # Option strings ignore case (and keep their lower-case form).
    assert gossipcc.GossipDataParallel(model, algorithm="DPSGD", graph="Ring").graph == "ring"
    assert gossipcc.GossipDataParallel(model, algorithm="SGP", graph="Exponential", peers_per_step=2).graph == \
        "exponential:peers=2"
    assert gossipcc.GossipDataParallel(model, algorithm="Osgp", graph="RING:Directed=1").graph == "ring:directed=1"
    # A model wrapped in DDP is refused before any collective (so no rank waits), on every rank.
    ddp = torch.nn.parallel.DistributedDataParallel(make_model(0))
    for wrapped, where in ((ddp, "the model is"), (torch.nn.Sequential(ddp), "the model's submodule '0' is")):
        with pytest.raises(ValueError, match=f"GossipDataParallel: {where} wrapped in DistributedDataParallel, "
                                             r"which all-reduces .* pass the bare module instead"):
            gossipcc.GossipDataParallel(wrapped)
    dist.barrier()
    return True


def test_bad_arguments(results):
    assert all(r["bad_arguments"] for r in results)  # the checks run inside the worker


def test_documented_synch_freq_default_is_the_signatures():
    # The module docstring (help(gossipcc.gossip)) states synch_freq's default as the signature has it.
    import inspect
    import re
    from gossipcc import gossip
    default = inspect.signature(gossip.GossipDataParallel.__init__).parameters["synch_freq"].default
    stated = re.findall(r"default\s+synch_freq=(\d+)", gossip.__doc__)
    assert stated == [str(default)], (default, stated)
    assert f"synch_freq={default}" in re.search(r"GossipDataParallel\(module,[^)]*\)", gossip.__doc__).group(0)


# ------------------------------------------------------------------ against a simulation
# Every rank's parameters (and push-sum weight) after a few training steps, compared with the
# algorithm's update simulated here for all ranks in one process: the peer schedule is asked
# from the extension (peer_graph_out_peers), the mixing (uniform push-sum shares 1/(|out|+1),
# Metropolis weights 1/(1 + max(d_i, d_j))), the de-biasing and OSGP's fold are computed here.
PATH = "edges:0>1,1>0,1>2,2>1,2>3,3>2"  # undirected, degrees 1, 2, 2, 1: non-uniform Metropolis weights
SIM_STEPS, SIM_LR = 7, 0.2
SIM_CONFIGS = {
    "sgp_exponential": dict(algorithm="sgp"),                       # time-varying graph (period 2)
    "sgp_irregular": dict(algorithm="sgp", graph=IRREGULAR),         # weights move away from 1
    "osgp_stale1": dict(algorithm="osgp", graph=IRREGULAR, synch_freq=1),
    "osgp_stale2": dict(algorithm="osgp", graph=IRREGULAR, synch_freq=2),
    "osgp_stale3_exponential": dict(algorithm="osgp", synch_freq=3),
    "dpsgd_path": dict(algorithm="dpsgd", graph=PATH),
}


def sim_model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3)).double()


def sim_batch(rank, step):
    g = torch.Generator().manual_seed(500 + 31 * step + rank)
    x = torch.randn(8, 6, generator=g, dtype=torch.float64)
    return x, (x[:, :3] @ torch.ones(3, 3, dtype=torch.float64) + x[:, 3:]).argmax(1)


def sim_sgd_step(z, rank, step):
    """The parameters after one plain SGD step from the flat parameters z on (rank, step)'s batch."""
    net = sim_model(0)
    with torch.no_grad():
        torch.nn.utils.vector_to_parameters(z, net.parameters())
    x, y = sim_batch(rank, step)
    loss = torch.nn.functional.cross_entropy(net(x), y)
    grads = torch.autograd.grad(loss, list(net.parameters()))
    return z - SIM_LR * torch.cat([g.reshape(-1) for g in grads])


def sim_push_sum_round(xs, ws, graph, r):
    """One push-sum round at graph step r: every rank keeps a share 1/(|out|+1) of (x, w) and
    sends the same share to each out-peer."""
    from gossipcc import _C
    new_x = [torch.zeros_like(x) for x in xs]
    new_w = [0.0] * WORLD
    for i in range(WORLD):
        out = list(_C.peer_graph_out_peers(graph, WORLD, i, r))
        share = 1.0 / (len(out) + 1)
        for j in [i] + out:
            new_x[j] = new_x[j] + share * xs[i]
            new_w[j] += share * ws[i]
    return new_x, new_w


def simulate(config, graph):
    """Returns per rank (parameters after the last optimizer step, push-sum weight)."""
    from gossipcc import _C
    algorithm, tau = config["algorithm"], max(1, config.get("synch_freq", 0))
    params = [torch.nn.utils.parameters_to_vector(sim_model(10 + i).parameters()).detach() for i in range(WORLD)]
    if algorithm == "dpsgd":
        for k in range(SIM_STEPS):
            nbrs = [[j for j in _C.peer_graph_out_peers(graph, WORLD, i, k) if j != i] for i in range(WORLD)]
            mixed = []
            for i in range(WORLD):
                wij = {j: 1.0 / (1 + max(len(nbrs[i]), len(nbrs[j]))) for j in nbrs[i]}
                mixed.append((1 - sum(wij.values())) * params[i] + sum(w * params[j] for j, w in wij.items()))
            params = [sim_sgd_step(mixed[i], i, k) for i in range(WORLD)]
        return [(p, 1.0) for p in params]
    xs, ws = [p.clone() for p in params], [1.0] * WORLD
    zref = [p.clone() for p in params]
    pending = None  # (started at step, sent x, sent w, round results x, round results w)
    rounds = 0
    for k in range(SIM_STEPS):
        xs = [xs[i] + (params[i] - zref[i]) for i in range(WORLD)]  # the optimizer's update, unscaled
        if algorithm == "sgp":
            xs, ws = sim_push_sum_round(xs, ws, graph, rounds)
            rounds += 1
        else:
            if pending is not None and k - pending[0] >= tau:
                _, sent_x, sent_w, got_x, got_w = pending
                xs = [xs[i] + got_x[i] - sent_x[i] for i in range(WORLD)]
                ws = [ws[i] + got_w[i] - sent_w[i] for i in range(WORLD)]
                pending = None
            if pending is None:
                got_x, got_w = sim_push_sum_round(xs, ws, graph, rounds)
                pending = (k, [x.clone() for x in xs], list(ws), got_x, got_w)
                rounds += 1
        zref = [xs[i] / ws[i] for i in range(WORLD)]
        params = [sim_sgd_step(zref[i], i, k) for i in range(WORLD)]
    return list(zip(params, ws))


def simulated(rank, name):
    import gossipcc
    config = SIM_CONFIGS[name]
    model = gossipcc.GossipDataParallel(sim_model(10 + rank), broadcast_init=False, **config)
    opt = torch.optim.SGD(model.parameters(), lr=SIM_LR)
    for step in range(SIM_STEPS):
        x, y = sim_batch(rank, step)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    mine = flat_params(model).clone()
    weight = model.ps_weight
    in_flight = model.in_flight
    model.flush()
    sims = simulate(config, model.graph)
    expected, expected_w = sims[rank]
    err = (mine - expected).abs().max().item()
    spread = max((p - sims[0][0]).abs().max().item() for p, _ in sims)
    assert err < 1e-12, f"{name} rank {rank}: parameters {err} from the simulation"
    assert abs(weight - expected_w) < 1e-12, f"{name} rank {rank}: weight {weight}, simulated {expected_w}"
    return {"err": err, "weight": weight, "in_flight": in_flight, "spread": spread}


@pytest.mark.parametrize("name", sorted(SIM_CONFIGS))
def test_matches_simulation(results, name):
    per_rank = [r["simulated"][name] for r in results]
    assert all(r["err"] < 1e-12 for r in per_rank), per_rank  # checked in the worker, too
    assert any(r["spread"] > 1e-3 for r in per_rank), "ranks did not differ: the comparison would be vacuous"
    if SIM_CONFIGS[name].get("graph") == IRREGULAR:  # the weights, and so the de-biasing, were exercised
        assert any(abs(r["weight"] - 1.0) > 1e-3 for r in per_rank), per_rank
    if name.startswith("osgp"):
        assert any(r["in_flight"] for r in per_rank), per_rank
