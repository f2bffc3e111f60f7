"""Unmodified DistributedDataParallel training over backend="gossipcc" matches backend="gloo"."""
import datetime

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from launcher import init_method, run_ranks

STEPS = 6


def make_model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16),
                               torch.nn.ReLU(), torch.nn.Linear(16, 4))


TEACHER = torch.randn(20, 4, generator=torch.Generator().manual_seed(7))


def batch(rank, step):
    """A learnable task: labels from a fixed linear teacher; each rank cycles 4 batches."""
    g = torch.Generator().manual_seed(1000 * (step % 4) + rank)
    x = torch.randn(16, 20, generator=g)
    return x, (x @ TEACHER).argmax(1)


def train(model, rank, steps=STEPS):
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for step in range(steps):
        x, y = batch(rank, step)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def exact_worker(rank, world_size):
    import gossipcc  # noqa: F401
    dist.init_process_group("gossipcc", init_method=init_method(), rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=60))
    gloo = dist.new_group(backend="gloo")
    # Small buckets so that DDP all-reduces several buckets per step (and rebuilds them).
    ours = DDP(make_model(0), bucket_cap_mb=0.001)
    theirs = DDP(make_model(0), process_group=gloo, bucket_cap_mb=0.001)
    train(ours, rank)
    train(theirs, rank)
    for (name, a), (_, b) in zip(ours.module.named_parameters(), theirs.module.named_parameters()):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), f"{name}: max diff {(a - b).abs().max()}"
    # Replicas agree bitwise across ranks (everyone applied the same averaged gradient).
    flat = torch.cat([p.detach().reshape(-1) for p in ours.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(world_size)]
    dist.all_gather(gathered, flat)
    assert all(torch.equal(g, gathered[0]) for g in gathered)
    dist.destroy_process_group()
    return True


@pytest.mark.parametrize("world_size", [2, 4])
def test_exact_ddp_matches_gloo(world_size):
    assert run_ranks(exact_worker, world_size) == [True] * world_size


def powersgd_worker(rank, world_size):
    import gossipcc
    dist.init_process_group("gossipcc", init_method=init_method(), rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=60))
    model = DDP(make_model(0), bucket_cap_mb=0.001)  # unmodified DDP code
    state = model._gossipcc_policy_state  # installed by the policy, not by this script
    backend = gossipcc.get_backend_object()
    before = backend.traffic()["collective_payload_bytes"]
    losses = train(model, rank, steps=30)
    stats = state.powersgd.total_stats
    sent = backend.traffic()["collective_payload_bytes"] - before
    dist.destroy_process_group()
    return losses, stats, sent


@pytest.mark.parametrize("world_size", [2, 4])
def test_powersgd_policy_compresses_and_trains(world_size):
    results = run_ranks(powersgd_worker, world_size, env={"GOSSIPCC_ALLREDUCE": "powersgd:rank=1,start_iter=2"})
    params = sum(p.numel() for p in make_model(0).parameters())
    for losses, stats, sent in results:
        assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5, losses
        assert stats["compressed_tensors"] > 0 and stats["compression_ratio"] > 1.5, stats
        # The compressed path really ran: far fewer bytes than exact all-reduces of every step.
        assert sent < 0.5 * 30 * params * 4, (sent, params)
        assert stats["bytes_before"] == 30 * params * 4, stats


def flat(module):
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()])


def policy_checkpoint_worker(rank, world_size):
    """The powersgd policy hook's state (error feedback, warm-start Q, per-key step counts) in a
    checkpoint: a run restored at step 6 continues exactly as the uninterrupted run."""
    import copy
    import gossipcc  # noqa: F401
    dist.init_process_group("gossipcc", init_method=init_method(), rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=60))

    def make(module):
        model = DDP(module, bucket_cap_mb=0.001)
        return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def run(model, opt, first, last):
        for step in range(first, last):
            x, y = batch(rank, step)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()

    model, opt = make(make_model(0))
    run(model, opt, 0, 6)  # start_iter=2: steps 2..5 compressed, with error feedback and warm start
    state = model._gossipcc_policy_state
    saved = copy.deepcopy({"model": model.module.state_dict(), "opt": opt.state_dict(), "policy": state.state_dict()})
    keys = gossipcc._C.PowerSGD.checkpoint_tensors(saved["policy"]["powersgd"])
    assert len(keys) == len(list(model.parameters())) and all(k[2] == 6 for k in keys.values()), keys
    run(model, opt, 6, 10)
    uninterrupted = flat(model.module)

    def resumed(load_policy):
        m, o = make(make_model(1))
        m.module.load_state_dict(saved["model"])
        o.load_state_dict(saved["opt"])
        if load_policy:
            m._gossipcc_policy_state.load_state_dict(saved["policy"])
        run(m, o, 6, 10)
        return flat(m.module)

    restored = resumed(True)
    assert torch.equal(restored, uninterrupted), (restored - uninterrupted).abs().max()
    # Without the hook's state (error memory and Q lost, step counts from 0) the run differs:
    # the state the checkpoint carries is what makes the two equal.
    assert not torch.equal(resumed(False), uninterrupted)

    # A checkpoint of another model is refused at load time, naming the parameter, and nothing
    # is loaded.
    other, _ = make(torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8),
                                        torch.nn.ReLU(), torch.nn.Linear(8, 4)))
    before = other._gossipcc_policy_state.state_dict()
    with pytest.raises(ValueError, match=r"param2 has shape \[16, 32\] float32 but this model's parameter 2 "
                                         r"has shape \[8, 32\] float32"):
        other._gossipcc_policy_state.load_state_dict(saved["policy"])
    assert other._gossipcc_policy_state.state_dict() == before
    smaller, _ = make(torch.nn.Linear(20, 4))
    with pytest.raises(ValueError, match=r"has key 'param\d' but this model has 2 parameters"):
        smaller._gossipcc_policy_state.load_state_dict(saved["policy"])
    with pytest.raises(ValueError, match="expected the dict state_dict"):
        smaller._gossipcc_policy_state.load_state_dict(saved["policy"]["powersgd"])
    dist.destroy_process_group()
    return True


def test_powersgd_policy_checkpoint_resumes_bit_for_bit():
    assert run_ranks(policy_checkpoint_worker, 2, env={"GOSSIPCC_ALLREDUCE": "powersgd:rank=1,start_iter=2"}) == [True] * 2
