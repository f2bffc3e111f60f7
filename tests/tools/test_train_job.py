"""The main job (tools/train/train.py) end to end for a few steps, every kind of method, 2 ranks as
local processes (--network local: no namespaces needed): it must finish, write its table,
summary and plot, every method must lower the test loss, and every method's ranks must end with
models closer than ranks that do not communicate (diag-sync2's): equal for exact averaging."""
import json
import os
import subprocess
import sys

TOOLS = os.environ.get("GOSSIPCC_TOOLS") or os.path.join(os.path.dirname(__file__), "..", "..", "tools")
sys.path.insert(0, os.path.join(TOOLS, "train"))
import methods  # noqa: E402


def test_all_leaves_out_the_hook_and_the_diagnostics():
    names = methods.names("all")
    assert {"allreduce-gloo", "allreduce", "powersgd-r2", "sgp", "osgp", "dpsgd", "adpsgd"} <= set(names)
    assert not [n for n in names if n.startswith(("torch-", "diag-"))], names
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
    names = ["allreduce-gloo", "powersgd-r1", "torch-powersgd-r1", "sgp", "osgp", "dpsgd", "adpsgd", "diag-sync2"]
    assert set(names) <= set(methods.REGISTRY)
    results = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, os.path.join(TOOLS, "train", "train.py"), "--network", "local", "--ranks", "2",
         "--methods", ",".join(names), "--steps", "8", "--eval-every", "4", "--hidden", "64",
         "--batch", "16", "--powersgd-start-iter", "4", "--lr", "0.3", "--target", "0.5", "--timeout", "60",
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
    for name in ("allreduce-gloo", "powersgd-r1", "torch-powersgd-r1"):  # exact averaging: one model
        assert spread[name] < 1e-6 * apart, (name, spread)
    for name in ("sgp", "osgp", "dpsgd", "adpsgd"):  # gossip: closer (about 0.1-0.45 of apart here), not equal
        assert spread[name] < 0.7 * apart, (name, spread)


def test_unknown_method_is_refused():
    proc = subprocess.run([sys.executable, os.path.join(TOOLS, "train", "train.py"), "--network", "local",
                           "--methods", "allreduce,nope"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.returncode != 0
    assert "unknown method 'nope'" in proc.stdout
