"""tools/bench/p2p_segments.py (a diagnostic on the harness, the segment sizes as its methods): a
trial's sample is the median over its iterations of the slower rank's time, the table shows the
median and min-max over trials in ms and in message times, and each size's time over the whole
message's as the median of the per-trial ratios; bad --segments and an unshaped network are
refused with the reason. The benchmark itself needs the emulated network."""
import os
import subprocess
import sys

import bench_script

LOAD = {"loadavg_before": [0.5, 0.5, 0.5], "loadavg_after": [0.6, 0.5, 0.5], "wall_s": 1.0, "busy_cores": 1.0,
        "own_cores": 1.0, "other_cores": 0.0}
SEGS = ["1048576", "262144"]


def rank_doc(trials):
    return {"trials": [{"times": dict(zip(SEGS, t)), "order": SEGS, "load": LOAD} for t in trials]}


def test_table_is_over_trials_with_per_trial_ratios():
    m = bench_script.load("p2p_segments")
    run = bench_script.harness().Run("p2p_segments", bench_script.harness_args(trials=2), SEGS, SEGS[0], "time")
    run.info["segment_env"] = "default"
    # Trial 1, slower rank per iteration: whole 0.010, 0.030 -> 0.020; 256 KB 0.010, 0.014 -> 0.012.
    # Trial 2: whole 0.040, 256 KB 0.040. Ratios 0.6 and 1.0 -> 0.8 (the ratio of the medians: 26 / 30).
    docs = [rank_doc([([0.010, 0.030], [0.010, 0.012]), ([0.040], [0.020])]),
            rank_doc([([0.005, 0.020], [0.009, 0.014]), ([0.030], [0.040])])]
    m.record(run, docs, 0.010)
    d = run.document()
    d["args"].update(backend="gloo", bytes=1 << 20, network="1gbit", iters=2)
    text = m.report(d)
    assert "| 1 MB | 30.0 (20.0-40.0) | 3.00 (2.00-4.00) | 1.00 |" in text, text
    assert "| 256 KB | 26.0 (12.0-40.0) | 2.60 (1.20-4.00) | 0.80 (0.60-1.00) |" in text, text


def test_bad_segments_and_an_unshaped_network_are_refused(tmp_path):
    script = os.path.join(bench_script.TOOLS, "bench", "p2p_segments.py")
    for flags, message in ((["--segments", "1048576,1000001"], "distinct positive multiples of 4 bytes"),
                           (["--segments", "4096,4096"], "distinct positive multiples of 4 bytes"),
                           (["--network", "local"], "must be a shaped emulated_cluster preset"),
                           (["--network", "none"], "unshaped")):
        out = subprocess.run([sys.executable, script, "--results-dir", str(tmp_path)] + flags,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 2 and message in out.stderr, (flags, out.stderr)
