"""ProcessGroupGossipcc.quantized_allreduce (compression/quantized_allreduce.h) from Python, against a
reference computed here with torch (block scale max|x| / Q, round half to even, float32 sums in
rank order): the same bits on every rank and equal to the reference, within the header's bound of
the exact average; several tensors as one vector; error feedback through residual tensors; ordered
with the group's other collectives; bad input fails the Work on every rank, nothing modified.
"""
import pytest
import torch
import torch.distributed as dist

from launcher import init_method, run_ranks
from quantized_reference import reference


def init(rank, world_size):
    import datetime
    import gossipcc  # noqa: F401
    dist.init_process_group("gossipcc", init_method=init_method(), rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=60))
    return gossipcc.get_backend_object()


def make_input(rank, count, seed=0):
    g = torch.Generator().manual_seed(1000 * seed + rank)
    x = torch.randn(count, generator=g)
    # Block maxima over several binades.
    scale = torch.pow(2.0, (torch.arange(count) // 256 + rank) % 7 - 3.0)
    return (x * scale).float()


def bound(inputs, bits, block, average):
    """Per element: the header's E_sum or E_avg."""
    n = len(inputs)
    rel = 1.0 / (2 ** (bits - 1) - 1) + (n + 32) * 2.0 ** -24
    count = inputs[0].numel()
    maxima = torch.zeros(count, dtype=torch.float64)
    for x in inputs:
        for start in range(0, count, block):
            maxima[start:start + block] += x[start:start + block].abs().max().double()
    b = rel * maxima
    return (b / n if average else b) + 2.0 ** -96


COUNTS = (0, 1, 300, 256 * 9 + 5, 300_001)


def main_worker(rank, world_size):
    pg = init(rank, world_size)
    results = {}
    for bits in (8, 4):
        for average in (True, False):
            for count in COUNTS:
                inputs = [make_input(r, count) for r in range(world_size)]
                x = inputs[rank].clone()
                work = pg.quantized_allreduce([x], bits, average)
                work.wait()
                want = reference(inputs, bits, 256, average)
                exact = torch.stack([t.double() for t in inputs]).sum(0)
                if average:
                    exact /= world_size
                err = (x.double() - exact).abs()
                ratio = (err / bound(inputs, bits, 256, average)).max().item() if count else 0.0
                results[(bits, average, count)] = (torch.equal(x.view(torch.int32), want.view(torch.int32)), ratio,
                                                   x.view(torch.int32).sum().item())
    # Several tensors are one vector; the future's value is the tensors.
    inputs = [make_input(r, 1000, 1) for r in range(world_size)]
    parts = list(inputs[rank].clone().split([100, 600, 300]))
    work = pg.quantized_allreduce(parts, bits=4, average=True)
    value = work.get_future().wait()
    several = (torch.equal(torch.cat(parts), reference(inputs, 4, 256, True)), len(value))
    # Ordered with the group's collectives: an all-reduce issued after it sees its result.
    y = make_input(rank, 5000, 2)
    w1 = pg.quantized_allreduce([y], 8, True)
    w2 = dist.all_reduce(y, async_op=True)
    w1.wait()
    w2.wait()
    # (to float32 rounding: the exact all-reduce sums the n equal copies in its own order)
    quantized = reference([make_input(r, 5000, 2) for r in range(world_size)], 8, 256, True)
    ordered = torch.allclose(y, quantized * world_size, rtol=1e-6, atol=0)
    dist.destroy_process_group()
    return results, several, ordered


@pytest.mark.parametrize("world_size", [1, 3, 4])
def test_matches_reference_on_every_rank(world_size):
    out = run_ranks(main_worker, world_size)
    for key in out[0][0]:
        bits, average, count = key
        for rank, (results, _, _) in enumerate(out):
            equal, ratio, checksum = results[key]
            assert equal, f"{key}, rank {rank}: differs from the reference"
            assert ratio <= 1.0, f"{key}, rank {rank}: error {ratio} x the bound"
            assert checksum == out[0][0][key][2], f"{key}: rank {rank}'s bits differ from rank 0's"
    for rank, (_, several, ordered) in enumerate(out):
        assert several == (True, 3), f"rank {rank}: {several}"
        assert ordered, f"rank {rank}: the all-reduce issued after the quantized one did not see its result"


def feedback_worker(rank, world_size, calls):
    """Biased inputs (between two levels): running sums of outputs vs exact averages."""
    pg = init(rank, world_size)
    count = 700
    residual, owned = torch.zeros(count), torch.zeros(count)
    sum_out = {True: torch.zeros(count, dtype=torch.float64), False: torch.zeros(count, dtype=torch.float64)}
    sum_exact = torch.zeros(count, dtype=torch.float64)

    def value(r, k):
        v = 0.3 + 0.02 * r + 0.01 * torch.sin(torch.arange(count) * 0.7 + 1.3 * k + r)
        v[::256] = 1.0
        return v.float()

    for k in range(calls):
        sum_exact += torch.stack([value(r, k).double() for r in range(world_size)]).mean(0)
        for fb in (True, False):
            x = value(rank, k)
            if fb:
                pg.quantized_allreduce([x], 4, True, residual, owned).wait()
            else:
                pg.quantized_allreduce([x], 4, True).wait()
            sum_out[fb] += x.double()
    drift = {fb: (sum_out[fb] - sum_exact).abs().max().item() for fb in (True, False)}
    dist.destroy_process_group()
    return drift, residual.abs().max().item()


def test_error_feedback_keeps_the_running_sum_close():
    world_size = 3
    per_call = (1 / 7 + (world_size + 32) * 2.0 ** -24) * world_size / world_size  # block maxima are 1
    for rank, (drift, res) in enumerate(run_ranks(feedback_worker, world_size, 200)):
        assert drift[True] <= 2 * per_call, f"rank {rank}: with feedback drifted {drift[True]}"
        assert drift[False] > 10 * per_call, f"rank {rank}: without feedback only {drift[False]}"
        assert 0 < res <= per_call, f"rank {rank}: residual {res}"


def bad_worker(rank, world_size):
    import gossipcc
    pg = init(rank, world_size)
    cases = {
        "bits 3 on rank 1": dict(bits=3 if rank == 1 else 8),
        "bits 5 everywhere": dict(bits=5),
        "bits differ": dict(bits=8 if rank == 0 else 4),
        "count differs": dict(count=999 if rank == 1 else 1000),
        "float64": dict(dtype=torch.float64),
        "float16 on rank 0": dict(dtype=torch.float16 if rank == 0 else torch.float32),
        "residual too short": dict(residual=999 if rank == 0 else 1000),
        "owned residual too short": dict(residual=1000, owned=999 if rank == 1 else 1000),
        "owned residual float64": dict(residual=1000, owned_dtype=torch.float64 if rank == 0 else torch.float32),
    }
    outcomes = {}
    for name, c in cases.items():
        count = c.get("count", 1000)
        x = torch.linspace(-1, 1, count).to(c.get("dtype", torch.float32))
        before = x.clone()
        args = {}
        if "residual" in c:
            args = dict(residual=torch.zeros(c["residual"]),
                        owned_residual=torch.zeros(c.get("owned", count), dtype=c.get("owned_dtype", torch.float32)))
        try:
            pg.quantized_allreduce([x], c.get("bits", 8), True, **args).wait()
            outcome = "no error"
        except (RuntimeError, ValueError) as e:
            outcome = str(e)
        untouched = torch.equal(x, before) and all(bool((r == 0).all()) for r in args.values())
        outcomes[name] = (outcome, untouched)
    # Synchronous: a non-contiguous tensor (this rank alone can tell).
    try:
        pg.quantized_allreduce([torch.zeros(10, 10).t()], 8, True)
        outcomes["non-contiguous"] = ("no error", True)
    except gossipcc.InvalidArgumentError as e:
        outcomes["non-contiguous"] = (str(e), True)
    # Synchronous: one error-feedback residual without the other.
    x = torch.ones(10)
    try:
        pg.quantized_allreduce([x], 8, True, torch.zeros(10), None)
        outcomes["residual alone"] = ("no error", True)
    except gossipcc.InvalidArgumentError as e:
        outcomes["residual alone"] = (str(e), torch.equal(x, torch.ones(10)))
    # Usable afterwards.
    x = torch.ones(10)
    pg.quantized_allreduce([x], 8, False).wait()
    outcomes["after"] = (str(x.tolist()), True)
    dist.destroy_process_group()
    return outcomes


def test_bad_input_fails_on_every_rank():
    words = {
        "bits 3 on rank 1": "rank 1: bits must be 4 or 8, got 3",
        "bits 5 everywhere": "bits must be 4 or 8, got 5",
        "bits differ": "ranks disagree on the bits: rank 0: 8, rank 1: 4",
        "count differs": "ranks disagree on the element count",
        "float64": "only float32 is supported, got float64",
        "float16 on rank 0": "rank 0: only float32 is supported, got float16",
        "residual too short": "rank 0: the error-feedback residuals must",
        "owned residual too short": "rank 1: the error-feedback residuals must",
        "owned residual float64": "rank 0: the error-feedback residuals must both be float32 CPU buffers",
        "non-contiguous": "contiguous",
        "residual alone": "pass both residual and owned_residual",
        "after": str([2.0] * 10),
    }
    for rank, outcomes in enumerate(run_ranks(bad_worker, 2)):
        for name, (outcome, unchanged) in outcomes.items():
            assert words[name] in outcome, f"{name}, rank {rank}: {outcome}"
            assert unchanged, f"{name}, rank {rank}: the tensor or a residual was modified"
