"""The main job's LM workload (tools/train/lm_job.py) in --smoke mode on 2 local ranks for DDP on
gossipcc and DiLoCo: it must finish, write its table, summary and plot, lower the validation loss
and end with the same model on both ranks; plus the data split, the method list and the table's
arithmetic."""
import json
import os
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
                 "diloco", "streaming-diloco", "diloco-powersgd", "diloco-gossip"]:
        assert name in names, name
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        lm.names("diloco,nope")
    # A transport the installed package rejects is reported, not run; one it takes is run.
    bogus = lm.DiLoCoMethod("x", "x", "no-such-transport")
    assert "no-such-transport" in lm.unsupported_reason(bogus)
    assert lm.unsupported_reason(lm.DILOCO_METHODS["diloco"]) is None
    assert lm.unsupported_reason(lm.resolve("allreduce")) is None


def test_time_to_target_interpolates():
    curve = [{"time": 0.0, "val_loss": 5.0}, {"time": 10.0, "val_loss": 4.0}, {"time": 20.0, "val_loss": 2.0}]
    assert lm_job.time_to_target(curve, 3.0) == pytest.approx(15.0)
    assert lm_job.time_to_target(curve, 4.0) == pytest.approx(10.0)
    assert lm_job.time_to_target(curve, 1.0) is None


def test_smoke_run_on_two_local_ranks(tmp_path):
    names = ["allreduce", "diloco"]
    results = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, os.path.join(TOOLS, "train", "lm_job.py"), "--smoke", "--network", "local", "--ranks", "2",
         "--methods", ",".join(names), "--baseline", "allreduce", "--results", str(results)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout
    table = (results / "results.md").read_text()
    for name in names:
        assert f"| {name} |" in table, table
    assert (results / "val_loss_vs_time.png").stat().st_size > 1000
    summary = json.loads((results / "summary.json").read_text())
    assert summary["worker_args"]["max_steps"] == 30
    rows = summary["rows"]
    assert [r["method"] for r in rows] == names
    for r in rows:
        assert "error" not in r and "skipped" not in r, r
        assert r["steps"] == 30
        assert [c["step"] for c in r["curve"]] == [0, 10, 20, 30]
        for key in ("time_to_target", "final_val_loss", "bytes_per_rank_per_step", "time_per_step"):
            assert key in r, (key, r)
        assert r["bytes_per_rank_per_step"] is None  # local processes: no NIC counters
        first, last = r["curve"][0]["val_loss"], r["final_val_loss"]
        # ln 256 = 5.55 at the start; 30 steps of the tiny model reach about 3.4-3.9.
        assert first > 5.0 and last < first - 1.0, (r["method"], r["curve"])
        # The ranks communicated: each samples its own batches, so apart from DDP's all-reduce and
        # DiLoCo's outer step (step 30 is a sync step at H = 5) their models would end apart.
        assert r["final_param_spread"] == 0.0, (r["method"], r["final_param_spread"])


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
