"""tools/bench/harness.py, the harness every benchmark runs on, and tools/bench/report.py: the
median and min-max over trials, the rotating order, ratios computed within each trial, the load
probe's split of the machine's CPU into the benchmark's own and other processes', flagging and
refusal by load, and the results JSON; no root, no network, seconds."""
import json
import os
import subprocess
import sys
import time

import pytest

import bench_script

harness = bench_script.harness()


args = bench_script.harness_args


def load(other, own=0.5):
    return {"loadavg_before": [1.0, 1.0, 1.0], "loadavg_after": [1.2, 1.0, 1.0], "wall_s": 2.0,
            "busy_cores": other + own, "own_cores": own, "other_cores": other}


def test_stats_are_the_median_and_the_min_max():
    # Skewed: the mean (4.0) is not the median (2.0).
    assert harness.stats([2.0, 1.0, 11.0, 2.0, 4.0]) == {"median": 2.0, "min": 1.0, "max": 11.0, "n": 5}
    assert harness.stats([3.0, 1.0, 2.0, 10.0])["median"] == 2.5  # even count: between the middle two
    assert harness.stats([None, 2.0]) == {"median": 2.0, "min": 2.0, "max": 2.0, "n": 1}
    assert harness.stats([None]) is None


def test_trial_t_starts_at_method_t_mod_m_and_repetitions_rotate_further():
    m = ["a", "b", "c"]
    assert [harness.trial_order(m, t) for t in range(4)] == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"],
                                                             ["a", "b", "c"]]
    assert harness.trial_order(m, 1, 1) == ["c", "a", "b"]
    # Over m trials every method runs in every position once.
    for pos in range(3):
        assert sorted(harness.trial_order(m, t)[pos] for t in range(3)) == m
    with pytest.raises(harness.HarnessError, match="no methods"):
        harness.rotation([], 0)


def trial(samples, other=0.0, order=("base", "x")):
    return {"samples": {"c": {m: {"time": v} for m, v in samples.items()}}, "load": load(other),
            "order": list(order)}


def test_ratios_are_computed_within_each_trial_then_the_median_taken():
    # The baseline drifts 1 -> 10 -> 100 and x is always half of it in its own trial: the per-trial
    # ratio is 0.5 every time; the ratio of the medians would be 5 / 10 = 0.5 only by luck, and
    # with x's trials shuffled against the baseline's it is not: here medians 10 and 6 -> 0.6.
    trials = [trial({"base": 1.0, "x": 0.5}), trial({"base": 10.0, "x": 6.0}), trial({"base": 100.0, "x": 50.0})]
    r = harness.ratio_stats(trials, "c", "x", "base", "time")
    assert r == {"median": 0.5, "min": 0.5, "max": 0.6, "n": 3}
    s = harness.summarize(trials, ["c"], ["base", "x"], "base", "time")["c"]
    assert s["ratios"]["x"]["median"] == 0.5
    assert s["speedups"]["x"] == {"median": 2.0, "min": 10.0 / 6.0, "max": 2.0, "n": 3}
    assert s["methods"]["x"]["time"] == {"median": 6.0, "min": 0.5, "max": 50.0, "n": 3}
    assert "base" not in s["ratios"]


def test_a_trial_is_flagged_above_max_load_and_the_run_refused_when_more_than_half_are():
    run = harness.Run("t", args(max_load=0.5), ["base", "x"], "base", "time", argv=["t"])
    run.cell("c")
    for other in (0.1, 0.6, 0.5, 0.9):  # 0.5 is not above 0.5
        run.add_trial(trial({"base": 1.0, "x": 1.0})["samples"], load(other), ["base", "x"])
    assert [t["flagged"] for t in run.trials] == [False, True, False, True]
    doc = run.document()
    assert doc["summary"]["flagged"] == 2 and doc["refused"] is None  # half, not more than half
    run.add_trial(trial({"base": 1.0, "x": 1.0})["samples"], load(2.0), ["base", "x"])
    doc = run.document()
    assert doc["summary"]["flagged"] == 3
    assert "3 of 5 trials" in doc["refused"] and "--max-load 0.5" in doc["refused"] and "up to 2.00" in doc["refused"]
    run.args.allow_load = True
    assert run.document()["refused"] is None


def test_bad_input_is_named():
    with pytest.raises(harness.HarnessError, match="--trials must be at least 1, got 0"):
        harness.Run("t", args(trials=0), ["a"], "a", "time")
    with pytest.raises(harness.HarnessError, match="baseline 'z' is not one of the methods"):
        harness.Run("t", args(), ["a"], "z", "time")
    run = harness.Run("t", args(), ["a"], "a", "time")
    with pytest.raises(harness.HarnessError, match="undeclared cell 'c'"):
        run.add_trial({"c": {"a": {"time": 1.0}}}, load(0.0), ["a"])
    run.cell("c")
    with pytest.raises(harness.HarnessError, match="unknown method 'b'"):
        run.add_trial({"c": {"b": {"time": 1.0}}}, load(0.0), ["a"])


def test_a_single_trial_is_marked_as_a_single_sample():
    assert harness.cell_text({"median": 0.0123, "min": 0.0123, "max": 0.0123, "n": 1}, 1e3, 1) == "12.3 (1 sample)"
    assert harness.cell_text({"median": 0.0123, "min": 0.011, "max": 0.0131, "n": 5}, 1e3, 1) == "12.3 (11.0-13.1)"
    assert harness.cell_text(None) == "-"


def finished(tmp_path, other_loads, **kw):
    """A finished run of made-up trials; its document and the process's exit code (None: no exit)."""
    a = args(results_dir=str(tmp_path), trials=len(other_loads), **kw)
    run = harness.Run("made_up", a, ["base", "x"], "base", "time", argv=["made_up.py", "--trials", str(a.trials)])
    run.cell("c", size=4096)
    run.info["note"] = "made up"
    for t, other in enumerate(other_loads):
        order = harness.trial_order(["base", "x"], t)
        run.add_trial({"c": {"base": {"time": 2.0 + t}, "x": {"time": 1.0 + t}}}, load(other), order,
                      detail={"raw": [t]})
    try:
        run.finish()
        code = None
    except SystemExit as e:
        code = e.code
    (d,) = os.listdir(tmp_path)
    with open(tmp_path / d / "results.json") as f:
        return json.load(f), code, tmp_path / d


def test_results_json_holds_commit_command_machine_trials_and_summary(tmp_path, capsys):
    doc, code, d = finished(tmp_path, [0.0, 0.1, 0.0])
    assert code is None
    assert d.name.startswith("made_up-") and d.name.endswith("Z")
    assert doc["benchmark"] == "made_up" and doc["format"] == harness.FORMAT
    assert doc["command"] == ["made_up.py", "--trials", "3"]
    assert doc["args"]["trials"] == 3 and doc["args"]["max_load"] == harness.DEFAULT_MAX_LOAD
    head = subprocess.run(["git", "-C", harness.REPO, "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:  # in a checkout (not in a copy without .git)
        assert doc["commit"]["head"] == head.stdout.strip() and doc["commit"]["dirty"] in (True, False)
    else:
        assert doc["commit"]["head"] is None and doc["commit"]["error"]
    assert doc["machine"]["nproc"] == os.cpu_count() and doc["machine"]["kernel"].startswith("Linux")
    assert "torch" in doc["machine"]
    assert doc["cells"] == {"c": {"size": 4096}} and doc["info"] == {"note": "made up"}
    assert [t["order"] for t in doc["trials"]] == [["base", "x"], ["x", "base"], ["base", "x"]]
    assert [t["samples"]["c"]["x"]["time"] for t in doc["trials"]] == [1.0, 2.0, 3.0]
    assert doc["trials"][1]["load"]["other_cores"] == 0.1 and doc["trials"][2]["detail"] == {"raw": [2]}
    assert doc["summary"]["cells"]["c"]["methods"]["x"]["time"] == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}
    assert doc["summary"]["cells"]["c"]["ratios"]["x"]["median"] == 2 / 3  # of 1/2, 2/3, 3/4
    assert doc["refused"] is None and doc["summary"]["flagged"] == 0
    out = capsys.readouterr().out
    assert "median of 3 trials" in out and str(d / "results.json") in out
    assert (d / "report.md").read_text().startswith("made_up, ")


def test_a_refused_run_writes_its_results_and_exits_non_zero(tmp_path, capsys):
    doc, code, _ = finished(tmp_path, [0.9, 0.0, 0.8])
    assert code == 3
    assert doc["refused"].startswith("2 of 3 trials") and [t["flagged"] for t in doc["trials"]] == [True, False, True]
    assert "refused: 2 of 3 trials" in capsys.readouterr().err


def test_allow_load_reports_a_loaded_run_with_its_trials_flagged(tmp_path, capsys):
    doc, code, d = finished(tmp_path, [0.9, 0.0, 0.8], allow_load=True)
    assert code is None and doc["refused"] is None
    text = harness.trials_table(doc)
    assert text.count("**flagged**") == 2
    assert "Trials with other processes above 0.5 cores: 2 of 3 (--allow-load)" in harness.preamble(doc)


def test_one_trial_is_said_to_be_a_single_sample(tmp_path):
    doc, _, _ = finished(tmp_path, [0.0])
    assert "**a single sample**" in harness.preamble(doc)


SPIN = """
import sys, time
while time.process_time() < {cpu}:
    pass
print("done", flush=True)
"""


def test_load_probe_counts_the_benchmarks_own_processes_as_its_own():
    """A child that computes 0.4 s of CPU is the benchmark's (own), however busy the machine:
    once it has exited and been waited for, and while it still runs at the probe's stop."""
    probe = harness.LoadProbe()
    probe.start()
    subprocess.run([sys.executable, "-c", SPIN.format(cpu=0.4)], check=True, capture_output=True, timeout=120)
    r = probe.stop()
    assert r["own_cores"] * r["wall_s"] >= 0.35, r
    assert abs(r["other_cores"] - (r["busy_cores"] - r["own_cores"])) < 1e-9, r  # other: busy less own
    assert set(r) == {"loadavg_before", "loadavg_after", "wall_s", "busy_cores", "own_cores", "other_cores"}
    probe.start()
    child = subprocess.Popen([sys.executable, "-c", SPIN.format(cpu=0.4) + "time.sleep(120)\n"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "done"
        r = probe.stop()  # the child alive, asleep
    finally:
        child.kill()
        child.wait()
    assert r["own_cores"] * r["wall_s"] >= 0.35, r


def test_load_probe_counts_a_process_outside_the_benchmarks_tree_as_other():
    """A process that is not a descendant (started through an intermediate that exits at once,
    so it is reparented) computing 0.4 s of CPU: other processes' CPU."""
    launcher = ("import subprocess, sys\n"
                f"subprocess.Popen([sys.executable, '-c', {SPIN.format(cpu=0.4)!r}], start_new_session=True)\n")
    probe = harness.LoadProbe()
    probe.start()
    p = subprocess.Popen([sys.executable, "-c", launcher], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "done"  # the grandchild's line: it has finished its work
    p.wait(60)
    time.sleep(0.05)
    r = probe.stop()
    assert r["other_cores"] * r["wall_s"] >= 0.3, r


def test_load_probe_root_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv(harness.ROOT_PID_ENV, "12345")
    assert harness.LoadProbe().root == 12345
    monkeypatch.delenv(harness.ROOT_PID_ENV)
    assert harness.LoadProbe().root == os.getpid()


def test_report_renders_a_results_file_and_refuses_a_refused_one(tmp_path):
    """report.py on a quantized_allreduce results file made up here: the benchmark's table with
    medians, spreads and per-trial speed-ups; a refused run is not rendered."""
    q = bench_script.load("quantized_allreduce")
    a = args(results_dir=str(tmp_path), trials=2)
    a.ranks, a.network, a.bytes, a.iterations = 2, "local", 4096, 1
    run = harness.Run("quantized_allreduce", a, q.VARIANTS, "exact float32", "time", argv=["q"])
    run.cell(q.CELL)
    run.info["error"] = {v: 1e-3 for v in q.VARIANTS}
    for t, scale in enumerate((1.0, 2.0)):
        run.add_trial({q.CELL: {v: {"time": scale * (4 - i), "sent": 1e6} for i, v in enumerate(q.VARIANTS)}},
                      load(0.0), harness.trial_order(q.VARIANTS, t))
    path = harness.write(run.document(), str(tmp_path))
    report = os.path.join(bench_script.TOOLS, "bench", "report.py")
    out = subprocess.run([sys.executable, report, os.path.dirname(path), "--plot", str(tmp_path / "q.png")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    # exact 4 and 8 s, 4 bits 1 and 2 s: 6000 (4000-8000) ms, speed-up 4.00x in both trials.
    assert "| quantized 4 bits | 1500 (1000-2000) | 4.00x (4.00-4.00) |" in out.stdout, out.stdout
    assert (tmp_path / "q.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    refused = dict(json.loads(open(path).read()), refused="2 of 2 trials ran while ...")
    with open(path, "w") as f:
        json.dump(refused, f)
    out = subprocess.run([sys.executable, report, path], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "the run was refused: 2 of 2 trials" in out.stderr
    with open(path, "w") as f:
        json.dump({"something": "else"}, f)
    out = subprocess.run([sys.executable, report, path], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "not a results file" in out.stderr
