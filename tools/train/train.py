#!/usr/bin/env python3
"""The main job: trains an MLP on scikit-learn's digits on N ranks over an emulated network,
once per method, and compares them (table + plot of test accuracy against wall-clock time).

    tools/train.sh [--ranks 4 | --hosts 4 --ranks-per-host 2] [--network 1gbit] [--methods all]
                   [--steps 300] [--target 0.95]

Each host runs in its own network namespace with a shaped link (tools/emulated_cluster.py),
with one rank (--ranks N: N hosts) or --ranks-per-host ranks sharing it; `--network local` runs
the ranks as plain local processes over loopback instead (no shaping, no byte counters; what
the tests use). Results go to --results (default results/<time>):
results.md (the table), summary.json, accuracy_vs_time.png, and every rank's log.
"""
import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))  # tools/: emulated_cluster
import methods  # noqa: E402
import emulated_cluster  # noqa: E402

WORKER = os.path.join(HERE, "worker.py")


def load_average():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def read_rank_logs(paths):
    ranks = []
    for path in paths:
        with open(path) as f:
            ranks.append([json.loads(line) for line in f if line.strip()])
    return ranks


def add_cluster_args(p, default_hosts=4):
    """--ranks, --hosts, --ranks-per-host, as tools/emulated_cluster.py takes them. Shared with lm_job.py."""
    p.add_argument("--ranks", type=int, default=None,
                   help=f"N hosts of one rank each (the same as --hosts N; default {default_hosts})")
    p.add_argument("--hosts", type=int, default=None, help="emulated hosts, each running --ranks-per-host ranks")
    p.add_argument("--ranks-per-host", type=int, default=1,
                   help="ranks on each host, sharing its link as a node's GPUs share its NIC (default 1)")


def resolve_cluster_args(args, p, default_hosts=4):
    """Sets args.hosts, args.ranks_per_host and args.ranks (the world size) from add_cluster_args's
    flags; p.error naming a conflict or a bad number. Shared with lm_job.py."""
    if args.ranks is not None and (args.hosts is not None or args.ranks_per_host != 1):
        p.error("--ranks N means N hosts of one rank each: give it alone, or --hosts with --ranks-per-host")
    hosts = args.ranks if args.ranks is not None else (default_hosts if args.hosts is None else args.hosts)
    try:
        args.hosts, args.ranks_per_host = emulated_cluster.hosts_and_ranks(None, hosts, args.ranks_per_host)
    except ValueError as e:
        p.error(str(e))
    args.ranks = args.hosts * args.ranks_per_host


def make_cluster(args):
    """The cluster of resolve_cluster_args's args on args.network (local: processes on loopback)."""
    if args.network == "local":
        return emulated_cluster.LocalCluster(hosts=args.hosts, ranks_per_host=args.ranks_per_host)
    return emulated_cluster.EmulatedCluster(network=args.network, hosts=args.hosts, ranks_per_host=args.ranks_per_host)


def layout(args):
    """"4 ranks" or "4 ranks (2 hosts x 2 ranks)", for the job's headings."""
    return f"{args.ranks} ranks" + (f" ({args.hosts} hosts x {args.ranks_per_host} ranks)"
                                    if args.ranks_per_host > 1 else "")


def bytes_per_step(tx, steps, ranks_per_host):
    """The ranks' byte counters -> {"bytes_per_rank_per_step", "max_bytes_per_rank_per_step",
    "bytes_per_host_per_step", "max_bytes_per_host_per_step"} (mean and max; a host's bytes are
    the sum of its ranks', ranks numbered host by host); None values where a counter is missing.
    Shared with lm_job.py."""
    if None in tx:
        return dict.fromkeys(["bytes_per_rank_per_step", "max_bytes_per_rank_per_step",
                              "bytes_per_host_per_step", "max_bytes_per_host_per_step"])
    hosts = [sum(tx[h:h + ranks_per_host]) for h in range(0, len(tx), ranks_per_host)]
    return {"bytes_per_rank_per_step": sum(tx) / len(tx) / steps, "max_bytes_per_rank_per_step": max(tx) / steps,
            "bytes_per_host_per_step": sum(hosts) / len(hosts) / steps,
            "max_bytes_per_host_per_step": max(hosts) / steps}


def run_method(cluster, results, name, ranks, command, timeout, row_of):
    """Runs one method's ranks on `cluster`: rank r runs command(r, out), writing its JSON records
    to out (results/<name>.rank<r>.jsonl) and its output to results/<name>.rank<r>.log (rank 0's
    stdout stays on the terminal). row_of(records per rank, the cluster's run) -> the method's row;
    a ClusterError becomes {"method": name, "error": ...} after the logs' tails are printed. The
    load average before and after goes into the row. Shared with lm_job.py."""
    outs = [os.path.join(results, f"{name}.rank{r}.jsonl") for r in range(ranks)]
    logs = [open(os.path.join(results, f"{name}.rank{r}.log"), "w") for r in range(ranks)]
    cmds = [command(r, outs[r]) for r in range(ranks)]
    load_before = load_average()
    try:
        run = cluster.run(cmds, env={"OMP_NUM_THREADS": "1"}, timeout=timeout,
                          stdout=[None] + logs[1:], stderr=logs)
        row = row_of(read_rank_logs(outs), run)
    except emulated_cluster.ClusterError as e:
        for f in logs:
            f.flush()
        tail = emulated_cluster.log_tails([f.name for f in logs])
        print(f"  {name} FAILED: {e}{tail}", file=sys.stderr)
        row = {"method": name, "error": str(e)}
    finally:
        for f in logs:
            f.close()
    row["load_before"], row["load_after"] = load_before, load_average()
    return row


def run_methods(cluster, names, run_one, prog):
    """run_one(i, name) -> row for each method inside `cluster`; returns (rows, None), or
    (None, exit status) where the cluster could not be set up or Ctrl-C stopped the run (the
    cluster's exit stops the rank processes and removes the namespaces). Shared with lm_job.py."""
    rows = []
    try:
        with cluster:
            for i, name in enumerate(names):
                rows.append(run_one(i, name))
    except emulated_cluster.NamespacesUnavailable as e:
        print(f"{prog}: the emulated network is not available here: {e}\n"
              f"{prog}: run as root, or pass --network local to run the ranks over loopback without shaping",
              file=sys.stderr)
        return None, 2
    except emulated_cluster.ClusterError as e:
        print(f"{prog}: could not set up the emulated network: {e}", file=sys.stderr)
        return None, 2
    except KeyboardInterrupt:
        print(f"\n{prog}: interrupted; rank processes stopped and namespaces removed", file=sys.stderr)
        return None, 130
    return rows, None


def summarize(name, ranks, target, ranks_per_host=1):
    """Per-rank JSON records -> one summary row. Accuracy and loss: mean over ranks (each rank
    evaluates its own model); time at a step: the slowest rank's training clock; bytes per rank
    and per host (ranks_per_host consecutive ranks)."""
    evals = [[r for r in recs if r["type"] == "eval"] for recs in ranks]
    ends = [next(r for r in recs if r["type"] == "end") for recs in ranks]
    steps = ends[0]["steps"]
    curve = []
    for points in zip(*evals):
        curve.append({
            "step": points[0]["step"],
            "time": max(p["train_time"] for p in points),
            "test_acc": sum(p["test_acc"] for p in points) / len(points),
            "test_loss": sum(p["test_loss"] for p in points) / len(points),
            "loss": sum(p["loss"] for p in points) / len(points),
        })
    reached = next((c for c in curve if c["test_acc"] >= target), None)
    return {
        "method": name,
        "steps": steps,
        "train_time": max(e["train_time"] for e in ends),
        "time_per_step": max(e["train_time"] for e in ends) / steps,
        **bytes_per_step([e["tx_bytes"] for e in ends], steps, ranks_per_host),
        "final_loss": curve[-1]["loss"],
        "final_test_loss": curve[-1]["test_loss"],
        "final_test_acc": curve[-1]["test_acc"],
        "final_test_acc_min_rank": min(e[-1]["test_acc"] for e in evals),
        # How far apart the ranks' models end (before any final averaging): 0 for exact averaging.
        "final_param_spread": methods.param_spread(ends),
        "averaged_test_acc": ends[0].get("averaged_test_acc"),
        "time_to_target": reached["time"] if reached else None,
        "steps_to_target": reached["step"] if reached else None,
        "curve": curve,
    }


def format_table(rows, target, baseline):
    base = next((r for r in rows if r["method"] == baseline and r.get("time_to_target")), None)
    header = ("| method | s/step | MB sent/rank/step | MB sent/host/step | final train loss | final test acc | "
              f"test acc, averaged model | time to {100 * target:.0f}% (s) | speed-up vs {baseline} |")
    lines = [header, "|---" * (header.count("|") - 1) + "|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['method']} | failed: {r['error']} | | | | | | | |")
            continue
        mb, mb_host = ("-" if r.get(k) is None else f"{r[k] / 1e6:.3f}"
                       for k in ("bytes_per_rank_per_step", "bytes_per_host_per_step"))
        ttt = "not reached" if r["time_to_target"] is None else f"{r['time_to_target']:.2f}"
        speed = "-"
        if base and r["time_to_target"]:
            speed = f"{base['time_to_target'] / r['time_to_target']:.2f}x"
        avg = "-" if r.get("averaged_test_acc") is None else f"{100 * r['averaged_test_acc']:.1f}%"
        lines.append(f"| {r['method']} | {r['time_per_step']:.4f} | {mb} | {mb_host} | {r['final_loss']:.4f} | "
                     f"{100 * r['final_test_acc']:.1f}% | {avg} | {ttt} | {speed} |")
    return "\n".join(lines)


def plot(rows, target, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 5))
    for r in rows:
        if "curve" not in r:
            continue
        ax.plot([c["time"] for c in r["curve"]], [100 * c["test_acc"] for c in r["curve"]],
                marker=".", label=r["method"], linestyle="--" if r["method"].endswith("-gloo") else "-")
    ax.axhline(100 * target, color="gray", linewidth=0.8, linestyle=":")
    ax.set_xlabel("training wall-clock time (s, evaluation excluded)")
    ax.set_ylabel("test accuracy (%, mean over ranks)")
    ax.set_ylim(max(0, 100 * target - 30), 100)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description="Train on N ranks over an emulated network, once per method.")
    add_cluster_args(p)
    p.add_argument("--network", default="1gbit",
                   help="local, or an emulated_cluster preset: " + ", ".join(emulated_cluster.PRESETS) +
                        ", or rate=..[,delay=..]")
    p.add_argument("--methods", default="all", help="all (every method except the diag-* diagnostics of "
                        "docs/benchmarks.md (b); PyTorch's own alternatives torch-* included), or a comma "
                        "list of: " + ", ".join(methods.REGISTRY))
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--target", type=float, default=0.95, help="test accuracy for the time-to-target column")
    p.add_argument("--batch", type=int, default=8, help="per rank")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--hidden", type=int, default=512, help="MLP width (2 hidden layers)")
    p.add_argument("--eval-every", type=int, default=20)
    p.add_argument("--powersgd-start-iter", type=int, default=methods.POWERSGD_START_ITER,
                   help="exact all-reduce steps before PowerSGD compresses")
    p.add_argument("--local-sgd-start-iter", type=int, default=methods.LOCAL_SGD_START_ITER,
                   help="post-local SGD (torch-postlocal): steps of DDP's all-reduce before local steps")
    p.add_argument("--sync-every", type=int, default=methods.LOCAL_SGD_PERIOD,
                   help="post-local SGD (torch-postlocal): steps between two model averagings")
    p.add_argument("--timeout", type=float, default=600, help="seconds per method before its ranks are killed")
    p.add_argument("--results", default=None, help="results folder (default results/<date-time>)")
    p.add_argument("--baseline", default="allreduce-gloo")
    p.add_argument("--no-plot", action="store_true")
    args = p.parse_args(argv)
    resolve_cluster_args(args, p)

    try:
        names = methods.names(args.methods)
        if args.network != "local":
            emulated_cluster.parse_network(args.network)
        if args.sync_every < 1:
            raise ValueError(f"--sync-every must be at least 1, got {args.sync_every}")
        if args.local_sgd_start_iter < 0:
            raise ValueError(f"--local-sgd-start-iter must be >= 0, got {args.local_sgd_start_iter}")
    except ValueError as e:
        p.error(str(e))
    results = args.results or os.path.join("results", time.strftime("%Y%m%d-%H%M%S"))
    os.makedirs(results, exist_ok=True)
    cluster = make_cluster(args)

    print(f"gossipcc main job: {layout(args)}, network {args.network}, {args.steps} steps per method, "
          f"MLP 64-{args.hidden}-{args.hidden}-10 on scikit-learn digits; results in {results}")
    def run_one(i, name):
        m = methods.REGISTRY[name]
        print(f"[{i + 1}/{len(names)}] {name}: {m.description}   (load {load_average()})", flush=True)

        def command(r, out):
            return ([sys.executable, WORKER, "--method", name, "--steps", str(args.steps),
                     "--batch", str(args.batch), "--lr", str(args.lr), "--hidden", str(args.hidden),
                     "--eval-every", str(args.eval_every), "--powersgd-start-iter", str(args.powersgd_start_iter),
                     "--local-sgd-start-iter", str(args.local_sgd_start_iter), "--sync-every", str(args.sync_every),
                     "--out", out]
                    + (["--progress"] if r == 0 else []))

        def row_of(ranks, run):
            row = summarize(name, ranks, args.target, args.ranks_per_host)
            row["run_wall_seconds"] = run.wall_seconds
            row["run_tx_bytes"] = run.tx_bytes
            row["run_host_tx_bytes"] = run.host_tx_bytes
            return row

        return run_method(cluster, results, name, args.ranks, command, args.timeout, row_of)

    rows, status = run_methods(cluster, names, run_one, "train")
    if rows is None:
        return status

    table = format_table(rows, args.target, args.baseline)
    print("\n" + table)
    with open(os.path.join(results, "results.md"), "w") as f:
        f.write(f"{layout(args)}, network {args.network}, {args.steps} steps, batch {args.batch}/rank, "
                f"lr {args.lr}, MLP 64-{args.hidden}-{args.hidden}-10, target {args.target}\n\n{table}\n")
    with open(os.path.join(results, "summary.json"), "w") as f:
        json.dump({"args": vars(args), "rows": rows}, f, indent=1)
    if not args.no_plot:
        png = os.path.join(results, "accuracy_vs_time.png")
        plot(rows, args.target, png, f"digits MLP, {layout(args)}, network {args.network}")
        print(f"plot: {png}")
    print(f"results: {results}/results.md")
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
