"""tools/bench/allreduce_backends.py: the table's figures (median over iterations of the slowest
rank, the ring's link bound, tx per op averaged over ranks) and the plot, on made-up timings."""

import bench_script


def load():
    return bench_script.load("allreduce_backends")


def entry(nbytes, gloo, gossipcc, tx):
    return {"bytes": nbytes, "k": len(gloo), "times": {"gloo": gloo, "gossipcc": gossipcc},
            "tx_per_op": {"gloo": tx[0], "gossipcc": tx[1]}}


# Two ranks, one size, three iterations each. Slowest rank per iteration: gloo 3, 5, 4 -> median
# 4; gossipcc 2, 9, 1 -> median 2 (rank 1's 9 is the slowest of iteration 2, not an outlier
# dropped). tx averaged over the ranks.
DOCS = [
    [entry(1 << 20, [3.0, 1.0, 4.0], [1.0, 9.0, 1.0], (1500.0, 1600.0))],
    [entry(1 << 20, [2.0, 5.0, 1.0], [2.0, 1.0, 0.5], (1700.0, 1400.0))],
]


def test_summary_takes_the_slowest_rank_per_iteration_then_the_median():
    rows = load().summarize(DOCS, n=2, bps=None)
    assert len(rows) == 1
    assert rows[0]["gloo"] == 4.0
    assert rows[0]["gossipcc"] == 2.0
    assert rows[0]["tx_gloo"] == 1600.0
    assert rows[0]["tx_gossipcc"] == 1500.0
    assert rows[0]["bound"] is None


def test_link_bound_is_the_rings_bytes_at_the_link_rate():
    m = load()
    bps = m.link_bytes_per_second("1gbit")
    assert bps == 125e6
    rows = m.summarize(DOCS, n=4, bps=bps)
    assert abs(rows[0]["bound"] - 1.5 * (1 << 20) / 125e6) < 1e-12
    assert m.link_bytes_per_second("none") is None
    table = m.table(rows, "1gbit")
    assert "| 1 MB | 3 | 4000.00 | 2000.00 | 0.50 |" in table
    assert "link bound (ms)" in table


def test_quantiles_are_of_the_slowest_rank_per_iteration():
    m = load()
    rows = m.summarize(DOCS, n=2, bps=None)
    assert rows[0]["slowest_gloo"] == [3.0, 5.0, 4.0]
    assert rows[0]["slowest_gossipcc"] == [2.0, 9.0, 1.0]
    table = m.quantile_table(rows)
    # gloo sorted 3, 4, 5: p10 3.2, p25 3.5, median 4, p75 4.5, p90 4.8, mean 4 (s -> ms).
    assert "| 1 MB | gloo | 3 | 3200.00 | 3500.00 | 4000.00 | 4500.00 | 4800.00 | 4000.00 |" in table
    # gossipcc sorted 1, 2, 9: median 2, p75 5.5, mean 4.
    assert "| 1 MB | gossipcc | 3 | 1200.00 | 1500.00 | 2000.00 | 5500.00 | 7600.00 | 4000.00 |" in table
    assert m.iterations(1 << 20) == 30 and m.iterations(1 << 20, 60) == 60


# The same two ranks with the packed variant too: gossipcc packed's slowest per iteration is
# 1.5, 1.0, 2.5 -> median 1.5; its ratio to gloo's 4 is 0.375 -> "0.38"; at 1 Gbit/s on 2 ranks
# the bound is 1 MiB / 125e6 B/s = 8.39 ms, and packed / bound = 1.5 / 0.00839 = 178.81.
PACKED = [
    [dict(DOCS[0][0], times=dict(DOCS[0][0]["times"], **{"gossipcc packed": [1.5, 1.0, 2.0]}),
          tx_per_op=dict(DOCS[0][0]["tx_per_op"], **{"gossipcc packed": 1000.0}))],
    [dict(DOCS[1][0], times=dict(DOCS[1][0]["times"], **{"gossipcc packed": [1.0, 0.5, 2.5]}),
          tx_per_op=dict(DOCS[1][0]["tx_per_op"], **{"gossipcc packed": 1200.0}))],
]


def test_the_packed_variant_gets_its_own_columns():
    m = load()
    rows = m.summarize(PACKED, n=2, bps=125e6)
    assert rows[0]["gossipcc packed"] == 1.5
    assert rows[0]["tx_gossipcc packed"] == 1100.0
    table = m.table(rows, "1gbit")
    assert "| size | k | gloo (ms) | gossipcc (ms) | gossipcc packed (ms) | ratio gossipcc/gloo | " \
           "ratio gossipcc packed/gloo | link bound (ms) |" in table
    assert "| 1 MB | 3 | 4000.00 | 2000.00 | 1500.00 | 0.50 | 0.38 | 8.39 | 476.84 | 238.42 | 178.81 | " \
           "0.002 | 0.001 | 0.001 |" in table
    assert "| 1 MB | gossipcc packed | 3 |" in m.quantile_table(rows)


def test_plot_writes_a_png(tmp_path):
    m = load()
    results = {"none": m.summarize(DOCS, 2, None), "1gbit": m.summarize(PACKED, 2, 125e6)}
    path = tmp_path / "allreduce.png"
    m.plot(results, str(path), "test")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
