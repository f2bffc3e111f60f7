"""The main job's LM workload (tools/train/lm_job.py) in --smoke mode on 2 local ranks for DDP on
gossipcc, DiLoCo and DiLoCo in plain torch, two trials: it must finish, run the trials in a
rotating order, write its table, summary and plot, lower the validation loss and end with the same
model on both ranks; plain-torch DiLoCo against DDP at H = 1, a simulation written here, and
gossipcc.DiLoCo's curve; the tuning pass's choice and its use; plus the data split, the method
list and the arithmetic of the tables (interpolation, medians, per-trial ratios)."""
import json
import os
import re
import subprocess
import sys

import pytest

TOOLS = os.environ.get("GOSSIPCC_TOOLS") or os.path.join(os.path.dirname(__file__), "..", "..", "tools")
sys.path.insert(0, os.path.join(TOOLS, "train"))
sys.path.insert(0, TOOLS)
import lm  # noqa: E402
import lm_job  # noqa: E402


def test_the_validation_split_is_the_last_tenth_of_every_file():
    files = lm.fortune_files()
    assert len(files) > 20 and not [f for f in files if "." in os.path.basename(f)]
    train, val = lm.load_text()
    sizes = [os.path.getsize(f) for f in files]
    assert len(train) + len(val) == sum(sizes) > 2_000_000
    assert len(val) == sum(int(s * lm.VAL_FRACTION) for s in sizes)
    with open(files[0], "rb") as f:
        first = f.read()
    cut = len(first) - int(len(first) * lm.VAL_FRACTION)
    assert bytes(train[:cut].tolist()) == first[:cut]
    assert bytes(val[:len(first) - cut].tolist()) == first[cut:]
    x, y = lm.val_windows(val, 32, 16)
    assert x.shape == y.shape == (16, 32) and int(x[0, 0]) == val[0] and int(y[0, 0]) == val[1]


def test_method_list():
    names = lm.names("all")
    for name in ["allreduce-gloo", "allreduce", "powersgd-r2", "sgp", "osgp", "dpsgd", "adpsgd",
                 "diloco", "streaming-diloco", "diloco-powersgd", "diloco-gossip",
                 "torch-fp16", "torch-powersgd-r2", "torch-postlocal", "torch-diloco"]:
        assert name in names, name
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        lm.names("diloco,nope")
    # A transport the installed package rejects is reported, not run; one it takes is run.
    bogus = lm.DiLoCoMethod("x", "x", "no-such-transport")
    assert "no-such-transport" in lm.unsupported_reason(bogus)
    assert lm.unsupported_reason(lm.DILOCO_METHODS["diloco"]) is None
    assert lm.unsupported_reason(lm.resolve("allreduce")) is None
    # PyTorch's alternatives run on gloo; the DiLoCo variants (and only they) have an outer lr.
    for name in ("torch-fp16", "torch-powersgd-r2", "torch-postlocal", "torch-diloco"):
        assert lm.resolve(name).backend == "gloo", name
    assert [n for n in names if lm.has_outer_lr(lm.resolve(n))] == ["torch-diloco"] + [n for n, *_ in lm.DILOCO]


def test_time_to_target_and_loss_at_interpolate():
    curve = [{"step": 0, "time": 0.0, "val_loss": 5.0}, {"step": 10, "time": 10.0, "val_loss": 4.0},
             {"step": 20, "time": 20.0, "val_loss": 2.0}]
    assert lm_job.time_to_target(curve, 3.0) == pytest.approx(15.0)
    assert lm_job.time_to_target(curve, 4.0) == pytest.approx(10.0)
    assert lm_job.time_to_target(curve, 1.0) is None
    assert lm_job.loss_at(curve, "step", 15) == pytest.approx(3.0)
    assert lm_job.loss_at(curve, "time", 2.5) == pytest.approx(4.75)
    assert lm_job.loss_at(curve, "step", 20) == pytest.approx(2.0)
    assert lm_job.loss_at(curve, "time", 21.0) is None
    assert lm_job.parse_floats("3.0, 2.6", "--targets") == [3.0, 2.6]
    with pytest.raises(ValueError, match="--targets: 'x' is not a number"):
        lm_job.parse_floats("3.0,x", "--targets")


def test_trials_rotate_and_figures_are_medians_with_per_trial_ratios():
    names = ["a", "b", "c"]
    assert [lm_job.trial_order(names, t) for t in range(4)] == [
        ["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]
    assert lm_job.stats([3.0, None, 1.0, 10.0]) == {"median": 3.0, "min": 1.0, "max": 10.0, "n": 3}
    assert lm_job.stats([None]) is None

    def run(time_to_3, final, steps=100, time=10.0):
        curve = [{"step": 0, "time": 0.0, "val_loss": 5.0}, {"step": steps, "time": time, "val_loss": final}]
        return {"method": "m", "params": 1, "lr": 0.01, "outer_lr": None, "steps": steps, "train_time": time,
                "time_per_step": time / steps, "bytes_per_rank_per_step": None, "final_val_loss": final,
                "averaged_val_loss": None, "final_param_spread": 0.0, "time_to_target": {"3": time_to_3},
                "curve": curve}
    # Per-trial ratios 2, 4, 3: their median is 3 (the ratio of the medians, 9 / 4, would not be).
    base = [run(8.0, 2.8), run(20.0, 2.8), run(9.0, 2.8)]
    fast = [run(4.0, 2.7), run(5.0, 2.7), run(3.0, 2.7)]
    row = lm_job.aggregate("fast", fast, [3.0], base, equal_steps=50, equal_time=5.0)
    assert row["speedup"]["3"] == {"median": 3.0, "min": 2.0, "max": 4.0, "n": 3}
    assert row["time_to_target"]["3"]["median"] == 4.0 and row["time_to_target"]["3"]["reached"] == 3
    assert row["final_vs_baseline"]["median"] == pytest.approx(2.7 / 2.8 - 1)
    assert row["loss_at_equal_steps"]["median"] == pytest.approx(3.85)
    assert row["loss_at_equal_time"]["median"] == pytest.approx(3.85)
    # A target not reached in one trial: the median of the others, and the count.
    fast[1]["time_to_target"]["3"] = None
    row = lm_job.aggregate("fast", fast, [3.0], base, 50, 5.0)
    assert row["time_to_target"]["3"]["reached"] == 2 and row["speedup"]["3"]["n"] == 2
    table = lm_job.format_table([row], [3.0], "base", 50, 5.0)
    assert "reached in 2/3" in table and "2.50x [2.00-3.00]" in table


def test_tuning_grid_and_choice():
    grid = lm_job.tuning_grid(["allreduce-gloo", "torch-diloco"], [1e-3, 2e-3], [0.5, 1.0])
    assert [label for label, _, _ in grid] == [
        "allreduce-gloo lr=0.001", "allreduce-gloo lr=0.002",
        "torch-diloco lr=0.001 outer=0.5", "torch-diloco lr=0.001 outer=1", "torch-diloco lr=0.002 outer=0.5",
        "torch-diloco lr=0.002 outer=1"]
    losses = [3.1, 2.9, 3.0, 2.95, 2.97, None]  # the last point failed
    rows = [{"method": label, "n": 1, "final_val_loss": {"median": x, "min": x, "max": x, "n": 1}} if x is not None
            else {"method": label, "error": "boom"} for (label, _, _), x in zip(grid, losses)]
    assert lm_job.choose(grid, rows) == {"allreduce-gloo": {"lr": 2e-3}, "torch-diloco": {"lr": 1e-3, "outer_lr": 1.0}}
    text = lm_job.grid_table(grid, [dict(r, steps={"median": 10, "n": 1}, time_to_target={"3": {"median": None}})
                                    if "n" in r else r for r in rows], lm_job.choose(grid, rows), [3.0])
    assert text.count("**chosen**") == 2 and "failed: boom" in text
    with pytest.raises(ValueError, match="no learning rate of allreduce-gloo finished"):
        lm_job.choose(grid, [r if not r["method"].startswith("allreduce") else {"method": r["method"], "error": "x"}
                             for r in rows])


def test_a_tuning_pass_with_a_failed_point_chooses_among_the_others_and_says_so(tmp_path, monkeypatch, capsys):
    # The runs replaced by made-up ones (final loss 3 + 100 |lr - 2e-3|), lr 1e-3 failing.
    def fake_run_method(cluster, folder, stem, ranks, command, timeout, row_of):
        flags = command(0, "out")
        lr = float(flags[flags.index("--lr") + 1])
        if lr == 1e-3:
            return {"method": stem, "error": "rank 0 exited with status 1"}
        start = {"type": "start", "params": 10, "lr": lr, "outer_lr": None}
        evals = [{"type": "eval", "step": s, "train_time": t, "val_loss": v, "loss": None}
                 for s, t, v in ((0, 0.0, 5.0), (10, 1.0, 3 + 100 * abs(lr - 2e-3)))]
        end = {"type": "end", "steps": 10, "train_time": 1.0, "tx_bytes": None, "param_probe": [0.0]}
        return row_of([[start] + evals + [end]] * ranks, type("Run", (), {"wall_seconds": 1.0}))
    monkeypatch.setattr(lm_job, "run_method", fake_run_method)
    status = lm_job.main(["--smoke", "--network", "local", "--ranks", "2", "--methods", "allreduce-gloo", "--tune",
                          "--tune-lrs", "1e-3,2.5e-3,4e-3", "--results", str(tmp_path)])
    assert status == 1
    assert "1 grid point(s) failed" in capsys.readouterr().err
    tuned = json.loads((tmp_path / "tuned.json").read_text())
    assert tuned["methods"] == {"allreduce-gloo": {"lr": 2.5e-3}} and tuned["failed"] == ["allreduce-gloo lr=0.001"]


def _lines_of_runs(stdout):
    """The labels of the runs in the order the job started them, from its progress lines."""
    return [re.match(r"\[\d+/\d+\](?: trial \d+/\d+)? (\S+(?: lr=\S+)?(?: outer=\S+)?):", line).group(1)
            for line in stdout.splitlines() if re.match(r"\[\d+/\d+\]", line)]


def test_smoke_run_on_two_local_ranks_two_trials(tmp_path):
    names = ["allreduce", "diloco", "torch-diloco"]
    results = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, os.path.join(TOOLS, "train", "lm_job.py"), "--smoke", "--network", "local", "--ranks", "2",
         "--methods", ",".join(names), "--baseline", "allreduce", "--trials", "2", "--targets", "4.5,3.9",
         "--results", str(results)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout
    # Trial 2 starts one method further on.
    assert _lines_of_runs(proc.stdout) == names + names[1:] + names[:1], proc.stdout
    table = (results / "results.md").read_text()
    for name in names:
        assert f"| {name} |" in table, table
    assert "time to 4.5 (s)" in table and "time to 3.9 (s)" in table and "median [min-max] over 2 trials" in table
    assert "evaluation (every 10 steps) and the stop decision excluded for every method alike" in table
    assert (results / "val_loss_vs_time.png").stat().st_size > 1000
    summary = json.loads((results / "summary.json").read_text())
    assert summary["worker_args"]["max_steps"] == 30 and summary["equal_steps"] == 30
    assert [t["order"] for t in summary["trials"]] == [names, names[1:] + names[:1]]
    for t in summary["trials"]:
        assert len(t["load_start"].split()) == 3 and len(t["load_end"].split()) == 3, t
    rows = summary["rows"]
    assert [r["method"] for r in rows] == names
    for r in rows:
        assert "error" not in r and "skipped" not in r and not r.get("errors"), r
        assert r["n"] == 2 and r["steps"]["median"] == 30
        assert set(r["time_to_target"]) == {"4.5", "3.9"}
        assert r["loss_at_equal_steps"]["median"] == pytest.approx(r["final_val_loss"]["median"])
        for run in r["trials"]:
            assert [c["step"] for c in run["curve"]] == [0, 10, 20, 30]
            assert run["bytes_per_rank_per_step"] is None  # local processes: no NIC counters
            first, last = run["curve"][0]["val_loss"], run["final_val_loss"]
            # ln 256 = 5.55 at the start; 30 steps of the tiny model reach about 3.4-4.0.
            assert first > 5.0 and last < first - 1.0, (r["method"], run["curve"])
            # The ranks communicated: each samples its own batches, so apart from DDP's all-reduce and
            # DiLoCo's outer step (step 30 is a sync step at H = 5) their models would end apart.
            assert run["final_param_spread"] == 0.0, (r["method"], run["final_param_spread"])
    # DiLoCo in plain torch and gossipcc.DiLoCo (exact, one fragment) are the same algorithm on the
    # same batches: their curves agree to rounding.
    by = {r["method"]: r for r in rows}
    for mine, theirs in zip(by["torch-diloco"]["trials"], by["diloco"]["trials"]):
        for a, b in zip(mine["curve"], theirs["curve"]):
            assert a["val_loss"] == pytest.approx(b["val_loss"], abs=1e-4), (mine["curve"], theirs["curve"])
    assert by["torch-diloco"]["outer_lr"] == by["diloco"]["outer_lr"] == 0.7


RANK_SCRIPT = r"""
import os, sys
sys.path[:0] = [sys.argv[1], os.path.join(sys.argv[1], "train")]
out = sys.argv[2]
import torch
import torch.distributed as dist
import lm

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()


def batch(r, step):
    g = torch.Generator().manual_seed(100 * r + step)
    x = torch.randint(0, 256, (2, 9), generator=g)
    return x[:, :-1], x[:, 1:]


# H = 1, outer SGD lr 1 without momentum, inner SGD: every step must be DDP's step.
ddp_module, module = lm.make_model(16, 1, 2, 8, seed=0), lm.make_model(16, 1, 2, 8, seed=0)
ddp = torch.nn.parallel.DistributedDataParallel(ddp_module)
ddp_opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
inner = torch.optim.SGD(module.parameters(), lr=0.1)
diloco = lm.TorchDiLoCo(module, torch.optim.SGD(module.parameters(), lr=1.0), sync_every=1)
h1 = []
for step in range(1, 4):
    x, y = batch(rank, step)
    for model, opt in ((ddp, ddp_opt), (module, inner)):
        opt.zero_grad()
        lm.loss_of(model, x, y).backward()
        opt.step()
    diloco.step()
    h1.append(max((a - b).abs().max().item() for a, b in zip(ddp_module.parameters(), module.parameters())))

# H = 2, inner SGD with momentum, outer Nesterov (lr 0.7, momentum 0.9), 5 steps: the parameters
# after each.
module = lm.make_model(16, 1, 2, 8, seed=0)
inner = torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.5)
diloco = lm.TorchDiLoCo(module, torch.optim.SGD(module.parameters(), lr=0.7, momentum=0.9, nesterov=True), 2)
after = []
for step in range(1, 6):
    x, y = batch(rank, step)
    inner.zero_grad()
    lm.loss_of(module, x, y).backward()
    inner.step()
    diloco.step()
    after.append([p.detach().clone() for p in module.parameters()])
torch.save({"h1": h1, "after": after}, out)
dist.barrier()
os._exit(0)
"""


def _batch(r, step):
    import torch
    g = torch.Generator().manual_seed(100 * r + step)
    x = torch.randint(0, 256, (2, 9), generator=g)
    return x[:, :-1], x[:, 1:]


def test_plain_torch_diloco_is_ddp_at_h1_and_follows_a_simulation(tmp_path):
    import emulated_cluster
    import torch
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    outs = [tmp_path / f"rank{r}.pt" for r in range(2)]
    with emulated_cluster.LocalCluster(2) as cluster:
        cluster.run([[sys.executable, str(script), TOOLS, str(outs[r])] for r in range(2)],
                    env={"OMP_NUM_THREADS": "1", "USE_LIBUV": "0"}, timeout=120)
    got = [torch.load(o) for o in outs]
    for r in range(2):
        assert max(got[r]["h1"]) < 1e-6, got[r]["h1"]

    # DiLoCo simulated from its definition: every rank's inner optimizer on its own batches (SGD
    # with momentum, whose steps do not amplify rounding as AdamW's do near zero gradients; the
    # job's AdamW runs are compared with gossipcc.DiLoCo's in the smoke run); after
    # steps 2 and 4 the mean of the ranks' deltas theta_global - theta_local is the outer
    # gradient of one Nesterov SGD step from theta_global (v = 0.9 v + d; theta_global -=
    # 0.7 (d + 0.9 v)), and every rank restarts from the new theta_global.
    models = [lm.make_model(16, 1, 2, 8, seed=0) for _ in range(2)]
    inners = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.5) for m in models]
    theta = [p.detach().clone() for p in models[0].parameters()]
    velocity = [torch.zeros_like(p) for p in theta]
    for step in range(1, 6):
        for r, (m, opt) in enumerate(zip(models, inners)):
            x, y = _batch(r, step)
            opt.zero_grad()
            lm.loss_of(m, x, y).backward()
            opt.step()
        if step % 2 == 0:
            with torch.no_grad():
                for i, ps in enumerate(zip(*(m.parameters() for m in models))):
                    d = sum(theta[i] - p for p in ps) / len(ps)
                    velocity[i] = 0.9 * velocity[i] + d
                    theta[i] = theta[i] - 0.7 * (d + 0.9 * velocity[i])
                    for p in ps:
                        p.copy_(theta[i])
        for r, m in enumerate(models):
            for got_p, p in zip(got[r]["after"][step - 1], m.parameters()):
                assert torch.allclose(got_p, p.detach(), rtol=1e-4, atol=1e-5), (r, step)
        same = all(torch.equal(a, b) for a, b in zip(got[0]["after"][step - 1], got[1]["after"][step - 1]))
        assert same == (step % 2 == 0), step  # one model after a synchronisation, two between


def test_tuning_pass_picks_the_best_learning_rate_and_the_run_uses_it(tmp_path, capsys):
    job = [sys.executable, os.path.join(TOOLS, "train", "lm_job.py"), "--smoke", "--network", "local", "--ranks", "2",
           "--methods", "allreduce-gloo", "--max-steps", "20", "--no-plot"]
    tune = tmp_path / "tune"
    proc = subprocess.run(job + ["--tune", "--tune-lrs", "1e-5,3e-3", "--results", str(tune)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout
    assert _lines_of_runs(proc.stdout) == ["allreduce-gloo lr=1e-05", "allreduce-gloo lr=0.003"], proc.stdout
    tuned = json.loads((tune / "tuned.json").read_text())
    # 20 steps at lr 1e-5 barely move the loss from ln 256; at 3e-3 it falls by more than 1.
    assert tuned["methods"] == {"allreduce-gloo": {"lr": 3e-3}}, tuned
    losses = {g["lr"]: g["final_val_loss"]["median"] for g in tuned["grid"]}
    assert losses[1e-5] > 5.0 and losses[3e-3] < 4.5, losses
    assert "**chosen**" in (tune / "results.md").read_text()

    run = tmp_path / "run"
    proc = subprocess.run(job + ["--tuned", str(tune / "tuned.json"), "--results", str(run)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout
    row = json.loads((run / "summary.json").read_text())["rows"][0]
    assert row["lr"] == 3e-3 and row["trials"][0]["lr"] == 3e-3, row  # not the default --lr, 6e-3
    # A file tuned for another setup, or without a method asked for, or an --lr beside it, or a bad
    # number: refused before anything runs.
    for extra, message in ((["--ranks", "3"], "tuned for another setup: ranks"),
                           (["--methods", "allreduce"], "no values for allreduce"),
                           (["--lr", "1e-3"], "--lr with --tuned"),
                           (["--trials", "0"], "--trials must be at least 1, got 0"),
                           (["--sync-every", "0"], "--sync-every must be at least 1, got 0"),
                           (["--targets", "3,x"], "--targets: 'x' is not a number"),
                           (["--methods", "allreduce-gloo,allreduce-gloo"], "names a method twice")):
        with pytest.raises(SystemExit) as exit_:
            lm_job.main(job[2:] + ["--tuned", str(tune / "tuned.json"), "--results", str(tmp_path / "x")] + extra)
        assert exit_.value.code == 2 and message in capsys.readouterr().err, extra
    for extra, message in ((["--tune-lrs", "1e-3,0"], "--tune-lrs: learning rates must be positive and distinct"),
                           (["--tune-outer-lrs", "0.5,0.5"], "--tune-outer-lrs: learning rates must be positive")):
        with pytest.raises(SystemExit) as exit_:
            lm_job.main(job[2:] + ["--tune", "--results", str(tmp_path / "x")] + extra)
        assert exit_.value.code == 2 and message in capsys.readouterr().err, extra
    assert not (tmp_path / "x").exists()  # refused before anything ran


WRAPPER = r'''
import sys
sys.path[:0] = [sys.argv.pop(1), sys.argv.pop(1)]
import lm
lm.DILOCO_METHODS["diloco"].outer_sync = "quantized:bits=3"
lm.unsupported_reason = lambda method: None  # as if the package could not be asked beforehand
import lm_worker
lm_worker.main()
'''


def test_a_transport_the_package_rejects_at_construction_is_skipped_on_every_rank(tmp_path):
    import emulated_cluster
    script = tmp_path / "worker.py"
    script.write_text(WRAPPER)
    outs = [tmp_path / f"rank{r}.jsonl" for r in range(2)]
    with emulated_cluster.LocalCluster(2) as cluster:
        cluster.run([[sys.executable, str(script), os.path.join(TOOLS, "train"), TOOLS, "--method", "diloco",
                      "--out", str(outs[r]), "--d-model", "32", "--layers", "1", "--max-steps", "5"]
                     for r in range(2)], timeout=120)
    for out in outs:
        records = [json.loads(line) for line in out.read_text().splitlines()]
        assert [r["type"] for r in records] == ["skipped"], records
        assert "quantized:bits=3" in records[0]["reason"]
    rows = lm_job.summarize("diloco", [[json.loads(line) for line in o.read_text().splitlines()] for o in outs], 3.0)
    assert rows["method"] == "diloco" and "quantized:bits=3" in rows["skipped"]
