"""tools/bench/powersgd_vs_torch.py: a cell's figures (the median of each figure over the runs,
the speed-up as the hook's time over gossipcc's) and the plot, on made-up runs: the benchmark
itself needs the emulated network and minutes."""
import bench_script


def run(seconds, tx, acc=0.9):
    return {"time_per_step": seconds, "bytes_per_step": tx, "test_acc": acc}


def test_cell_takes_the_median_of_each_figure_and_the_speed_up_of_the_medians():
    m = bench_script.load("powersgd_vs_torch")
    c = m.cell("1gbit", "2",
               [run(0.020, 76000.0), run(0.030, 78000.0), run(0.010, 77000.0)],
               [run(0.050, 51000.0, 0.8), run(0.040, 52000.0, 0.8), run(0.045, 53000.0, 0.8)])
    assert c["gossipcc"] == run(0.020, 77000.0)
    assert c["torch"] == run(0.045, 52000.0, 0.8)
    assert m.table_row(c) == ["1gbit", "2", "20.0", "45.0", "2.25x", "77.0", "52.0", "90.0% / 80.0%"]


def test_a_cell_without_tx_counters_says_so():
    m = bench_script.load("powersgd_vs_torch")
    c = m.cell("local", "1", [run(0.02, None)], [run(0.04, None)])
    assert c["gossipcc"]["bytes_per_step"] is None
    assert m.table_row(c)[5:7] == ["-", "-"]


def test_plot_writes_a_png(tmp_path):
    m = bench_script.load("powersgd_vs_torch")
    cells = [m.cell(net, r, [run(0.02, 76000.0)], [run(0.045, 52000.0)]) for net in ("1gbit", "100mbit") for r in "12"]
    cells.append(m.cell("local", "1", [run(0.02, None)], [run(0.04, None)]))
    path = tmp_path / "powersgd.png"
    m.plot(cells, str(path), "test")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
