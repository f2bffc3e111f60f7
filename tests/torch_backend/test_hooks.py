"""DDP comm hooks of gossipcc.hooks on 4 CPU ranks: the native PowerSGD hook (results equal the
native collective's on the same inputs, checkpoint/restore resumes, training converges) and
the D-PSGD gossip hook (local gradients, training converges, replicas stay close)."""
import copy
import datetime
import pickle

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from launcher import init_method, run_ranks

TEACHER = torch.randn(20, 4, generator=torch.Generator().manual_seed(7))


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16),
                               torch.nn.ReLU(), torch.nn.Linear(16, 4))


def batch(rank, step, skew=0.0):
    """Labels from a fixed linear teacher; each rank cycles 4 batches of its own.
    skew shifts each rank's inputs (non-identical data across ranks)."""
    g = torch.Generator().manual_seed(1000 * (step % 4) + rank)
    x = torch.randn(32, 20, generator=g) + skew * (rank - 1.5)
    return x, (x @ TEACHER).argmax(1)


def init(rank, world_size):
    import gossipcc
    dist.init_process_group("gossipcc", init_method=init_method(), rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=60))
    return gossipcc.get_backend_object()


def train_step(model, opt, rank, step, skew=0.0):
    x, y = batch(rank, step, skew)
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss.item()


def flat_params(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def powersgd_worker(rank, world_size):
    from gossipcc import _C
    from gossipcc.hooks import PowerSGDState, powerSGD_hook
    pg = init(rank, world_size)
    options = dict(matrix_approximation_rank=2, start_powerSGD_iter=3, min_compression_rate=0)

    # 1. Every compressed bucket's result equals the native collective's on the same inputs.
    model = DDP(make_model(), bucket_cap_mb=0.001)  # several buckets, rebuilt after iteration 1
    state = PowerSGDState(None, **options)
    records = []

    def recording_hook(st, bucket):
        compressing = st.iter >= st.start_powerSGD_iter
        grads = bucket.gradients()
        inputs = [g.clone() for g in grads]
        keys = st.parameter_keys(bucket.parameters())
        fut = powerSGD_hook(st, bucket)
        if not compressing:
            return fut

        def record(f):
            records.append((keys, inputs, [g.clone() for g in grads]))
            return f.value()
        return fut.then(record)

    model.register_comm_hook(state, recording_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = [train_step(model, opt, rank, s) for s in range(40)]
    assert records, "the compressed path never ran"
    reference = _C.PowerSGD(state.native.options)
    for keys, inputs, outputs in records:
        tensors = [t.clone() for t in inputs]
        pg.powersgd_allreduce(tensors, None, reference, keys).wait()
        for k, a, b in zip(keys, tensors, outputs):
            assert torch.equal(a, b), f"hook result for {k} differs from the native collective's"
    assert reference.state_dict() == state.native.state_dict()
    rate, before, after = state.compression_stats()
    assert rate > 1 and before > after > 0
    first, last = sum(losses[:4]) / 4, sum(losses[-4:]) / 4
    assert last < 0.5 * first, f"PowerSGD hook did not train: loss {first:.3f} -> {last:.3f}"
    # Replicas agree (PowerSGD averages: every rank applies the same gradient).
    every = [torch.empty_like(flat_params(model)) for _ in range(world_size)]
    dist.all_gather(every, flat_params(model))
    assert all(torch.allclose(e, every[0], atol=1e-6) for e in every)

    # 2. Checkpoint (pickle) after compression started; a fresh DDP + the restored state resumes
    # as the original run continues. A fresh state (no error memory, new Q) differs.
    module = make_model()
    ddp = DDP(module, bucket_cap_mb=0.001)
    st = PowerSGDState(None, **options)
    ddp.register_comm_hook(st, powerSGD_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for s in range(6):
        train_step(ddp, opt, rank, s)
    blob = pickle.dumps(st)
    params_ckpt = copy.deepcopy(module.state_dict())
    for s in range(6, 10):
        train_step(ddp, opt, rank, s)
    continued = flat_params(ddp)

    def resume(resumed_state):
        m = make_model(1)
        m.load_state_dict(params_ckpt)
        d = DDP(m, bucket_cap_mb=0.001)
        d.register_comm_hook(resumed_state, powerSGD_hook)
        o = torch.optim.SGD(d.parameters(), lr=0.1)
        for s in range(6, 10):
            train_step(d, o, rank, s)
        return flat_params(d), resumed_state

    restored_params, restored = resume(pickle.loads(blob))
    assert restored.iter == st.iter and restored.process_group is not None
    fresh = PowerSGDState(None, **options)
    fresh.iter = 6
    fresh_params, _ = resume(fresh)
    resumed_diff = float((restored_params - continued).abs().max())
    fresh_diff = float((fresh_params - continued).abs().max())
    assert resumed_diff < 1e-5, f"restored run differs from the continued one by {resumed_diff}"
    assert fresh_diff > 100 * max(resumed_diff, 1e-7), (resumed_diff, fresh_diff)
    dist.destroy_process_group()
    return losses[0], losses[-1]


def test_powersgd_hook_matches_native_collective_restores_and_trains():
    run_ranks(powersgd_worker, 4, timeout=150)


def gossip_worker(rank, world_size):
    from gossipcc.hooks import GossipHookState, gossip_hook
    init(rank, world_size)
    skew = 0.5  # ranks see differently distributed data: without mixing, replicas drift apart

    # Local gradient: on the first step (equal replicas after DDP's broadcast) the hook hands
    # DDP exactly the gradient a plain copy of the module computes on this rank's batch.
    model = DDP(make_model(), bucket_cap_mb=0.001)
    state = GossipHookState(graph="ring")
    model.register_comm_hook(state, gossip_hook)
    plain = make_model()
    x, y = batch(rank, 0, skew)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    torch.nn.functional.cross_entropy(plain(x), y).backward()
    for p, q in zip(model.parameters(), plain.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-7), "gossip_hook must return the local gradient"
    assert state.step == 1

    def run(hook, hook_state):
        m = DDP(make_model(), bucket_cap_mb=0.001)
        m.register_comm_hook(hook_state, hook)
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        losses = [train_step(m, opt, rank, s, skew) for s in range(60)]
        flat = flat_params(m)
        every = [torch.empty_like(flat) for _ in range(world_size)]
        dist.all_gather(every, flat)
        mean = sum(every) / world_size
        disagreement = max(float((e - mean).norm() / mean.norm()) for e in every)
        return losses, disagreement

    losses, gossip_disagreement = run(gossip_hook, GossipHookState(graph="ring"))

    def local_only(_, bucket):  # no communication at all: the control
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    _, local_disagreement = run(local_only, None)
    first, last = sum(losses[:4]) / 4, sum(losses[-4:]) / 4
    assert last < 0.5 * first, f"gossip hook did not train: loss {first:.3f} -> {last:.3f}"
    assert gossip_disagreement < 0.5 * local_disagreement, (gossip_disagreement, local_disagreement)
    restored = pickle.loads(pickle.dumps(GossipHookState(graph="complete", start_step=5)))
    assert restored.step == 5 and restored.graph == "complete"
    with pytest.raises(ValueError, match="valid graphs"):
        GossipHookState(graph="bogus")
    dist.destroy_process_group()
    return gossip_disagreement, local_disagreement


def test_gossip_hook_trains_and_keeps_replicas_close():
    results = run_ranks(gossip_worker, 4, timeout=150)
    print("relative disagreement of replicas (gossip, local only):", results[0])


def user_hook_under_policy_worker(rank, world_size):
    import gossipcc  # noqa: F401
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    dist.init_process_group("gossipcc", init_method=init_method(), rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=30))
    model = DDP(torch.nn.Linear(4, 4))
    try:
        model.register_comm_hook(None, default_hooks.allreduce_hook)
        outcome = "registered"
    except RuntimeError as e:
        outcome = str(e)
    dist.destroy_process_group()
    return outcome


def test_user_comm_hook_under_powersgd_policy_is_refused_naming_the_policy():
    # DDP takes one comm hook and gossipcc registered one for the policy: the error says so,
    # where the policy was set, and how to use one's own hook.
    for msg in run_ranks(user_hook_under_policy_worker, 2, env={"GOSSIPCC_ALLREDUCE": "powersgd:rank=1"}):
        assert "register_comm_hook(allreduce_hook): this DDP model already has a comm hook, which gossipcc " \
               "registered" in msg, msg
        assert "policy is 'powersgd:rank=1," in msg and "(from GOSSIPCC_ALLREDUCE)" in msg, msg
        assert "GOSSIPCC_ALLREDUCE=exact" in msg, msg
    # Under "exact" the user's hook is DDP's only one.
    assert run_ranks(user_hook_under_policy_worker, 2, env={"GOSSIPCC_ALLREDUCE": "exact"}) == ["registered"] * 2
