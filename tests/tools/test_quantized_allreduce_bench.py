"""tools/bench/quantized_allreduce.py: the table's figures (the slowest rank per iteration, the
median, the speed-ups against the exact rows (gossipcc's and gloo's), tx per op averaged over ranks, the worst error over
ranks), its refusal of any row, the exact one included, whose ranks hold different bits; and one
tiny run end to end on 2 local ranks (no emulated network), so that the worker cannot rot."""
import os
import re
import subprocess
import sys

import pytest

import bench_script

VARIANTS = ("exact float32", "exact float32 (gloo)", "quantized 8 bits", "quantized 4 bits")


def load():
    return bench_script.load("quantized_allreduce")


def doc(times, sent, error, digest="same"):
    """One rank's document: per variant its times (s), tx bytes per iteration, error."""
    return {"times": dict(zip(VARIANTS, times)), "sent": dict(zip(VARIANTS, sent)),
            "error": dict(zip(VARIANTS, error)), "digest": {v: digest for v in VARIANTS}}


# Two ranks, three iterations. Slowest rank per iteration: exact 2.0, 2.4, 2.2 -> median 2.2;
# gloo 2.4, 2.5, 2.3 -> 2.4; 8 bits 0.6, 0.7, 0.5 -> 0.6 (rank 1's 0.7 is iteration 2's slowest,
# not dropped); 4 bits 0.4, 0.3, 0.35 -> 0.35.
DOCS = [
    doc([[2.0, 2.1, 2.2], [2.4, 2.5, 2.2], [0.6, 0.5, 0.5], [0.4, 0.3, 0.3]],
        [[26e6, 26e6, 26e6], [26e6, 26e6, 26e6], [6.6e6, 6.8e6, 6.7e6], [3.4e6, 3.4e6, 3.4e6]],
        [1e-7, 1e-7, 8e-3, 0.1]),
    doc([[1.9, 2.4, 2.0], [2.3, 2.4, 2.3], [0.5, 0.7, 0.4], [0.3, 0.2, 0.35]],
        [[26e6, 26e6, 26e6], [26e6, 26e6, 26e6], [6.7e6, 6.7e6, 6.7e6], [3.5e6, 3.5e6, 3.5e6]],
        [2e-7, 2e-7, 7e-3, 0.2]),
]


def test_rows_take_the_slowest_rank_per_iteration_then_the_median():
    rows = {r[0]: r for r in load().summarize(DOCS)}
    assert rows["exact float32"][1:5] == ["2200", "2000-2400", "1.00x", "1.09x"]
    assert rows["exact float32 (gloo)"][1:5] == ["2400", "2300-2500", "0.92x", "1.00x"]
    assert rows["quantized 8 bits"][1:5] == ["600", "500-700", "3.67x", "4.00x"]
    assert rows["quantized 4 bits"][1:5] == ["350", "300-400", "6.29x", "6.86x"]
    assert rows["quantized 8 bits"][5] == "6.70"  # mean over iterations, then over ranks
    assert rows["quantized 4 bits"][6] == "2.00e-01"  # the worst rank's error


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_row_whose_ranks_differ_is_refused(variant):
    docs = [dict(d, digest=dict(d["digest"])) for d in DOCS]
    docs[1]["digest"][variant] = "other"
    with pytest.raises(AssertionError, match=re.escape(f"{variant}: ranks hold different results")):
        load().summarize(docs)


def test_tiny_run_on_local_ranks():
    script = os.path.join(bench_script.TOOLS, "bench", "quantized_allreduce.py")
    out = subprocess.run([sys.executable, script, "--network", "local", "--ranks", "2", "--bytes", str(64 << 10),
                          "--iterations", "1"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    for v in VARIANTS:
        assert f"| {v} |" in out.stdout, out.stdout
