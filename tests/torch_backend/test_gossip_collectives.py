"""gossipcc's own collectives on the process group (push_sum_round, symmetric_gossip_round,
bilateral_exchange, async bilateral exchange, powersgd_allreduce) and the ElasticAveraging /
UnevenAllReduceSGD bindings, each checked against a reference computed locally from every
rank's deterministic inputs, plus the invariants the algorithms guarantee and the errors."""
import datetime

import pytest
import torch
import torch.distributed as dist

from launcher import init_method, run_ranks

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
TOL = {torch.float32: 1e-6, torch.float64: 1e-12, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
SIZES = [0, 1, 1001]


def init(rank, world_size):
    import gossipcc
    dist.init_process_group("gossipcc", init_method=init_method(), rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=30))
    return gossipcc.get_backend_object()


def rank_data(rank, sizes, dtype):
    """Rank-specific tensors, exactly representable in every float dtype."""
    return [((torch.arange(s, dtype=torch.float64) * 3 + rank * 7) % 13 - 6).to(dtype) for s in sizes]


def flat64(tensors):
    return torch.cat([t.reshape(-1).double() for t in tensors]) if tensors else torch.zeros(0, dtype=torch.float64)


def gather_all(x):
    """Every rank's float64 vector (x has the same size on every rank)."""
    out = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(out, x)
    return out


def close(actual, expected, dtype, what):
    tol = TOL[dtype]
    scale = max(1.0, float(expected.abs().max())) if expected.numel() else 1.0
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} vs {expected.shape}"
    err = float((actual - expected).abs().max()) if actual.numel() else 0.0
    assert err <= tol * scale * 4, f"{what}: max error {err} (tolerance {tol * scale * 4})\n{actual[:6]}\n{expected[:6]}"


def push_sum_reference(xs, ws, spec, n, step, keep):
    from gossipcc import _C
    new_x = [torch.zeros_like(xs[0]) for _ in range(n)]
    new_w = [0.0] * n
    for j in range(n):
        out = _C.peer_graph_out_peers(spec, n, j, step)
        if keep is None or not out:
            self_share = 1.0 / (len(out) + 1)
            shares = [1.0 / (len(out) + 1)] * len(out)
        else:
            self_share = keep
            shares = [(1.0 - keep) / len(out)] * len(out)
        new_x[j] += self_share * xs[j]
        new_w[j] += self_share * ws[j]
        for p, s in zip(out, shares):
            new_x[p] += s * xs[j]
            new_w[p] += s * ws[j]
    return new_x, new_w


def symmetric_reference(xs, spec, n, step):
    from gossipcc import _C
    out = []
    for i in range(n):
        peers = _C.peer_graph_out_peers(spec, n, i, step)
        weights = _C.symmetric_gossip_weights(spec, n, i, step)
        v = weights[0] * xs[i]
        for p, w in zip(peers, weights[1:]):
            v = v + w * xs[p]
        out.append(v)
    return out


def bilateral_reference(xs, matching, n, step):
    from gossipcc import _C
    out = []
    for i in range(n):
        p = _C.bilateral_partner(matching, n, i, step)
        out.append(xs[i] if p < 0 else (xs[i] + xs[p]) / 2)
    return out


def graphs_for(n):
    specs = [("exponential", None), ("ring:directed=1", 0.6), ("complete", None), ("exponential:peers=2", 0.5)]
    return specs


def round_trip_worker(rank, n):
    """Every round-based collective, every float dtype, sizes 0/1/odd, against the reference."""
    from gossipcc import _C
    pg = init(rank, n)
    results = {}
    for dtype in FLOATS:
        sizes = SIZES if dtype in (torch.float32, torch.float64) else [0, 1, 33]
        # push-sum: several rounds, reference from the gathered actual values of the round before
        for spec, keep in graphs_for(n):
            x = rank_data(rank, sizes, dtype)
            w = torch.ones(1, dtype=torch.float64)
            total_x0 = sum(gather_all(flat64(x)))
            for step in range(3):
                before = gather_all(flat64(x))
                w_before = [float(v) for v in gather_all(w.clone())]
                work = pg.push_sum_round(x, w, step, graph=spec, keep=keep)
                assert work.wait()
                value = work.get_future().wait()
                assert len(value) == len(x) + 1 and torch.equal(value[-1], w)
                exp_x, exp_w = push_sum_reference(before, w_before, spec, n, step, keep)
                close(flat64(x), exp_x[rank], dtype, f"push_sum {spec} keep={keep} {dtype} step {step} rank {rank}")
                assert abs(float(w) - exp_w[rank]) < 1e-12, (spec, step, float(w), exp_w[rank])
            all_w = [float(v) for v in gather_all(w.clone())]
            assert abs(sum(all_w) - n) < 1e-9, f"push-sum weights sum to {sum(all_w)}, not {n}"
            total_x = sum(gather_all(flat64(x)))
            close(total_x, total_x0, dtype, f"push_sum sum of x conserved {spec} {dtype}")
        # symmetric gossip (D-PSGD)
        for spec in ["ring", "complete"] + (["hypercube"] if n & (n - 1) == 0 else []):
            x = rank_data(rank, sizes, dtype)
            for step in range(2):
                before = gather_all(flat64(x))
                pg.symmetric_gossip_round(x, step, graph=spec).wait()
                exp = symmetric_reference(before, spec, n, step)
                close(flat64(x), exp[rank], dtype, f"symmetric {spec} {dtype} step {step} rank {rank}")
        # bilateral exchange
        matchings = ["round_robin"] + (["bipartite"] if n % 2 == 0 or n == 1 else []) + \
            (["hypercube"] if n & (n - 1) == 0 else [])
        for matching in matchings:
            x = rank_data(rank, sizes, dtype)
            for step in range(3):
                before = gather_all(flat64(x))
                pg.bilateral_exchange(x, step, matching=matching).wait()
                exp = bilateral_reference(before, matching, n, step)
                close(flat64(x), exp[rank], dtype, f"bilateral {matching} {dtype} step {step} rank {rank}")
                partner = _C.bilateral_partner(matching, n, rank, step)
                after = gather_all(flat64(x))  # collective: every rank, idle or not
                if partner >= 0:  # both partners end bitwise equal
                    assert torch.equal(after[rank], after[partner]), f"bilateral {matching} step {step}"
        results[str(dtype)] = True
    dist.barrier()
    return results


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_round_collectives_match_reference(world_size):
    results = run_ranks(round_trip_worker, world_size, timeout=90)
    assert all(len(r) == len(FLOATS) for r in results)


def ordering_and_powersgd_worker(rank, n):
    """powersgd_allreduce against the synchronous binding and the exact mean; gossip collectives
    interleaved with plain collectives without waiting (the lane keeps them in order)."""
    from gossipcc import _C
    pg = init(rank, n)
    gen = torch.Generator().manual_seed(1234 + rank)
    grads = [torch.randn(6, 4, generator=gen), torch.randn(5, generator=gen), torch.randn(3, 2, 2, generator=gen)]
    everyone = gather_all(flat64(grads))
    exact_mean = sum(everyone) / n
    # rank >= min(rows, cols) of every matrix: PowerSGD reproduces the mean (up to float32 rounding)
    opts = "rank=4,start_iter=0,min_compression_rate=0"
    native, sync = _C.PowerSGD(opts), _C.PowerSGD(opts)
    a = [g.clone() for g in grads]
    b = [g.clone() for g in grads]
    keys = ["w", "b", "conv"]
    w1 = pg.powersgd_allreduce(a, None, native, keys)
    w1.wait()
    sync.allreduce(pg, b, keys)
    for x, y in zip(a, b):
        assert torch.equal(x, y), "powersgd_allreduce differs from PowerSGD.allreduce on the same inputs"
    assert native.last_stats["compressed_tensors"] == 2
    close(flat64(a), exact_mean, torch.float32, "powersgd full rank vs exact mean")
    # explicit shapes: the 3x2x2 tensor viewed as 3x4, the 6x4 as 4x6
    c = [g.clone() for g in grads]
    st = _C.PowerSGD(opts)
    pg.powersgd_allreduce(c, [[4, 6], [5], [3, 4]], st).wait()
    close(flat64(c), exact_mean, torch.float32, "powersgd with explicit shapes vs exact mean")
    # before start_iter: the exact mean
    d = [g.clone() for g in grads]
    pg.powersgd_allreduce(d, None, _C.PowerSGD("rank=1,start_iter=5")).wait()
    close(flat64(d), exact_mean, torch.float32, "powersgd before start_iter is exact")
    # low rank with error feedback over several steps: state advances identically to the sync binding
    low_a, low_b = _C.PowerSGD("rank=1,start_iter=0,min_compression_rate=0"), \
        _C.PowerSGD("rank=1,start_iter=0,min_compression_rate=0")
    for _ in range(3):
        e = [g.clone() for g in grads]
        f = [g.clone() for g in grads]
        pg.powersgd_allreduce(e, None, low_a, keys).wait()
        low_b.allreduce(pg, f, keys)
        for x, y in zip(e, f):
            assert torch.equal(x, y)
    assert low_a.state_dict() == low_b.state_dict()

    # Ordering: PowerSGD (collectives on the lane), a plain all_reduce, push-sum, another
    # PowerSGD and an all_gather, all issued before any wait.
    works = []
    p1 = [g.clone() for g in grads]
    works.append(pg.powersgd_allreduce(p1, None, _C.PowerSGD(opts), keys))
    t = torch.full((10,), float(rank))
    works.append(dist.all_reduce(t, async_op=True))
    x = [torch.full((9,), float(rank))]
    w = torch.ones(1, dtype=torch.float64)
    works.append(pg.push_sum_round(x, w, 0, graph="ring"))
    p2 = [g.clone() * 2 for g in grads]
    works.append(pg.powersgd_allreduce(p2, None, _C.PowerSGD(opts), keys))
    gathered = [torch.empty(3) for _ in range(n)]
    works.append(dist.all_gather(gathered, torch.full((3,), float(rank)), async_op=True))
    for wk in works:
        wk.wait()
    close(flat64(p1), exact_mean, torch.float32, "interleaved powersgd 1")
    close(flat64(p2), exact_mean * 2, torch.float32, "interleaved powersgd 2")
    assert torch.equal(t, torch.full((10,), float(sum(range(n)))))
    for r in range(n):
        assert torch.equal(gathered[r], torch.full((3,), float(r)))
    total = sum(gather_all(flat64(x)))
    assert abs(float(total.sum()) - 9 * sum(range(n))) < 1e-3
    dist.barrier()
    return True


@pytest.mark.parametrize("world_size", [1, 4])
def test_powersgd_allreduce_and_ordering(world_size):
    run_ranks(ordering_and_powersgd_worker, world_size, timeout=90)


def async_bilateral_worker(rank, n, exchanges):
    from gossipcc import _C
    pg = init(rank, n)
    x = [torch.full((17,), float(rank + 1), dtype=torch.float64), torch.full((4,), float(10 * rank), dtype=torch.float64)]
    start_total = sum(gather_all(flat64(x)))
    peers = []
    if rank % 2 == 1:
        expected_peers = _C.async_bilateral_passive_peers(rank, n)
        for k in range(exchanges):
            work = pg.async_bilateral_exchange(x)
            work.wait()
            peer = work._source_rank() if hasattr(work, "_source_rank") else work.source_rank()
            assert peer == expected_peers[k % len(expected_peers)], (k, peer, expected_peers)
            assert pg.async_bilateral_stats()["last_peer"] == peer
            peers.append(peer)
        pg.async_bilateral_finish(x).wait()
        assert pg.async_bilateral_stats()["exchanges"] == exchanges
    else:
        # A passive rank that trains meanwhile would serve a side copy of its parameters (see
        # docs/pytorch.md); here it serves the tensors themselves until every active rank is done.
        work = pg.async_bilateral_serve(x, max_requests=-1)
        work.wait()
        stats = pg.async_bilateral_stats()
        assert stats["all_active_finished"]
        peers = stats["exchanges"]
    end_total = sum(gather_all(flat64(x)))
    close(end_total, start_total, torch.float64, "async bilateral conserves the sum")
    dist.barrier()
    return peers


@pytest.mark.parametrize("world_size", [2, 4])
def test_async_bilateral_exchange(world_size):
    exchanges = 5
    results = run_ranks(async_bilateral_worker, world_size, exchanges, timeout=90)
    # every request an active rank made was answered by the passive rank it names
    served = {r: results[r] for r in range(0, world_size, 2)}
    requested = {}
    for r in range(1, world_size, 2):
        for p in results[r]:
            requested[p] = requested.get(p, 0) + 1
    assert served == {p: requested.get(p, 0) for p in served}


def elastic_and_uneven_worker(rank, n):
    from gossipcc import _C
    pg = init(rank, n)
    # Elastic averaging: params <- rank 0's at initialize; sum_i x_i + center conserved.
    params = [torch.full((5,), float(rank), dtype=torch.float64), torch.full((3,), float(-rank), dtype=torch.float64)]
    ea = _C.ElasticAveraging(tau=2, alpha=0.25)
    ea.initialize(pg, params)
    assert torch.equal(flat64(params), torch.zeros(8, dtype=torch.float64))
    averaged = []
    for step in range(4):
        with torch.no_grad():
            for p in params:
                p.add_(float(rank + 1) * (step + 1))  # a rank-specific "optimizer step"
        invariant_before = sum(gather_all(flat64(params))) + ea.center
        averaged.append(ea.step(pg, params))
        invariant_after = sum(gather_all(flat64(params))) + ea.center
        # every rank holds the same center c: sum_i x_i + c is conserved by an averaging
        close(invariant_after, invariant_before, torch.float64, "EASGD sum_i x_i + c conserved")
        centers = gather_all(ea.center)
        assert all(torch.equal(c, centers[0]) for c in centers), "every rank's center is identical"
    assert averaged == [False, True, False, True]
    state = ea.state_dict()
    assert state["step"] == 4 and state["tau"] == 2
    ea2 = _C.ElasticAveraging(tau=2, alpha=0.25)
    ea2.load_state_dict(state)
    p_a = [p.clone() for p in params]
    p_b = [p.clone() for p in params]
    ea.average(pg, p_a)
    ea2.average(pg, p_b)
    assert all(torch.equal(a, b) for a, b in zip(p_a, p_b)), "restored EASGD state resumes identically"
    with pytest.raises(ValueError, match="tau"):
        _C.ElasticAveraging(tau=3, alpha=0.25).load_state_dict(state)

    # Uneven all-reduce SGD: rank r runs r + 1 steps.
    sgd = _C.UnevenAllReduceSGD()
    steps = rank + 1
    contributors = []
    for s in range(steps):
        g = [torch.full((4,), float(rank + 1)), torch.full((2,), float(s))]
        c, still = sgd.sum_and_normalize(pg, g)
        active = [r for r in range(n) if r + 1 > s]
        assert c == len(active), (s, c, active)
        assert torch.allclose(g[0], torch.full((4,), sum(r + 1 for r in active) / len(active)))
        contributors.append(c)
    scratch = [torch.zeros(4), torch.zeros(2)]
    while sgd.join_until_all_done(pg, scratch):
        pass
    params = [torch.full((6,), 1.0 / (rank + 3))]
    sgd.synchronize_parameters(pg, params)
    every = gather_all(params[0].double())
    assert all(torch.equal(e, every[0]) for e in every), "uneven-steps run ends bitwise equal"
    assert sgd.state_dict()["steps_contributed"] == steps
    dist.barrier()
    return contributors


@pytest.mark.parametrize("world_size", [1, 3])
def test_elastic_averaging_and_uneven_sgd(world_size):
    run_ranks(elastic_and_uneven_worker, world_size, timeout=90)


def errors_worker(rank, n):
    from gossipcc import _C
    pg = init(rank, n)
    x = [torch.zeros(4)]
    w = torch.ones(1, dtype=torch.float64)
    cases = [
        (lambda: pg.push_sum_round(x, w, 0, graph="nope"), "valid graphs: exponential"),
        (lambda: pg.push_sum_round(x, w, 0, graph="ring:directed=2"), "ring"),
        (lambda: pg.push_sum_round(x, w, -1), "step must be >= 0"),
        (lambda: pg.push_sum_round(x, torch.ones(1), 0), "1-element float64 CPU tensor"),
        (lambda: pg.push_sum_round(x, torch.ones(2, dtype=torch.float64), 0), "1-element float64"),
        (lambda: pg.push_sum_round(x, w, 0, keep=1.5), "keep must be in"),
        (lambda: pg.push_sum_round(x, w, 0, keep=0.0), "keep must be in"),
        (lambda: pg.push_sum_round([], w, 0), "empty tensor list"),
        (lambda: pg.push_sum_round([torch.zeros(3), torch.zeros(3, dtype=torch.float64)], w, 0),
         "all must share dtype and device"),
        (lambda: pg.push_sum_round([torch.zeros(4, 4).t()], w, 0), "contiguous"),
        (lambda: pg.push_sum_round([torch.zeros(4, dtype=torch.int32)], w, 0), "float32, float64, float16 or bfloat16"),
        (lambda: pg.symmetric_gossip_round(x, 0, graph="ring:directed=1"), "not symmetric"),
        (lambda: pg.symmetric_gossip_round(x, -3), "step must be >= 0"),
        (lambda: pg.bilateral_exchange(x, 0, matching="complete"), "not a matching"),
        (lambda: pg.bilateral_exchange(x, 0, matching="bogus"), "round_robin"),
        (lambda: pg.bilateral_exchange(x, 0, matching="bipartite"), "needs an even number of ranks, got 3"),
        (lambda: pg.powersgd_allreduce(x, [[3]], _C.PowerSGD("")), "has 3 elements but tensor[0] has 4"),
        (lambda: pg.powersgd_allreduce(x, [[4], [4]], _C.PowerSGD("")), "1 tensors but 2 shapes"),
        (lambda: pg.powersgd_allreduce(x, None, _C.PowerSGD(""), ["a", "b"]), "keys"),
        (lambda: pg.async_bilateral_serve(x, -2) if rank % 2 == 0 else pg.async_bilateral_finish([]),
         "max_requests" if rank % 2 == 0 else "empty tensor list"),
        (lambda: pg.async_bilateral_exchange(x) if rank % 2 == 0 else pg.async_bilateral_serve(x),
         "passive (even)" if rank % 2 == 0 else "active (odd)"),
        (lambda: dist.send(torch.zeros(1), (rank + 1) % n, tag=0x50534d00), "reserved"),
        (lambda: _C.peer_graph_out_peers("ring", 4, 7, 0), "not in a world of size 4"),
        (lambda: _C.ElasticAveraging(tau=0, alpha=0.5), "tau"),
    ]
    for fn, needle in cases:
        try:
            fn()
        except ValueError as e:  # InvalidArgumentError is a ValueError (and a gossipcc CommError)
            assert needle in str(e), f"expected {needle!r} in: {e}"
            continue
        except RuntimeError as e:  # raised inside torch's own bindings (dist.send)
            assert needle in str(e), f"expected {needle!r} in: {e}"
            continue
        raise AssertionError(f"no error for case expecting {needle!r}")
    # The collectives still work after the rejected calls.
    pg.push_sum_round(x, w, 0).wait()
    # Ranks disagreeing on the size: a MismatchError through work.wait(), naming the algorithm.
    if n > 1:
        bad = [torch.zeros(4 + rank)]
        work = pg.symmetric_gossip_round(bad, 0, graph="ring")
        with pytest.raises(RuntimeError, match="symmetric_gossip"):
            work.wait()
    return True


@pytest.mark.parametrize("world_size", [3])
def test_errors_are_clear(world_size):
    run_ranks(errors_worker, world_size, timeout=90)
