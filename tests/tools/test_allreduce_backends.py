"""tools/bench/allreduce_backends.py: the table's figures (the slowest rank per iteration, the
median over a trial's iterations, then the median and min-max over trials; the ratios to gloo
per trial; the ring's link bound; tx per op averaged over ranks), the quantiles over every
trial's iterations and the plot, on made-up timings; and one tiny run on 2 local ranks (2
trials), so that the worker cannot rot: the benchmark itself needs the emulated network and
minutes."""
import json
import os
import subprocess
import sys

import pytest

import bench_script

LOAD = {"loadavg_before": [0.5, 0.5, 0.5], "loadavg_after": [0.6, 0.5, 0.5], "wall_s": 9.0, "busy_cores": 1.0,
        "own_cores": 1.0, "other_cores": 0.0}


def load():
    return bench_script.load("allreduce_backends")


def entry(nbytes, times, tx):
    return {"bytes": nbytes, "k": len(times["gloo"]), "times": times, "tx_per_op": tx}


def rank_doc(trials):
    return {"trials": [{"sizes": sizes, "order": ["gloo", "gossipcc"], "load": LOAD} for sizes in trials]}


# Two ranks, one size, two trials of three iterations. Trial 1, slowest rank per iteration: gloo
# 3, 5, 4 -> median 4; gossipcc 2, 9, 1 -> median 2 (rank 1's 9 is the slowest of iteration 2,
# not an outlier dropped). Trial 2: gloo 8, gossipcc 6 (every time doubled, gossipcc's tripled).
# tx averaged over the ranks.
R0 = {"gloo": [3.0, 1.0, 4.0], "gossipcc": [1.0, 9.0, 1.0]}
R1 = {"gloo": [2.0, 5.0, 1.0], "gossipcc": [2.0, 1.0, 0.5]}


def scaled(times, k):
    return {"gloo": [2 * x for x in times["gloo"]], "gossipcc": [k * x for x in times["gossipcc"]]}


DOCS = [rank_doc([[entry(1 << 20, R0, {"gloo": 1500.0, "gossipcc": 1600.0})],
                  [entry(1 << 20, scaled(R0, 3), {"gloo": 1500.0, "gossipcc": 1600.0})]]),
        rank_doc([[entry(1 << 20, R1, {"gloo": 1700.0, "gossipcc": 1400.0})],
                  [entry(1 << 20, scaled(R1, 3), {"gloo": 1700.0, "gossipcc": 1400.0})]])]


def recorded(docs, network="none", n=2, bps=None, quantiles=False):
    m = load()
    h = bench_script.harness()
    run = h.Run("allreduce_backends", bench_script.harness_args(trials=len(docs[0]["trials"])), m.BACKENDS, "gloo",
                "time")
    m.record(run, docs, network, n, bps)
    d = run.document()
    d["args"].update(ranks=n, min_bytes=1 << 20, max_bytes=1 << 20, data="constant", quantiles=quantiles)
    return m, d


def test_samples_take_the_slowest_rank_per_iteration_then_the_median_then_over_trials():
    m, d = recorded(DOCS)
    cell = "none 1 MB"
    assert [t["samples"][cell]["gloo"]["time"] for t in d["trials"]] == [4.0, 8.0]
    assert [t["samples"][cell]["gossipcc"]["time"] for t in d["trials"]] == [2.0, 6.0]
    s = d["summary"]["cells"][cell]
    assert s["methods"]["gloo"]["time"] == {"median": 6.0, "min": 4.0, "max": 8.0, "n": 2}
    assert s["methods"]["gossipcc"]["tx"]["median"] == 1500.0
    # Per-trial ratios 0.5 and 0.75: median 0.625 (the ratio of the medians would be 4 / 6 = 0.67).
    assert s["ratios"]["gossipcc"] == {"median": 0.625, "min": 0.5, "max": 0.75, "n": 2}
    assert d["cells"][cell]["bound"] is None
    assert d["trials"][0]["detail"]["slowest"][cell]["gossipcc"] == [2.0, 9.0, 1.0]


def test_link_bound_is_the_rings_bytes_at_the_link_rate():
    m = load()
    bps = m.link_bytes_per_second("1gbit")
    assert bps == 125e6
    assert m.link_bytes_per_second("none") is None
    _, d = recorded(DOCS, "1gbit", 4, bps)
    assert abs(d["cells"]["1gbit 1 MB"]["bound"] - 1.5 * (1 << 20) / 125e6) < 1e-12
    table = m.table(d, "1gbit")
    assert "| 1 MB | 3 | 6000.00 (4000.00-8000.00) | 4000.00 (2000.00-6000.00) | 0.62 (0.50-0.75) | 12.58 |" \
        in table
    assert "link bound (ms)" in table
    unshaped = m.table(recorded(DOCS)[1], "none")
    assert "| 1 MB | 3 |" in unshaped and "link bound" not in unshaped


def test_quantiles_are_of_the_slowest_rank_per_iteration_over_every_trial():
    m, d = recorded([rank_doc([[entry(1 << 20, R0, {"gloo": 0.0, "gossipcc": 0.0})]]),
                     rank_doc([[entry(1 << 20, R1, {"gloo": 0.0, "gossipcc": 0.0})]])])
    table = m.quantile_table(d, "none")
    # gloo sorted 3, 4, 5: p10 3.2, p25 3.5, median 4, p75 4.5, p90 4.8, mean 4 (s -> ms).
    assert "| 1 MB | gloo | 3 | 3200.00 | 3500.00 | 4000.00 | 4500.00 | 4800.00 | 4000.00 |" in table
    # gossipcc sorted 1, 2, 9: median 2, p75 5.5, mean 4.
    assert "| 1 MB | gossipcc | 3 | 1200.00 | 1500.00 | 2000.00 | 5500.00 | 7600.00 | 4000.00 |" in table
    _, d = recorded(DOCS, quantiles=True)
    assert "| 1 MB | gloo | 6 |" in m.quantile_table(d, "none")  # both trials' iterations
    assert "per-iteration distribution, network none" in m.report(d)
    assert m.iterations(1 << 20) == 10 and m.iterations(1 << 20, 60) == 60 and m.iterations(256 << 20) == 1


def with_packed(doc, packed, tx):
    return {"trials": [{**t, "sizes": [dict(e, times=dict(e["times"], **{"gossipcc packed": packed}),
                                            tx_per_op=dict(e["tx_per_op"], **{"gossipcc packed": tx}))
                                       for e in t["sizes"]]} for t in doc["trials"]]}


# The packed variant too (the same in both trials): slowest per iteration 1.5, 1.0, 2.5 ->
# median 1.5; its per-trial ratios to gloo 1.5/4 and 1.5/8 -> median 0.28; at 1 Gbit/s on 2
# ranks the bound is 1 MiB / 125e6 B/s = 8.39 ms, and packed / bound = 1.5 / 0.00839 = 178.81.
PACKED = [with_packed(DOCS[0], [1.5, 1.0, 2.0], 1000.0), with_packed(DOCS[1], [1.0, 0.5, 2.5], 1200.0)]


def test_the_packed_variant_gets_its_own_columns():
    m, d = recorded(PACKED, "1gbit", 2, 125e6)
    s = d["summary"]["cells"]["1gbit 1 MB"]
    assert s["methods"]["gossipcc packed"]["time"]["median"] == 1.5
    assert s["methods"]["gossipcc packed"]["tx"]["median"] == 1100.0
    table = m.table(d, "1gbit")
    assert "| size | k per trial | gloo (ms) | gossipcc (ms) | gossipcc packed (ms) | ratio gossipcc/gloo | " \
           "ratio gossipcc packed/gloo | link bound (ms) |" in table
    assert "| 1500.00 (1500.00-1500.00) | 0.62 (0.50-0.75) | 0.28 (0.19-0.38) | 8.39 | 715.26 | 476.84 | 178.81 | " \
           "0.002 | 0.001 | 0.001 |" in table
    assert "| 1 MB | gossipcc packed | 6 |" in m.quantile_table(d, "1gbit")


def test_plot_writes_a_png(tmp_path):
    m, d = recorded(PACKED, "1gbit", 2, 125e6)
    _, d2 = recorded(DOCS)
    d["cells"].update(d2["cells"])
    d["summary"]["cells"].update(d2["summary"]["cells"])
    path = tmp_path / "allreduce.png"
    m.plot(d, str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("layout", [["--ranks", "2"], ["--hosts", "1", "--ranks-per-host", "2"]],
                         ids=["hosts_of_one_rank", "a_host_of_two"])
def test_tiny_run_on_local_ranks(tmp_path, layout):
    script = os.path.join(bench_script.TOOLS, "bench", "allreduce_backends.py")
    out = subprocess.run([sys.executable, script, "--network", "local"] + layout + ["--min-bytes", "4096",
                          "--max-bytes", str(16 << 10), "--iterations", "1", "--data", "constant", "--trials", "2",
                          "--allow-load", "--results-dir", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "| 4 KB | 1 |" in out.stdout and "| 16 KB | 1 |" in out.stdout, out.stdout
    (d,) = os.listdir(tmp_path)
    with open(tmp_path / d / "results.json") as f:
        doc = json.load(f)
    # The hierarchical variant runs on hosts of several ranks only (--ranks-per-host > 1).
    backends = [b for b in load().BACKENDS if b != "gossipcc hierarchical" or "--ranks-per-host" in layout]
    assert [t["order"] for t in doc["trials"]] == [backends, backends[1:] + backends[:1]]
    assert doc["summary"]["cells"]["local 16 KB"]["methods"]["gossipcc packed"]["time"]["n"] == 2
