"""What torch's Gloo backend accepts, gossipcc accepts with the right result: bitwise reductions
(BAND, BOR, BXOR) on integer and bool tensors, non-contiguous tensors in the collectives, and
(torch 2.x) the coalesced all_gather_into_tensor / reduce_scatter_tensor of _coalescing_manager.
The same cases run on both backends; gossipcc's results must equal a locally computed
reference, and every case gloo accepts gossipcc must accept. Bitwise ops on floating tensors are
refused by both, gossipcc naming the op and the dtype."""
import datetime

import pytest
import torch
import torch.distributed as dist

from launcher import init_method, run_ranks

TORCH2 = int(torch.__version__.split(".")[0]) >= 2
BITWISE = {"BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor}
INT_DTYPES = [torch.int8, torch.uint8, torch.int32, torch.int64, torch.bool]


def _init(rank, world_size, backend):
    if backend == "gossipcc":
        import gossipcc  # noqa: F401 - registers the backend
    dist.init_process_group(backend, init_method=init_method(), rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=60))


def _bits(rank, dtype):
    """Rank-specific bit patterns, the sign bit included for signed dtypes."""
    base = torch.tensor([0x5a, -1, 0x0f, 0x70, 3, -128], dtype=torch.int64) * (rank + 1) + rank
    if dtype == torch.bool:
        return (base % 3 == 0)
    return base.to(dtype)


# Every tensor a case hands to a collective, held until the group is destroyed. torch's Gloo worker
# thread releases a finished work (and its tensors) after the caller has returned; a tensor Python
# dropped meanwhile (a failed case, a temporary input) then needs the GIL to die, which
# destroy_process_group holds while it joins that thread: a deadlock seen on torch 2.6.
_HELD = []


def hold(tensor):
    _HELD.append(tensor)
    return tensor


def _destroy():
    dist.destroy_process_group()
    _HELD.clear()


def _run_cases(cases):
    """name -> ("ok", result tensors) or ("error", message); the ranks stay in step on errors
    because every case raises (or not) on every rank alike."""
    out = {}
    for name, fn in cases:
        try:
            out[name] = ("ok", fn())
        except Exception as e:  # noqa: BLE001 - the message is the result
            out[name] = ("error", str(e).splitlines()[0])
    return out


# A safety net far above a run's seconds on an idle machine (ranks import torch under load).
RANKS_TIMEOUT_S = 400


def bitwise_worker(rank, world_size, backend):
    _init(rank, world_size, backend)
    cases = []
    for op in BITWISE:
        for dtype in INT_DTYPES + [torch.float32]:
            def case(op=op, dtype=dtype):
                t = hold(_bits(rank, dtype) if dtype != torch.float32 else torch.ones(4))
                dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
                return [t]
            cases.append((f"all_reduce {op} {dtype}", case))

        def on_slice(op=op):  # a bitwise op on a strided view: the rest of the base untouched
            base = hold(torch.arange(12, dtype=torch.int32) * (rank + 2))
            dist.all_reduce(hold(base[1::3]), op=getattr(dist.ReduceOp, op))
            return [base]
        cases.append((f"all_reduce {op} strided int32", on_slice))
    out = _run_cases(cases)
    _destroy()
    return out


def _bitwise_reference(name, rank, world_size):
    parts = name.split()
    op = BITWISE[parts[1]]
    if parts[2] == "strided":
        bases = [torch.arange(12, dtype=torch.int32) * (r + 2) for r in range(world_size)]
        expected = bases[rank].clone()  # this rank's own values outside the slice
        acc = bases[0][1::3].clone()
        for b in bases[1:]:
            acc = op(acc, b[1::3])
        expected[1::3] = acc
        return [expected]
    dtype = getattr(torch, parts[2].replace("torch.", ""))
    acc = _bits(0, dtype)
    for r in range(1, world_size):
        acc = op(acc, _bits(r, dtype))
    return [acc]


@pytest.mark.parametrize("world_size", [2, 3])
def test_bitwise_ops_as_gloo(world_size):
    gloo = run_ranks(bitwise_worker, world_size, "gloo", timeout=RANKS_TIMEOUT_S)
    ours = run_ranks(bitwise_worker, world_size, "gossipcc", timeout=RANKS_TIMEOUT_S)
    for rank in range(world_size):
        for name, (status, value) in ours[rank].items():
            if "float32" in name:
                assert status == "error", f"{name}: accepted on gossipcc"
                assert gloo[rank][name][0] == "error", f"{name}: gloo accepts it"
                op = name.split()[1].lower()
                assert f"reduce op {op}" in value and "float32" in value, f"{name}: {value}"
                continue
            assert status == "ok", f"{name} on rank {rank}: gossipcc refused it: {value}"
            expected = _bitwise_reference(name, rank, world_size)
            assert all(torch.equal(a, b) for a, b in zip(value, expected)), f"{name}: got {value}, expected {expected}"


def noncontiguous_worker(rank, world_size, backend):
    _init(rank, world_size, backend)
    ws = world_size

    def grid(rows, cols, offset=0.0):
        return torch.arange(rows * cols, dtype=torch.float32).reshape(rows, cols) + 10 * rank + offset

    def all_reduce_t():
        t = hold(grid(3, 4).t())
        dist.all_reduce(t)
        return [t]

    def all_reduce_slice():
        base = hold(torch.arange(12, dtype=torch.float32) + rank)
        dist.all_reduce(hold(base[::2]))
        return [base]

    def broadcast_t():
        t = hold(grid(3, 4).t())
        dist.broadcast(t, src=ws - 1)
        return [t]

    def all_gather_t():
        outs = [hold(torch.zeros(3, 2).t()) for _ in range(ws)]
        dist.all_gather(outs, hold(grid(2, 3)))
        return outs

    def all_gather_in_t():
        outs = [hold(torch.zeros(3, 2)) for _ in range(ws)]
        dist.all_gather(outs, hold(grid(2, 3).t()))
        return outs

    def reduce_t():
        t = hold(grid(2, 3).t())
        dist.reduce(t, dst=0)
        return [t] if rank == 0 else []

    def scatter_t():
        out = hold(torch.zeros(2, 3).t())
        ins = [hold(torch.arange(6, dtype=torch.float32).reshape(3, 2) + i) for i in range(ws)] if rank == 0 else None
        dist.scatter(out, ins, src=0)
        return [out]

    def all_to_all_t():
        out = hold(torch.zeros(2 * ws, 2))
        dist.all_to_all_single(out, hold(grid(2, 2 * ws).t()))
        return [out]

    cases = [("all_reduce transposed", all_reduce_t), ("all_reduce strided slice", all_reduce_slice),
             ("broadcast transposed", broadcast_t), ("all_gather transposed outputs", all_gather_t),
             ("all_gather transposed input", all_gather_in_t), ("reduce transposed", reduce_t),
             ("scatter transposed output", scatter_t), ("all_to_all_single transposed input", all_to_all_t)]
    if TORCH2:
        def gather_into_t():
            out = hold(torch.zeros(ws * 6))
            dist.all_gather_into_tensor(out, hold(grid(2, 3).t()))
            return [out]

        def reduce_scatter_t():
            out = hold(torch.zeros(3, 2).t())
            dist.reduce_scatter_tensor(out, hold(grid(ws * 2, 3)))
            return [out]
        cases += [("all_gather_into_tensor transposed input", gather_into_t),
                  ("reduce_scatter_tensor transposed output", reduce_scatter_t)]
    out = _run_cases(cases)
    _destroy()
    return out


def _noncontiguous_reference(name, rank, ws):
    def grid(r, rows, cols):
        return torch.arange(rows * cols, dtype=torch.float32).reshape(rows, cols) + 10 * r
    total = lambda rows, cols: sum(grid(r, rows, cols) for r in range(ws))  # noqa: E731
    if name == "all_reduce transposed":
        return [total(3, 4).t()]
    if name == "all_reduce strided slice":
        base = torch.arange(12, dtype=torch.float32) + rank
        base[::2] = sum(torch.arange(12, dtype=torch.float32)[::2] + r for r in range(ws))
        return [base]
    if name == "broadcast transposed":
        return [grid(ws - 1, 3, 4).t()]
    if name == "all_gather transposed outputs":
        return [grid(r, 2, 3) for r in range(ws)]
    if name == "all_gather transposed input":
        return [grid(r, 2, 3).t() for r in range(ws)]
    if name == "reduce transposed":
        return [total(2, 3).t()] if rank == 0 else []
    if name == "scatter transposed output":
        return [(torch.arange(6, dtype=torch.float32).reshape(3, 2) + rank).reshape(3, 2)]
    if name == "all_to_all_single transposed input":
        return [torch.cat([grid(r, 2, 2 * ws).t()[2 * rank:2 * rank + 2] for r in range(ws)])]
    if name == "all_gather_into_tensor transposed input":
        return [torch.cat([grid(r, 2, 3).t().reshape(-1) for r in range(ws)])]
    if name == "reduce_scatter_tensor transposed output":
        return [total(ws * 2, 3)[2 * rank:2 * rank + 2]]
    raise KeyError(name)


@pytest.mark.parametrize("world_size", [2, 3])
def test_noncontiguous_tensors_as_gloo(world_size):
    gloo = run_ranks(noncontiguous_worker, world_size, "gloo", timeout=RANKS_TIMEOUT_S)
    ours = run_ranks(noncontiguous_worker, world_size, "gossipcc", timeout=RANKS_TIMEOUT_S)
    for rank in range(world_size):
        for name, (status, value) in ours[rank].items():
            if gloo[rank][name][0] == "ok" or status == "ok":
                assert status == "ok", f"{name} on rank {rank}: gloo accepts it, gossipcc refused: {value}"
            expected = _noncontiguous_reference(name, rank, world_size)
            assert len(value) == len(expected) and all(
                a.shape == b.shape and torch.equal(a, b) for a, b in zip(value, expected)), \
                f"{name} on rank {rank}: got {value}, expected {expected}"


def coalesced_worker(rank, world_size, backend):
    _init(rank, world_size, backend)
    ws = world_size
    sizes = [(3,), (2, 5), (1,), (4, 2)]

    def inputs(seed):
        g = torch.Generator().manual_seed(seed + rank)
        return [torch.randint(-50, 50, s, generator=g).to(torch.float32) for s in sizes]

    def gather():
        ins = inputs(0)
        ins[1] = ins[1].t().contiguous().t()  # a non-contiguous input among them
        outs = [torch.empty(ws * t.numel()) for t in ins]
        with dist._coalescing_manager():
            for o, i in zip(outs, ins):
                dist.all_gather_into_tensor(hold(o), hold(i))
        return outs

    def reduce_scatter(op):
        big = [torch.randint(-50, 50, (ws * t.numel(),), generator=torch.Generator().manual_seed(7 + rank + i))
               .to(torch.float32) for i, t in enumerate(inputs(0))]
        outs = [torch.empty(t.numel()) for t in inputs(0)]
        with dist._coalescing_manager():
            for o, i in zip(outs, big):
                dist.reduce_scatter_tensor(hold(o), hold(i), op=getattr(dist.ReduceOp, op))
        return outs

    results = _run_cases([("all_gather_into_tensor", gather)] +
                         [(f"reduce_scatter_tensor {op}", lambda op=op: reduce_scatter(op)) for op in ("SUM", "AVG")])
    _destroy()
    return results


@pytest.mark.skipif(not TORCH2, reason="torch 1.13 has no coalesced all_gather_into_tensor/reduce_scatter_tensor")
@pytest.mark.parametrize("world_size", [2, 3])
def test_coalesced_gather_and_reduce_scatter(world_size):
    ours = run_ranks(coalesced_worker, world_size, "gossipcc", timeout=RANKS_TIMEOUT_S)
    gloo = run_ranks(coalesced_worker, world_size, "gloo", timeout=RANKS_TIMEOUT_S)
    sizes = [3, 10, 1, 8]
    for rank in range(world_size):
        def ins(r):
            g = torch.Generator().manual_seed(r)
            return [torch.randint(-50, 50, s, generator=g).to(torch.float32) for s in [(3,), (2, 5), (1,), (4, 2)]]
        expected = [torch.cat([ins(r)[i].reshape(-1) for r in range(world_size)]) for i in range(4)]
        for name, (status, value) in ours[rank].items():
            assert status == "ok", f"{name} on rank {rank}: {value}"
        got = ours[rank]["all_gather_into_tensor"][1]
        assert all(torch.equal(a, b) for a, b in zip(got, expected)), f"all_gather_into_tensor rank {rank}: {got}"
        for op in ("SUM", "AVG"):
            bigs = [[torch.randint(-50, 50, (world_size * n,), generator=torch.Generator().manual_seed(7 + r + i))
                     .to(torch.float32) for i, n in enumerate(sizes)] for r in range(world_size)]
            exp = [sum(bigs[r][i] for r in range(world_size))[rank * n:(rank + 1) * n] for i, n in enumerate(sizes)]
            if op == "AVG":
                exp = [e / world_size for e in exp]
            got = ours[rank][f"reduce_scatter_tensor {op}"][1]
            assert all(torch.allclose(a, b, rtol=1e-6, atol=0) for a, b in zip(got, exp)), \
                f"reduce_scatter_tensor {op} rank {rank}: got {got}, expected {exp}"
            # Compared with gloo where gloo itself gives the reference: on torch 2.6 its coalesced
            # reduce-scatter does not (gossipcc's result is checked against the reference above).
            status, theirs = gloo[rank][f"reduce_scatter_tensor {op}"]
            gloo_right = status == "ok" and all(torch.allclose(a, b, rtol=1e-6, atol=0) for a, b in zip(theirs, exp))
            if gloo_right:
                assert all(torch.allclose(a, b, rtol=1e-6, atol=0) for a, b in zip(got, theirs)), "differs from gloo"
            else:
                print(f"gloo's coalesced reduce_scatter_tensor {op} on rank {rank} differs from the reference: {theirs}")
