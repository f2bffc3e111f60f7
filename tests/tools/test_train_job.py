"""The main job (tools/train/train.py) end to end for a few steps, every kind of method, 2 ranks as
local processes (--network local: no namespaces needed): it must finish, write its table,
summary and plot, every method must lower the test loss, and every method's ranks must end with
models closer than ranks that do not communicate (diag-sync2's): equal for exact averaging.
PyTorch's own alternatives against independent expectations: torch-fp16's gradient is the
float16-rounded average of the ranks' gradients, torch-postlocal's parameters follow a
simulation of post-local SGD written here."""
import json
import os
import subprocess
import sys

TOOLS = os.environ.get("GOSSIPCC_TOOLS") or os.path.join(os.path.dirname(__file__), "..", "..", "tools")
sys.path.insert(0, os.path.join(TOOLS, "train"))
sys.path.insert(0, TOOLS)  # emulated_cluster
import methods  # noqa: E402


def test_all_holds_pytorchs_alternatives_and_leaves_out_the_diagnostics():
    names = methods.names("all")
    assert {"allreduce-gloo", "allreduce", "powersgd-r2", "sgp", "osgp", "dpsgd", "adpsgd",
            "torch-fp16", "torch-powersgd-r2", "torch-postlocal"} <= set(names)
    assert not [n for n in names if n.startswith("diag-")], names
    # PyTorch's alternatives run on gloo with PyTorch's own hooks.
    for name in ("torch-fp16", "torch-powersgd-r2", "torch-postlocal"):
        assert methods.REGISTRY[name].backend == "gloo"
    assert {"diag-compute", "diag-sync2", "diag-sync3-gloo"} <= set(methods.REGISTRY)


def test_floor_hook_exchanges_as_many_times_as_named_and_leaves_the_bucket(monkeypatch):
    import torch

    calls = []
    monkeypatch.setattr(methods.dist, "all_reduce", lambda t: calls.append(t.numel()))

    class Bucket:
        def __init__(self):
            self.data = torch.arange(5.0)

        def buffer(self):
            return self.data

    for exchanges in (0, 2, 3):
        calls.clear()
        bucket = Bucket()
        out = methods.floor_hook(exchanges)(None, bucket).wait()
        assert calls == [16] * exchanges
        assert out is bucket.data and torch.equal(out, torch.arange(5.0))


def test_every_method_runs_a_few_steps(tmp_path):
    # One method per code path (the -r2 variants and gossipcc's exact all-reduce differ from
    # these only in a policy string): each launch starts 2 fresh Python processes.
    names = ["allreduce-gloo", "powersgd-r1", "torch-powersgd-r1", "torch-fp16", "torch-postlocal", "sgp", "osgp",
             "dpsgd", "adpsgd", "diag-sync2"]
    assert set(names) <= set(methods.REGISTRY)
    results = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, os.path.join(TOOLS, "train", "train.py"), "--network", "local", "--ranks", "2",
         "--methods", ",".join(names), "--steps", "8", "--eval-every", "4", "--hidden", "64",
         "--batch", "16", "--powersgd-start-iter", "4", "--lr", "0.3", "--target", "0.5", "--timeout", "60",
         # post-local SGD: all-reduce for 3 steps, then local steps averaged after steps 4, 6 and 8
         "--local-sgd-start-iter", "3", "--sync-every", "2",
         "--results", str(results)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout
    table = (results / "results.md").read_text()
    for name in names:
        assert f"| {name} |" in table, table
    assert (results / "accuracy_vs_time.png").stat().st_size > 1000
    rows = json.loads((results / "summary.json").read_text())["rows"]
    assert [r["method"] for r in rows] == names
    for r in rows:
        assert "error" not in r, r
        assert r["steps"] == 8
        first, last = r["curve"][0], r["curve"][-1]
        assert [c["step"] for c in r["curve"]] == [0, 4, 8]
        # 8 steps are few (the test loss of one process falls from 2.30 to about 2.15): every
        # method must lower it.
        assert last["test_loss"] < first["test_loss"] - 0.02, (r["method"], r["curve"])
        assert r["bytes_per_rank_per_step"] is None  # local processes: no NIC counters
    # The ranks communicated: each trains on its own shard, so without communication their models
    # end apart, as diag-sync2's (which exchanges 16 floats and leaves the gradients alone) do.
    spread = {r["method"]: r["final_param_spread"] for r in rows}
    apart = spread.pop("diag-sync2")
    assert apart > 1e-3, apart
    # exact averaging (torch-postlocal's last step is an averaging step): one model
    for name in ("allreduce-gloo", "powersgd-r1", "torch-powersgd-r1", "torch-fp16", "torch-postlocal"):
        assert spread[name] < 1e-6 * apart, (name, spread)
    for name in ("sgp", "osgp", "dpsgd", "adpsgd"):  # gossip: closer (about 0.1-0.45 of apart here), not equal
        assert spread[name] < 0.7 * apart, (name, spread)


def test_unknown_method_is_refused():
    proc = subprocess.run([sys.executable, os.path.join(TOOLS, "train", "train.py"), "--network", "local",
                           "--methods", "allreduce,nope"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.returncode != 0
    assert "unknown method 'nope'" in proc.stdout
    for flag, value, message in (("--sync-every", "0", "--sync-every must be at least 1, got 0"),
                                 ("--local-sgd-start-iter", "-1", "--local-sgd-start-iter must be >= 0, got -1")):
        proc = subprocess.run([sys.executable, os.path.join(TOOLS, "train", "train.py"), "--network", "local",
                               "--methods", "torch-postlocal", flag, value],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.returncode == 2 and message in proc.stdout, proc.stdout


RANK_SCRIPT = r"""
import os, sys
sys.path[:0] = [sys.argv[1], os.path.join(sys.argv[1], "train")]
out = sys.argv[2]
import torch
import torch.distributed as dist
import methods

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()


def batch(r, step):
    g = torch.Generator().manual_seed(100 * r + step)
    return torch.rand(8, 64, generator=g), torch.randint(0, 10, (8,), generator=g)


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 16), torch.nn.ReLU(), torch.nn.Linear(16, 10))


# torch-fp16: one backward through DDP with the hook, and this rank's own gradient beside it.
module, plain = make_model(), make_model()
model = methods.REGISTRY["torch-fp16"].wrap(module)
x, y = batch(rank, 0)
torch.nn.functional.cross_entropy(model(x), y).backward()
torch.nn.functional.cross_entropy(plain(x), y).backward()
fp16 = {"ddp": [p.grad.clone() for p in module.parameters()], "own": [p.grad.clone() for p in plain.parameters()]}

# torch-postlocal: DDP for 2 steps, then local steps, the parameters averaged after steps 3, 6.
methods.LOCAL_SGD_START_ITER, methods.LOCAL_SGD_PERIOD = 2, 3
method = methods.REGISTRY["torch-postlocal"]
module = make_model()
model = method.wrap(module)
opt = method.optimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
after = []
for step in range(1, 9):
    x, y = batch(rank, step)
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    after.append([p.detach().clone() for p in module.parameters()])
torch.save({"fp16": fp16, "postlocal": after}, out)
dist.barrier()
os._exit(0)
"""


def _run_ranks(tmp_path, script):
    import emulated_cluster
    path = tmp_path / "rank.py"
    path.write_text(script)
    outs = [tmp_path / f"rank{r}.pt" for r in range(2)]
    with emulated_cluster.LocalCluster(2) as cluster:
        cluster.run([[sys.executable, str(path), TOOLS, str(outs[r])] for r in range(2)],
                    env={"OMP_NUM_THREADS": "1", "USE_LIBUV": "0"}, timeout=120)
    import torch
    return [torch.load(o) for o in outs]


def _batch(r, step):
    import torch
    g = torch.Generator().manual_seed(100 * r + step)
    return torch.rand(8, 64, generator=g), torch.randint(0, 10, (8,), generator=g)


def _make_model():  # the rank script's model
    import torch
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 16), torch.nn.ReLU(), torch.nn.Linear(16, 10))


def test_pytorchs_fp16_hook_and_post_local_sgd_against_independent_expectations(tmp_path):
    import torch
    got = _run_ranks(tmp_path, RANK_SCRIPT)

    # fp16_compress_hook: each rank's gradient cast to float16 and halved, summed in float16,
    # cast back: the same on both ranks, and not the float32 average.
    own = [g["fp16"]["own"] for g in got]
    for i, (a, b) in enumerate(zip(*own)):
        expected = (a.half() / 2 + b.half() / 2).float()
        for r in range(2):
            assert torch.equal(got[r]["fp16"]["ddp"][i], expected), (r, i)
    exact = torch.cat([((a + b) / 2).reshape(-1) for a, b in zip(*own)])
    scale = torch.cat([((a.abs() + b.abs()) / 2).reshape(-1) for a, b in zip(*own)])
    rounded = torch.cat([g.reshape(-1) for g in got[0]["fp16"]["ddp"]])
    assert not torch.equal(rounded, exact)  # the hook compressed: float16 rounding is visible
    # three float16 roundings (2^-11 each) of terms no larger than `scale`, subnormals aside
    assert ((rounded - exact).abs() <= 2e-3 * scale + 1e-7).all()

    # Post-local SGD simulated: SGD with momentum on every rank's own copy, the gradients
    # averaged over the ranks for steps 1-2 (DDP), each rank's own from step 3 on, the
    # parameters (not the momentum) averaged after steps 3 and 6.
    models = [_make_model() for _ in range(2)]
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in models]
    for step in range(1, 9):
        grads = []
        for r, m in enumerate(models):
            m.zero_grad()
            x, y = _batch(r, step)
            torch.nn.functional.cross_entropy(m(x), y).backward()
            grads.append([p.grad.clone() for p in m.parameters()])
        if step <= 2:
            for m in models:
                for p, g0, g1 in zip(m.parameters(), *grads):
                    p.grad = (g0 + g1) / 2
        for o in opts:
            o.step()
        if step in (3, 6):
            with torch.no_grad():
                for p0, p1 in zip(models[0].parameters(), models[1].parameters()):
                    p0.copy_((p0 + p1) / 2)
                    p1.copy_(p0)
        for r, m in enumerate(models):
            for p, q in zip(got[r]["postlocal"][step - 1], m.parameters()):
                assert torch.allclose(p, q.detach(), rtol=1e-5, atol=1e-6), (r, step)
        same = all(torch.equal(a, b) for a, b in zip(got[0]["postlocal"][step - 1], got[1]["postlocal"][step - 1]))
        # equal after DDP's steps and each averaging, apart after a local step
        assert same == (step <= 3 or step == 6), step


def test_post_local_sgd_all_reduces_within_a_host_of_several_ranks(tmp_path):
    # 2 hosts of 2 ranks: DDP over all 4 for 2 steps, then gradients all-reduced within each host
    # (PyTorch's intra-host group), the parameters averaged over all 4 after step 3; after the
    # local steps 4 and 5 the two ranks of a host hold one model, the two hosts two.
    results = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, os.path.join(TOOLS, "train", "train.py"), "--network", "local", "--hosts", "2",
         "--ranks-per-host", "2", "--methods", "torch-postlocal", "--steps", "5", "--eval-every", "5",
         "--hidden", "32", "--local-sgd-start-iter", "2", "--sync-every", "3", "--timeout", "60", "--no-plot",
         "--results", str(results)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout
    probes = []
    for r in range(4):
        records = [json.loads(line) for line in (results / f"torch-postlocal.rank{r}.jsonl").read_text().splitlines()]
        probes.append(next(x for x in records if x["type"] == "end")["param_probe"])
    assert probes[0] == probes[1] and probes[2] == probes[3], probes
    assert max(abs(a - b) for a, b in zip(probes[0], probes[2])) > 1e-6, probes
