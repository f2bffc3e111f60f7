#!/usr/bin/env python3
"""Benchmark (b): PowerSGD through gossipcc (DDP on backend gossipcc, allreduce policy
powersgd) vs PyTorch's powerSGD_hook on backend gloo: same model, rank and start_iter, at
1 Gbit/s and 100 Mbit/s per host, N ranks (default 4).

    tools/bench/run.sh powersgd_vs_torch [--hosts 4 [--ranks-per-host 1] | --ranks 4] [--networks 1gbit,100mbit] [--ranks-psgd 1,2]
                                         [--trials 5] [--max-load 0.5] [--allow-load] [--results-dir DIR]

Each run is the main job's worker (tools/train/worker.py) training the digits MLP
(64-H-H-10, default H = 1024: 1.1 M parameters, 4.3 MiB of gradients) for --steps steps; the
first start_iter = 10 steps are exact all-reduce in both (PyTorch's warm-up), and the figures
cover only the compressed steps after them: time per step (slowest rank's training clock,
evaluation excluded) and bytes sent per rank and per host per step (NIC tx counters; a
host's are the sum of its ranks'). On
tools/bench/harness.py: per network and PowerSGD rank, --trials trials, each one run of both
methods (trial t starts with method t mod 2: the order alternates), the load recorded around
each trial; a cell is the median over the trials with its min-max, and the speed-up (the hook's
time over gossipcc's) the median of the per-trial speed-ups.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import harness  # noqa: E402

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
    g = cluster.ranks_per_host
    hosts = None if None in tx else [sum(tx[h:h + g]) for h in range(0, len(tx), g)]  # ranks host by host
    return {"time_per_step": max(p[0] for p in per_rank) / steps,
            "bytes_per_step": None if None in tx else sum(tx) / len(tx) / steps,
            "host_bytes_per_step": None if hosts is None else sum(hosts) / len(hosts) / steps,
            "test_acc": sum(p[2] for p in per_rank) / len(per_rank)}


METHODS = ("gossipcc", "torch")  # gossipcc's policy powersgd; PyTorch's powerSGD_hook on gloo


def cell_name(network, rank):
    return f"{network} rank {rank}"


def worker_method(method, rank):
    """The main job's method name of a variant at a PowerSGD rank."""
    return f"powersgd-r{rank}" if method == "gossipcc" else f"torch-powersgd-r{rank}"


def report_rows(doc):
    """The table's rows: per (network, rank) both variants' ms per step, the speed-up (the
    median of the per-trial speed-ups, PyTorch's time over gossipcc's), KB sent per rank and per
    host per step, and the test accuracy reached (medians of the trials)."""
    rows = []
    for c, info in doc["cells"].items():
        s = doc["summary"]["cells"][c]
        g, t = s["methods"]["gossipcc"], s["methods"]["torch"]
        rows.append([info["network"], info["rank"], harness.cell_text(g["time_per_step"], 1e3, 1),
                     harness.cell_text(t["time_per_step"], 1e3, 1),
                     harness.cell_text(s["speedups"]["gossipcc"], 1, 2, "x"),
                     harness.cell_text(g["bytes_per_step"], 1e-3, 1), harness.cell_text(t["bytes_per_step"], 1e-3, 1),
                     harness.cell_text(g.get("host_bytes_per_step"), 1e-3, 1),
                     harness.cell_text(t.get("host_bytes_per_step"), 1e-3, 1),
                     f"{100 * g['test_acc']['median']:.1f}% / {100 * t['test_acc']['median']:.1f}%"])
    return rows


HEADER = ["network", "rank", "gossipcc (ms/step)", "PyTorch hook (ms/step)", "speed-up (PyTorch/gossipcc)",
          "gossipcc KB sent/rank/step", "PyTorch KB sent/rank/step", "gossipcc KB sent/host/step",
          "PyTorch KB sent/host/step", "test acc gossipcc / PyTorch"]


def title(doc):
    a = doc["args"]
    return (f"PowerSGD: gossipcc (policy powersgd) vs PyTorch powerSGD_hook on gloo; {common.args_world(a)}, "
            f"MLP 64-{a['hidden']}-{a['hidden']}-10, batch {a['batch']}/rank, start_iter {doc['info']['start_iter']}, "
            f"figures over steps {doc['info']['start_iter'] + 1}..{a['steps']}")


def report(doc):
    return "\n\n".join([harness.preamble(doc), title(doc), harness.markdown_table(HEADER, report_rows(doc)),
                         harness.trials_table(doc)])


def plot(doc, path):
    """Left: the median time per step of both variants per (network, rank), the speed-up above
    each pair and the trials' min-max as error bars; right: bytes sent per rank per step (where
    counters were available)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cells = [(doc["cells"][c], doc["summary"]["cells"][c]) for c in doc["cells"]]
    labels = [f"{info['network']}\nrank {info['rank']}" for info, _ in cells]
    xs = list(range(len(cells)))
    width = 0.38
    fig, (times, sent) = plt.subplots(1, 2, figsize=(12, 4.5))
    for side, key, scale, ylabel in ((times, "time_per_step", 1e3, "ms per step (slowest rank)"),
                                     (sent, "bytes_per_step", 1e-3, "KB sent per rank per step")):
        for offset, variant, name in ((-width / 2, "gossipcc", "gossipcc (policy powersgd)"),
                                      (width / 2, "torch", "PyTorch powerSGD_hook on gloo")):
            st = [s["methods"][variant][key] for _, s in cells]
            # No bar where the figure is missing (no tx counters), not a bar of height 0.
            values = [float("nan") if x is None else x["median"] * scale for x in st]
            err = [[0 if x is None else (x["median"] - x["min"]) * scale for x in st],
                   [0 if x is None else (x["max"] - x["median"]) * scale for x in st]]
            side.bar([x + offset for x in xs], values, width, yerr=err, capsize=2, label=name)
        side.set(xticks=xs, ylabel=ylabel)
        side.set_xticklabels(labels)
    for x, (_, s) in zip(xs, cells):
        top = 1e3 * max(s["methods"][v]["time_per_step"]["max"] for v in METHODS)
        times.annotate(f"{s['speedups']['gossipcc']['median']:.2f}x", (x, top), ha="center", va="bottom", fontsize=9)
    times.margins(y=0.15)
    fig.legend(*times.get_legend_handles_labels(), loc="lower center", ncol=2, fontsize=9)
    fig.suptitle(title(doc) + f", median of {doc['args']['trials']} trials", fontsize=9)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    common.add_cluster_arguments(p, hosts=4, network="1gbit,100mbit", sweep_networks=True)
    p.add_argument("--ranks-psgd", default="1,2", help="PowerSGD matrix approximation ranks")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--plot", metavar="PNG", help="also write a plot (time per step per cell, with the speed-up) here")
    harness.add_arguments(p)
    args = p.parse_args()
    common.resolve_cluster_arguments(args, "powersgd_vs_torch")
    import methods
    start_iter = methods.POWERSGD_START_ITER
    if args.steps <= start_iter:
        common.fail(f"--steps must exceed start_iter = {start_iter}")
    run = harness.Run("powersgd_vs_torch", args, METHODS, "torch", "time_per_step")
    run.info["start_iter"] = start_iter
    probe = harness.LoadProbe()
    for network in args.networks:
        try:
            with common.make_cluster(args.hosts, args.ranks_per_host, network) as cluster:
                for r in args.ranks_psgd.split(","):
                    cell = run.cell(cell_name(network, r), network=network, rank=r)
                    for trial in range(args.trials):
                        order = harness.trial_order(METHODS, trial)
                        probe.start()
                        got = {}
                        for m in order:
                            got[m] = run_method(cluster, worker_method(m, r), args, start_iter)
                            print(f"  {network} rank {r} {m}, trial {trial + 1}: "
                                  f"{1e3 * got[m]['time_per_step']:.1f} ms/step", flush=True)
                        run.add_trial({cell: got}, probe.stop(), order, group=cell)
        except common.NamespacesUnavailable as e:
            common.fail(f"powersgd_vs_torch: emulated network not available: {e}")
    doc = run.finish(report)
    if args.plot:
        plot(doc, args.plot)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
