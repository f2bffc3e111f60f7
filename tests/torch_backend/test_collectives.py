"""Every standard c10d collective through backend="gossipcc", checked against a reference
computed locally, for several world sizes, dtypes and sizes (0, 1, odd)."""
import datetime

import pytest
import torch
import torch.distributed as dist

from launcher import init_method, run_ranks

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16,
          torch.int8, torch.uint8, torch.int32, torch.int64, torch.bool]
SIZES = [0, 1, 1001]


def data(rank, n, dtype, small=False):
    """Rank-specific values that every reduction of every dtype represents exactly."""
    base = torch.arange(n, dtype=torch.int64)
    if dtype == torch.bool:
        return ((base + rank) % 3 == 0)
    if small:  # for products: 1 or 2
        return ((base + rank) % 2 + 1).to(dtype)
    return ((base * 3 + rank * 5) % 11).to(dtype)


def reference(op, tensors):
    stacked = torch.stack([t.to(torch.float64) for t in tensors])
    if tensors[0].dtype == torch.bool:
        stacked = stacked != 0
        return {dist.ReduceOp.SUM: stacked.any(0), dist.ReduceOp.MAX: stacked.any(0),
                dist.ReduceOp.MIN: stacked.all(0), dist.ReduceOp.PRODUCT: stacked.all(0)}[op]
    out = {dist.ReduceOp.SUM: stacked.sum(0), dist.ReduceOp.MAX: stacked.max(0).values,
           dist.ReduceOp.MIN: stacked.min(0).values, dist.ReduceOp.PRODUCT: stacked.prod(0),
           dist.ReduceOp.AVG: stacked.mean(0) if hasattr(dist.ReduceOp, "AVG") else None}[op]
    return out.to(tensors[0].dtype)


def check_equal(actual, expected, what):
    if actual.dtype in (torch.float16, torch.bfloat16) and actual.numel():
        ok = torch.allclose(actual.double(), expected.double(), rtol=1e-2, atol=1e-2)
    elif actual.dtype.is_floating_point and actual.numel():  # AVG divides: allow the last bit
        ok = actual.shape == expected.shape and torch.allclose(actual, expected, rtol=1e-6, atol=0)
    else:
        ok = torch.equal(actual, expected)
    assert ok, f"{what}: got {actual[:8]} expected {expected[:8]}"


def init(rank, world_size):
    import gossipcc  # noqa: F401 - registers the backend
    dist.init_process_group("gossipcc", init_method=init_method(), rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=60))


def collectives_worker(rank, world_size):
    init(rank, world_size)
    ws = world_size
    for dtype in DTYPES:
        floating = dtype.is_floating_point
        for n in SIZES:
            where = f"{dtype} n={n} rank {rank}/{ws}"
            # all_reduce, every op; AVG on floating types only
            ops = [dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.MIN, dist.ReduceOp.PRODUCT]
            if floating and hasattr(dist.ReduceOp, "AVG"):
                ops.append(dist.ReduceOp.AVG)
            for op in ops:
                small = op == dist.ReduceOp.PRODUCT
                t = data(rank, n, dtype, small)
                dist.all_reduce(t, op=op)
                check_equal(t, reference(op, [data(r, n, dtype, small) for r in range(ws)]),
                            f"all_reduce {op} {where}")
            # broadcast from the last rank
            t = data(rank, n, dtype)
            dist.broadcast(t, src=ws - 1)
            check_equal(t, data(ws - 1, n, dtype), f"broadcast {where}")
            # all_gather (list) and into one tensor
            outs = [torch.empty(n, dtype=dtype) for _ in range(ws)]
            dist.all_gather(outs, data(rank, n, dtype))
            for r in range(ws):
                check_equal(outs[r], data(r, n, dtype), f"all_gather[{r}] {where}")
            flat = torch.empty(ws * n, dtype=dtype)
            gather_base = getattr(dist, "all_gather_into_tensor", None) or dist._all_gather_base
            gather_base(flat, data(rank, n, dtype))
            check_equal(flat, torch.cat([data(r, n, dtype) for r in range(ws)]), f"all_gather_into_tensor {where}")
            # reduce to rank 0: root gets the sum, others keep their input
            t = data(rank, n, dtype)
            dist.reduce(t, dst=0)
            expected = reference(dist.ReduceOp.SUM, [data(r, n, dtype) for r in range(ws)]) if rank == 0 \
                else data(rank, n, dtype)
            check_equal(t, expected, f"reduce {where}")
            # gather / scatter at root ws-1
            root = ws - 1
            gl = [torch.empty(n, dtype=dtype) for _ in range(ws)] if rank == root else None
            dist.gather(data(rank, n, dtype), gather_list=gl, dst=root)
            if rank == root:
                for r in range(ws):
                    check_equal(gl[r], data(r, n, dtype), f"gather[{r}] {where}")
            out = torch.empty(n, dtype=dtype)
            sl = [data(r + 100, n, dtype) for r in range(ws)] if rank == root else None
            dist.scatter(out, scatter_list=sl, src=root)
            check_equal(out, data(rank + 100, n, dtype), f"scatter {where}")
            if dtype == torch.bool:
                continue  # reduce_scatter and all_to_all below are checked on numeric dtypes
            # reduce_scatter (list) and tensor form
            out = torch.empty(n, dtype=dtype)
            dist.reduce_scatter(out, [data(rank * ws + j, n, dtype) for j in range(ws)])
            check_equal(out, reference(dist.ReduceOp.SUM, [data(r * ws + rank, n, dtype) for r in range(ws)]),
                        f"reduce_scatter {where}")
            rs_base = getattr(dist, "reduce_scatter_tensor", None) or dist._reduce_scatter_base
            out = torch.empty(n, dtype=dtype)
            rs_base(out, torch.cat([data(rank * ws + j, n, dtype) for j in range(ws)]))
            check_equal(out, reference(dist.ReduceOp.SUM, [data(r * ws + rank, n, dtype) for r in range(ws)]),
                        f"reduce_scatter_tensor {where}")
            # all_to_all (list) and single with uneven splits
            outs = [torch.empty(n, dtype=dtype) for _ in range(ws)]
            dist.all_to_all(outs, [data(rank * ws + j, n, dtype) for j in range(ws)])
            for r in range(ws):
                check_equal(outs[r], data(r * ws + rank, n, dtype), f"all_to_all[{r}] {where}")
            send_splits = [(rank + j) % 3 for j in range(ws)]            # rows to rank j
            recv_splits = [(r + rank) % 3 for r in range(ws)]            # rows from rank r
            inp = torch.cat([data(rank * 10 + j, send_splits[j] * 2, dtype) for j in range(ws)]).view(-1, 2)
            out = torch.empty(sum(recv_splits), 2, dtype=dtype)
            dist.all_to_all_single(out, inp, output_split_sizes=recv_splits, input_split_sizes=send_splits)
            expected = torch.cat([data(r * 10 + rank, recv_splits[r] * 2, dtype) for r in range(ws)]).view(-1, 2)
            check_equal(out, expected, f"all_to_all_single {where}")
        # coalesced all-reduce of several tensors of one dtype
        if dtype != torch.bool:
            ts = [data(rank, k, dtype) for k in (3, 0, 17)]
            dist.all_reduce_coalesced(ts)
            for k, t in zip((3, 0, 17), ts):
                check_equal(t, reference(dist.ReduceOp.SUM, [data(r, k, dtype) for r in range(ws)]),
                            f"all_reduce_coalesced {dtype} n={k}")
    # point to point: a ring, sends and receives posted together, two tags
    if ws > 1:
        right, left = (rank + 1) % ws, (rank - 1) % ws
        got = [torch.empty(33), torch.empty(5)]
        reqs = [dist.isend(data(rank, 33, torch.float32), right, tag=1),
                dist.isend(data(rank + 50, 5, torch.float32), right, tag=2),
                dist.irecv(got[1], left, tag=2), dist.irecv(got[0], left, tag=1)]
        for r in reqs:
            r.wait()
        check_equal(got[0], data(left, 33, torch.float32), "recv tag 1")
        check_equal(got[1], data(left + 50, 5, torch.float32), "recv tag 2")
        ops = [dist.P2POp(dist.isend, data(rank, 7, torch.float64), right),
               dist.P2POp(dist.irecv, got64 := torch.empty(7, dtype=torch.float64), left)]
        for r in dist.batch_isend_irecv(ops):
            r.wait()
        check_equal(got64, data(left, 7, torch.float64), "batch_isend_irecv")
    # async work: the future completes with the output tensors
    t = torch.ones(4) * (rank + 1)
    work = dist.all_reduce(t, async_op=True)
    value = work.get_future().wait()
    assert isinstance(value, list) and value[0] is not None, value
    check_equal(value[0], torch.ones(4) * (ws * (ws + 1) / 2), "future value")
    assert work.is_completed() and work.is_success()
    dist.barrier()
    dist.destroy_process_group()
    return True


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_every_collective_matches_reference(world_size):
    assert run_ranks(collectives_worker, world_size, timeout=240) == [True] * world_size


def large_worker(rank, world_size):
    init(rank, world_size)
    n = 16 * 1024 * 1024  # 64 MB of float32
    t = torch.full((n,), float(rank + 1))
    dist.all_reduce(t)
    assert torch.all(t == world_size * (world_size + 1) / 2)
    out = torch.empty(world_size * (n // 4))
    gather_base = getattr(dist, "all_gather_into_tensor", None) or dist._all_gather_base
    gather_base(out, torch.full((n // 4,), float(rank)))
    for r in range(world_size):
        assert torch.all(out[r * (n // 4):(r + 1) * (n // 4)] == r)
    dist.destroy_process_group()
    return True


def test_64mb_allreduce_and_allgather():
    assert run_ranks(large_worker, 2) == [True, True]


def async_chain_worker(rank, world_size):
    init(rank, world_size)
    ws = world_size
    s = ws * (ws + 1) / 2
    n = 200_000  # above the eager and the direct sizes: the ring
    x = torch.full((n,), float(rank + 1), dtype=torch.float64)
    y = torch.full((n,), 10.0 * (rank + 1), dtype=torch.float64)
    gathered = [torch.empty(n // 2, dtype=torch.float64) for _ in range(ws)]
    works = [dist.all_reduce(x, async_op=True),          # x = s
             dist.all_reduce(y, async_op=True),          # disjoint from x: may overlap
             dist.all_reduce(x, async_op=True),          # x = ws * s: only after the first
             dist.broadcast(x[: n // 2], src=ws - 1, async_op=True),
             dist.all_gather(gathered, x[n // 2:], async_op=True),
             dist.all_reduce(y[: n // 4], op=dist.ReduceOp.MAX, async_op=True)]
    for w in reversed(works):
        w.wait()
    assert torch.all(x == ws * s), (x.min().item(), x.max().item())
    assert torch.all(y[: n // 4] == 10 * s) and torch.all(y[n // 4:] == 10 * s)
    for g in gathered:
        assert torch.all(g == ws * s)
    dist.destroy_process_group()
    return True


@pytest.mark.parametrize("lanes", [1, 2, 3])
def test_async_collectives_on_shared_memory_take_effect_in_issue_order(lanes):
    # Collectives run on GOSSIPCC_COLLECTIVE_LANES lanes (DDP's buckets overlap on the wire),
    # but one touching memory that an earlier one touches starts only after it.
    env = {"GOSSIPCC_COLLECTIVE_LANES": str(lanes)}
    assert run_ranks(async_chain_worker, 3, env=env) == [True] * 3
