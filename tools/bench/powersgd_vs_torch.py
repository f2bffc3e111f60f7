#!/usr/bin/env python3
"""Benchmark (b): PowerSGD through gossipcc (DDP on backend gossipcc, allreduce policy
powersgd) vs PyTorch's powerSGD_hook on backend gloo: same model, rank and start_iter, at
1 Gbit/s and 100 Mbit/s per host, N ranks (default 4).

    tools/bench/run.sh powersgd_vs_torch [--ranks 4] [--networks 1gbit,100mbit] [--ranks-psgd 1,2]

Each run is the main job's worker (tools/train/worker.py) training the digits MLP
(64-H-H-10, default H = 1024: 1.1 M parameters, 4.3 MiB of gradients) for --steps steps; the
first start_iter = 10 steps are exact all-reduce in both (PyTorch's warm-up), and the figures
cover only the compressed steps after them: time per step (slowest rank's training clock,
evaluation excluded) and bytes sent per rank per step (NIC tx counters). The two methods run
--repeats times in alternating order; a cell is the median.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

WORKER = os.path.join(common.TOOLS, "train", "worker.py")
sys.path.insert(0, os.path.join(common.TOOLS, "train"))


def run_method(cluster, method, args, start_iter):
    import tempfile
    tmp = tempfile.mkdtemp(prefix="gossipcc-psgd-")
    outs = [os.path.join(tmp, f"rank{r}.jsonl") for r in range(cluster.n)]
    logs = [open(os.path.join(tmp, f"rank{r}.log"), "w") for r in range(cluster.n)]
    cmds = [[sys.executable, WORKER, "--method", method, "--steps", str(args.steps), "--hidden", str(args.hidden),
             "--batch", str(args.batch), "--eval-every", str(start_iter), "--out", outs[r]] for r in range(cluster.n)]
    try:
        cluster.run(cmds, env={"OMP_NUM_THREADS": "1"}, timeout=900, stdout=logs, stderr=logs)
    except common.ClusterError as e:
        for f in logs:
            f.close()
        tails = []
        for r in range(cluster.n):
            with open(logs[r].name) as f:
                tails.append(f"--- rank {r}:\n" + "\n".join(f.read().strip().splitlines()[-10:]))
        raise common.ClusterError(f"{method}: {e}\n" + "\n".join(tails)) from None
    for f in logs:
        f.close()
    ranks = []
    for path in outs:
        with open(path) as f:
            ranks.append([json.loads(line) for line in f if line.strip()])
    # Training clock and tx counter at start_iter and at the end, per rank.
    per_rank = []
    for recs in ranks:
        evals = {r["step"]: r for r in recs if r["type"] == "eval"}
        a, b = evals[start_iter], evals[args.steps]
        per_rank.append((b["train_time"] - a["train_time"],
                         None if a["tx_bytes"] is None else b["tx_bytes"] - a["tx_bytes"],
                         b["test_acc"]))
    steps = args.steps - start_iter
    tx = [p[1] for p in per_rank]
    return {"time_per_step": max(p[0] for p in per_rank) / steps,
            "bytes_per_step": None if None in tx else sum(tx) / len(tx) / steps,
            "test_acc": sum(p[2] for p in per_rank) / len(per_rank)}


def cell(network, rank, gossipcc_runs, torch_runs):
    """One table cell from its runs (run_method's results): per variant the median of each
    figure over the runs (None where tx counters were unavailable)."""
    def med(runs):
        return {k: None if runs[0][k] is None else common.median([x[k] for x in runs]) for k in runs[0]}
    return {"network": network, "rank": rank, "gossipcc": med(gossipcc_runs), "torch": med(torch_runs)}


def table_row(c):
    """The table's cells for one cell(), load average excluded."""
    g, t = c["gossipcc"], c["torch"]
    return [c["network"], c["rank"], f"{1e3 * g['time_per_step']:.1f}", f"{1e3 * t['time_per_step']:.1f}",
            f"{t['time_per_step'] / g['time_per_step']:.2f}x",
            "-" if g["bytes_per_step"] is None else f"{g['bytes_per_step'] / 1e3:.1f}",
            "-" if t["bytes_per_step"] is None else f"{t['bytes_per_step'] / 1e3:.1f}",
            f"{100 * g['test_acc']:.1f}% / {100 * t['test_acc']:.1f}%"]


def plot(cells, path, title):
    """Left: time per step of both variants per (network, rank), the speed-up above each pair;
    right: bytes sent per rank per step (where counters were available)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    labels = [f"{c['network']}\nrank {c['rank']}" for c in cells]
    xs = list(range(len(cells)))
    width = 0.38
    fig, (times, sent) = plt.subplots(1, 2, figsize=(12, 4.5))
    for side, key, scale, ylabel in ((times, "time_per_step", 1e3, "ms per step (slowest rank)"),
                                     (sent, "bytes_per_step", 1e-3, "KB sent per rank per step")):
        for offset, variant, name in ((-width / 2, "gossipcc", "gossipcc (policy powersgd)"),
                                      (width / 2, "torch", "PyTorch powerSGD_hook on gloo")):
            # No bar where the figure is missing (no tx counters), not a bar of height 0.
            values = [float("nan") if c[variant][key] is None else c[variant][key] * scale for c in cells]
            side.bar([x + offset for x in xs], values, width, label=name)
        side.set(xticks=xs, ylabel=ylabel)
        side.set_xticklabels(labels)
    for x, c in zip(xs, cells):
        speedup = c["torch"]["time_per_step"] / c["gossipcc"]["time_per_step"]
        top = 1e3 * max(c["torch"]["time_per_step"], c["gossipcc"]["time_per_step"])
        times.annotate(f"{speedup:.2f}x", (x, top), ha="center", va="bottom", fontsize=9)
    times.margins(y=0.15)
    fig.legend(*times.get_legend_handles_labels(), loc="lower center", ncol=2, fontsize=9)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--networks", default="1gbit,100mbit")
    p.add_argument("--ranks-psgd", default="1,2", help="PowerSGD matrix approximation ranks")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--plot", metavar="PNG", help="also write a plot (time per step per cell, with the speed-up) here")
    args = p.parse_args()
    import methods
    start_iter = methods.POWERSGD_START_ITER
    if args.steps <= start_iter:
        common.fail(f"--steps must exceed start_iter = {start_iter}")
    print(f"PowerSGD: gossipcc (policy powersgd) vs PyTorch powerSGD_hook on gloo; {args.ranks} ranks, "
          f"MLP 64-{args.hidden}-{args.hidden}-10, batch {args.batch}/rank, start_iter {start_iter}, "
          f"figures over steps {start_iter + 1}..{args.steps}, median of {args.repeats}")
    rows, cells = [], []
    for network in args.networks.split(","):
        try:
            with common.make_cluster(args.ranks, network) as cluster:
                for r in args.ranks_psgd.split(","):
                    pair = [f"powersgd-r{r}", f"torch-powersgd-r{r}"]
                    got = {m: [] for m in pair}
                    load0 = common.load_average()
                    for rep in range(args.repeats):
                        for m in (pair if rep % 2 == 0 else pair[::-1]):
                            got[m].append(run_method(cluster, m, args, start_iter))
                            print(f"  {network} {m} run {rep + 1}: {1e3 * got[m][-1]['time_per_step']:.1f} ms/step",
                                  flush=True)
                    cells.append(cell(network, r, got[pair[0]], got[pair[1]]))
                    rows.append(table_row(cells[-1]) + [f"{load0} -> {common.load_average()}"])
        except common.NamespacesUnavailable as e:
            common.fail(f"powersgd_vs_torch: emulated network not available: {e}")
    print()
    print(common.markdown_table(
        ["network", "rank", "gossipcc (ms/step)", "PyTorch hook (ms/step)", "speed-up (PyTorch/gossipcc)",
         "gossipcc KB sent/rank/step", "PyTorch KB sent/rank/step", "test acc gossipcc / PyTorch", "load average"],
        rows))
    if args.plot:
        plot(cells, args.plot, f"PowerSGD, {args.ranks} ranks, MLP 64-{args.hidden}-{args.hidden}-10, "
             f"steps {start_iter + 1}..{args.steps}, median of {args.repeats}")
        print(f"\nplot: {args.plot}")


if __name__ == "__main__":
    main()
