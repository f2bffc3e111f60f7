"""tools/bench/powersgd_overlap.py: the figures (the slowest rank per step, the median per round,
the median over rounds), the ratios against max(backward, comm) and the goal, on made-up
timings; and one tiny run end to end on 2 local ranks (no emulated network), so that the
worker's three DDP variants and two references cannot rot."""
import os
import subprocess
import sys

import bench_script



def timing(step, bwd=None):
    return {"step": step} if bwd is None else {"step": step, "bwd": bwd, "computed": bwd - 0.002}


def doc(rounds):
    """rounds: [{name: [(step, bwd), ...]}] of one rank (bwd None for comm)."""
    return {"rounds": [{name: {"times": [timing(*t) for t in steps], "tx_per_step": 1000.0}
                        for name, steps in r.items()} for r in rounds]}


def test_summary_takes_the_slowest_rank_per_step_then_medians():
    m = bench_script.load("powersgd_overlap")
    # Round 1: rank 1 is slower at step 0, rank 0 at step 1 and 2; round 2 shifted by +0.010.
    r0 = [{"overlap": [(0.050, 0.030), (0.070, 0.045), (0.060, 0.040)]},
          {"overlap": [(0.060, 0.040), (0.080, 0.055), (0.070, 0.050)]},
          {"overlap": [(0.055, 0.035), (0.075, 0.050), (0.065, 0.045)]}]
    r1 = [{"overlap": [(0.090, 0.031), (0.010, 0.010), (0.010, 0.010)]},
          {"overlap": [(0.100, 0.041), (0.010, 0.010), (0.010, 0.010)]},
          {"overlap": [(0.095, 0.036), (0.010, 0.010), (0.010, 0.010)]}]
    s = m.summarize([doc(r0), doc(r1)])
    # Slowest per step, round 1: step 0.090/0.070/0.060 -> median 0.070; bwd 0.031/0.045/0.040 -> 0.040.
    assert s["overlap"]["round_medians"]["step"] == [0.070, 0.080, 0.075]
    assert s["overlap"]["round_medians"]["bwd"] == [0.040, 0.050, 0.045]
    assert s["overlap"]["step"] == 0.075 and s["overlap"]["bwd"] == 0.045
    assert s["overlap"]["tx_per_step"] == 1000.0


def made_up_summary(overlap_bwd, comm):
    m = bench_script.load("powersgd_overlap")
    steps = {"overlap": (overlap_bwd + 0.02, overlap_bwd), "blocking": (0.080, 0.060), "torch": (0.120, 0.100),
             "backward": (0.050, 0.030), "ddp-nocomm": (0.060, 0.036), "comm": (comm, None),
             "comm-buckets": (comm + 0.004, None)}
    return m, m.summarize([doc([{name: [t] for name, t in steps.items()}])])


def test_rows_ratios_and_goal():
    m, s = made_up_summary(overlap_bwd=0.0342, comm=0.020)
    rows, bound, step_bound = m.table_rows(s, bytes_per_second=12.5e6)
    assert bound == 0.030  # backward 30 ms > comm 20 ms
    assert abs(step_bound - 0.050) < 1e-12  # 50 - 30 + 30
    by_name = {r[0]: r for r in rows}
    assert len(rows[0]) == len(m.HEADER)
    assert by_name["overlap"][1:8] == ["54.2", "34.2", "34.2-34.2", "32.2", "1.14", "yes", "0.68"]  # 34.2 / (30 + 20)
    assert by_name["blocking"][5:7] == ["2.00", "no"]
    assert by_name["torch"][8] == "2.40"  # step 120 / step bound 50
    assert by_name["comm alone (powersgd_allreduce)"][2] == "20.0 (its bytes at the link rate: 0.1)"
    assert by_name["comm alone, in DDP's buckets"][2:4] == ["24.0 (its bytes at the link rate: 0.1)", "24.0-24.0"]
    assert "met" in m.verdict(s, bound) and "NOT met" not in m.verdict(s, bound)


def test_goal_not_met_when_communication_dominates_and_overlap_is_slow():
    m, s = made_up_summary(overlap_bwd=0.070, comm=0.040)
    rows, bound, _ = m.table_rows(s)
    assert bound == 0.040
    assert rows[0][5:7] == ["1.75", "no"]
    assert "NOT met" in m.verdict(s, bound)


def test_tiny_run_on_local_ranks():
    script = os.path.join(bench_script.TOOLS, "bench", "powersgd_overlap.py")
    out = subprocess.run([sys.executable, script, "--network", "local", "--width", "64", "--layers", "2",
                          "--bucket-cap-mb", "0.015625", "--batch", "4", "--start-iter", "2", "--steps", "2",
                          "--repeats", "1"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    for label in ("| overlap |", "| blocking |", "| torch |", "| backward alone (no DDP) |",
                  "| DDP, no communication |", "| comm alone (powersgd_allreduce) |",
                  "| comm alone, in DDP's buckets |", "goal, overlap's bwd+comm"):
        assert label in out.stdout, out.stdout
    # A bucket (16 KiB) closes once it holds a 64 x 64 weight: (head, layer 2), (layer 1).
    assert "2 DDP buckets" in out.stdout, out.stdout
