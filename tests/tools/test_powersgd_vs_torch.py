"""tools/bench/powersgd_vs_torch.py: a cell's figures (per figure the median and min-max over the
trials; the speed-up, the hook's time over gossipcc's, computed within each trial and its median
taken) and the plot, on made-up runs: the benchmark itself needs the emulated network and
minutes."""
import bench_script

LOAD = {"loadavg_before": [0.5, 0.5, 0.5], "loadavg_after": [0.6, 0.5, 0.5], "wall_s": 9.0, "busy_cores": 1.0,
        "own_cores": 1.0, "other_cores": 0.0}


def run(seconds, tx, acc=0.9):
    """One method's run; its hosts of two ranks send twice a rank's bytes."""
    return {"time_per_step": seconds, "bytes_per_step": tx, "host_bytes_per_step": None if tx is None else 2 * tx,
            "test_acc": acc}


def recorded(cells):
    """cells: {(network, rank): [(gossipcc run, torch run) per trial]} -> (module, document)."""
    m = bench_script.load("powersgd_vs_torch")
    trials = max(len(v) for v in cells.values())
    r = bench_script.harness().Run("powersgd_vs_torch", bench_script.harness_args(trials=trials), m.METHODS, "torch",
                                   "time_per_step")
    r.info["start_iter"] = 10
    for (network, rank), pairs in cells.items():
        cell = r.cell(m.cell_name(network, rank), network=network, rank=rank)
        for t, (g, h) in enumerate(pairs):
            r.add_trial({cell: {"gossipcc": g, "torch": h}}, LOAD, m.METHODS, group=cell)
    d = r.document()
    d["args"].update(ranks=4, hosts=2, ranks_per_host=2, hidden=1024, batch=8, steps=60)
    return m, d


def test_cell_takes_the_median_of_each_figure_and_the_median_of_the_per_trial_speed_ups():
    # Speed-ups per trial: 0.050/0.020 = 2.5, 0.040/0.030 = 1.33, 0.045/0.010 = 4.5 -> 2.5; the
    # speed-up of the medians would be 0.045/0.020 = 2.25.
    m, d = recorded({("1gbit", "2"): [(run(0.020, 76000.0), run(0.050, 51000.0, 0.8)),
                                      (run(0.030, 78000.0), run(0.040, 52000.0, 0.8)),
                                      (run(0.010, 77000.0), run(0.045, 53000.0, 0.8))]})
    s = d["summary"]["cells"]["1gbit rank 2"]
    assert s["methods"]["gossipcc"]["time_per_step"] == {"median": 0.020, "min": 0.010, "max": 0.030, "n": 3}
    assert s["speedups"]["gossipcc"]["median"] == 2.5
    assert m.report_rows(d) == [["1gbit", "2", "20.0 (10.0-30.0)", "45.0 (40.0-50.0)", "2.50x (1.33-4.50)",
                                 "77.0 (76.0-78.0)", "52.0 (51.0-53.0)", "154.0 (152.0-156.0)",
                                 "104.0 (102.0-106.0)", "90.0% / 80.0%"]]


def test_a_cell_without_tx_counters_says_so():
    m, d = recorded({("local", "1"): [(run(0.02, None), run(0.04, None))]})
    row = m.report_rows(d)[0]
    assert row[5:9] == ["-", "-", "-", "-"]
    assert row[4] == "2.00x (1 sample)"


def test_plot_writes_a_png(tmp_path):
    cells = {(net, r): [(run(0.02, 76000.0), run(0.045, 52000.0)), (run(0.025, 76000.0), run(0.04, 52000.0))]
             for net in ("1gbit", "100mbit") for r in "12"}
    cells[("local", "1")] = [(run(0.02, None), run(0.04, None))] * 2
    m, d = recorded(cells)
    path = tmp_path / "powersgd.png"
    m.plot(d, str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| 100mbit | 2 |" in m.report(d)
