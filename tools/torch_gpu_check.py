"""The c10d backend on CUDA tensors, one rank on one GPU (tools/torch_gpu_check.sh runs it).

Prints one line per check and exits 1 if one failed. Checks:
  - collectives on CUDA tensors of each dtype against their reference;
  - the caller's current stream: the input of an all-gather is still being copied on a side
    stream (torch.cuda.stream(s)) when the all-gather is issued; the result must be the copy's;
  - DDP on a CUDA model: 5 steps equal to the same steps without DDP (one rank: DDP's average is
    the gradient itself);
  - PyTorch's powerSGD_hook on the CUDA model runs 5 steps to finite parameters;
  - gossipcc.DiLoCo on the CUDA model with each outer transport (exact, gossip, quantized,
    powersgd): at one rank exact and gossip are plain training, quantized within its bound.
Environment: TORCH_GPU_CHECK_EXPECT_STREAM_FAILURE=1 inverts the stream check (for a build that
ignores the current stream, to show that the check can fail).
"""
import datetime
import os
import sys
import tempfile
import traceback

import torch
import torch.distributed as dist

import gossipcc  # noqa: F401  (registers the backend)

results = []


def check(name):
    def wrap(fn):
        try:
            fn()
            results.append(("PASS", name, ""))
        except Exception as e:  # noqa: BLE001 - reported
            results.append(("FAIL", name, f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"))
            traceback.print_exc()
        return fn
    return wrap


def main():
    store = tempfile.mktemp()
    dist.init_process_group("gossipcc", init_method=f"file://{store}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=60))
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)

    @check("all_reduce / broadcast / all_gather on cuda, float32 float16 bfloat16 int64, 0..1M elements")
    def _():
        for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int64):
            for n in (0, 1, 1031, 1 << 20):
                x = (torch.arange(n, device=dev) % 11).to(dtype)
                y = x.clone()
                dist.all_reduce(y)
                assert torch.equal(y, x), f"all_reduce {dtype} {n}"
                dist.broadcast(y, 0)
                assert torch.equal(y, x), f"broadcast {dtype} {n}"
                out = [torch.zeros_like(x)]
                dist.all_gather(out, x)
                assert torch.equal(out[0], x), f"all_gather {dtype} {n}"
                work = dist.all_reduce(y, async_op=True)
                fut = work.get_future()
                assert torch.equal(fut.wait()[0], x), f"future of all_reduce {dtype} {n}"

    @check("a collective follows the caller's current CUDA stream")
    def _():
        n = 64 << 20
        host = (torch.arange(n, dtype=torch.int32) % 1000).float().pin_memory()
        x = torch.zeros(n, device=dev)
        out = torch.zeros(n, device=dev)
        dist.all_reduce(torch.zeros(1, device=dev))  # the NCCL communicator exists before the timed part
        torch.cuda.synchronize()
        side = torch.cuda.Stream()
        failed = None
        with torch.cuda.stream(side):
            x.copy_(host, non_blocking=True)  # still running when the all-gather is issued
            outs = [out]
            dist.all_gather(outs, x)
        side.synchronize()
        torch.cuda.synchronize()
        if not torch.equal(out.cpu(), host):
            failed = f"{(out.cpu() != host).sum().item()} of {n} elements differ from the copy's"
        expect_failure = os.environ.get("TORCH_GPU_CHECK_EXPECT_STREAM_FAILURE") == "1"
        if expect_failure:
            assert failed, "expected the build without the current stream to read the input too early"
        else:
            assert not failed, failed

    def make_model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                                   torch.nn.ReLU(), torch.nn.Linear(256, 10)).to(dev)

    def train(model, steps=5, opt=None, after_step=None):
        opt = opt or torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(steps):
            g = torch.Generator(device="cpu").manual_seed(step)
            x = torch.randn(32, 64, generator=g).to(dev)
            y = torch.randint(0, 10, (32,), generator=g).to(dev)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            if after_step:
                after_step()
        return torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    @check("DDP on a CUDA model equals training without DDP (1 rank, 5 steps)")
    def _():
        ref = train(make_model())
        ddp = torch.nn.parallel.DistributedDataParallel(make_model(), device_ids=[0], bucket_cap_mb=0.1)
        got = train(ddp)
        assert torch.allclose(got, ref, rtol=1e-5, atol=1e-6), f"max |diff| {(got - ref).abs().max().item()}"

    @check("PyTorch's powerSGD_hook on a CUDA model (1 rank, 5 steps)")
    def _():
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps
        ddp = torch.nn.parallel.DistributedDataParallel(make_model(), device_ids=[0])
        ddp.register_comm_hook(ps.PowerSGDState(process_group=None, matrix_approximation_rank=2,
                                                start_powerSGD_iter=2), ps.powerSGD_hook)
        got = train(ddp)
        assert torch.isfinite(got).all()

    @check("DiLoCo on a CUDA model: exact and gossip equal plain training (H=2, outer SGD lr 1), "
           "quantized:bits=8 within its bound, powersgd:rank=2 finite (1 rank, 6 steps)")
    def _():
        from gossipcc import DiLoCo

        def run(outer_sync):
            model = make_model()
            inner = torch.optim.SGD(model.parameters(), lr=0.1)
            outer = torch.optim.SGD(model.parameters(), lr=1.0)
            diloco = DiLoCo(model, inner, outer, sync_every=2, outer_sync=outer_sync)
            start = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()
            got = train(model, steps=6, opt=inner, after_step=diloco.step)
            assert got.is_cuda and torch.isfinite(got).all(), f"{outer_sync}: non-finite or off the GPU"
            return start, got

        # One rank: the average of the outer gradient is itself, and an outer SGD step of lr 1
        # from the synchronised parameters lands on the local ones, so training is plain SGD.
        start, ref = run("exact")
        plain = train(make_model(), steps=6)
        assert torch.allclose(ref, plain, rtol=1e-5, atol=1e-6), f"exact: max |diff| {(ref - plain).abs().max().item()}"
        _, got = run("gossip")
        assert torch.allclose(got, plain, rtol=1e-5, atol=1e-6), f"gossip: max |diff| {(got - plain).abs().max().item()}"
        # 8 bits: each outer step is off by at most about half a step (max |delta| / 127 / 2 per
        # block) and error feedback carries it to the next, so the sum stays within a step or two.
        _, got = run("quantized:bits=8")
        step = (plain - start).abs().max().item() / 127
        diff = (got - plain).abs().max().item()
        assert diff <= 4 * step, f"quantized:bits=8: max |diff| {diff} against a step of {step}"
        run("powersgd:rank=2")

    dist.destroy_process_group()
    for status, name, why in results:
        print(f"{status}  {name}{': ' + why if why else ''}")
    failed = sum(1 for r in results if r[0] == "FAIL")
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
