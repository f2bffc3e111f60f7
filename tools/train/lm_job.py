#!/usr/bin/env python3
"""The main job's language-model workload: a byte-level GPT on the text of Debian's `fortunes`
package, trained on N ranks over an emulated network once per method (every method of the
project and the DiLoCo variants, lm.py); per method: time to a target validation loss, bytes
sent per rank per inner step (the NICs' counters), final validation loss; and a plot of
validation loss against training time.

    tools/train.sh lm [--ranks 4] [--network 100mbit] [--methods all] [--time-budget 50]
                      [--target 3.0] [--smoke]                           (--help for all flags)

Each method trains for --time-budget seconds of training time (evaluation excluded) or
--max-steps steps; --smoke is a seconds-long run of a tiny model (what the tests use).
Results go to --results (default results/lm-<time>): results.md, summary.json,
val_loss_vs_time.png, and every rank's log.
"""
import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))  # tools/: emulated_cluster
import emulated_cluster  # noqa: E402
import lm  # noqa: E402
import lm_worker  # noqa: E402
import methods  # noqa: E402
from train import load_average, run_method, run_methods  # noqa: E402

WORKER = os.path.join(HERE, "lm_worker.py")

# --smoke: a tiny model for a few steps (seconds per method); flags given explicitly win.
SMOKE = {"d_model": 32, "layers": 1, "heads": 2, "context": 32, "batch": 4, "max_steps": 30,
         "eval_every": 10, "sync_every": 5, "val_windows": 16, "warmup": 2, "powersgd_start_iter": 5,
         "fragments": 2}


def time_to_target(curve, target):
    """Training time at which the validation loss first reaches `target`, linearly interpolated
    between the two evaluations around the crossing; None if never reached."""
    for prev, cur in zip(curve, curve[1:]):
        if cur["val_loss"] <= target:
            if prev["val_loss"] <= target:
                return prev["time"]
            frac = (prev["val_loss"] - target) / (prev["val_loss"] - cur["val_loss"])
            return prev["time"] + frac * (cur["time"] - prev["time"])
    return curve[0]["time"] if curve and curve[0]["val_loss"] <= target else None


def summarize(name, ranks, target):
    """Per-rank JSON records -> one row. Validation loss: mean over ranks (each rank evaluates
    its own model); time at a step: the slowest rank's training clock; bytes: mean over ranks."""
    skipped = [r for recs in ranks for r in recs if r["type"] == "skipped"]
    if skipped:
        return {"method": name, "skipped": skipped[0]["reason"]}
    evals = [[r for r in recs if r["type"] == "eval"] for recs in ranks]
    ends = [next(r for r in recs if r["type"] == "end") for recs in ranks]
    start = next(r for r in ranks[0] if r["type"] == "start")
    steps = ends[0]["steps"]
    curve = []
    for points in zip(*evals):
        losses = [p["loss"] for p in points if p["loss"] is not None]
        curve.append({
            "step": points[0]["step"],
            "time": max(p["train_time"] for p in points),
            "val_loss": sum(p["val_loss"] for p in points) / len(points),
            "val_loss_max_rank": max(p["val_loss"] for p in points),
            "loss": sum(losses) / len(losses) if losses else None,
        })
    tx = [e["tx_bytes"] for e in ends]
    train_time = max(e["train_time"] for e in ends)
    averaged = [e["averaged_val_loss"] for e in ends if "averaged_val_loss" in e]
    return {
        "method": name,
        "params": start["params"],
        "steps": steps,
        "train_time": train_time,
        "time_per_step": train_time / steps,
        "bytes_per_rank_per_step": None if None in tx else sum(tx) / len(tx) / steps,
        "max_bytes_per_rank_per_step": None if None in tx else max(tx) / steps,
        "final_val_loss": curve[-1]["val_loss"],
        "final_val_loss_max_rank": curve[-1]["val_loss_max_rank"],
        # How far apart the ranks' models end (before any final averaging): 0 for exact averaging.
        "final_param_spread": methods.param_spread(ends),
        "averaged_val_loss": averaged[0] if averaged else None,
        "time_to_target": time_to_target(curve, target),
        "curve": curve,
    }


def _fmt_bytes(b):
    return "-" if b is None else (f"{b / 1e6:.3f} MB" if b >= 1e5 else f"{b / 1e3:.1f} kB")


def format_table(rows, target, baseline):
    base = next((r for r in rows if r["method"] == baseline and "curve" in r), None)
    header = (f"| method | steps | s/step | sent/rank/inner step | fewer bytes than {baseline} | final val loss | "
              f"vs {baseline} | time to val loss {target} (s) | speed-up vs {baseline} |")
    lines = [header, "|---" * (header.count("|") - 1) + "|"]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['method']} | skipped: {r['skipped']} | | | | | | | |")
            continue
        if "error" in r:
            lines.append(f"| {r['method']} | failed: {r['error']} | | | | | | | |")
            continue
        fewer = vs = speed = "-"
        if base is not None:
            if r["bytes_per_rank_per_step"] and base["bytes_per_rank_per_step"]:
                fewer = f"{base['bytes_per_rank_per_step'] / r['bytes_per_rank_per_step']:.1f}x"
            vs = f"{100 * (r['final_val_loss'] / base['final_val_loss'] - 1):+.1f}%"
            if base["time_to_target"] and r["time_to_target"]:
                speed = f"{base['time_to_target'] / r['time_to_target']:.2f}x"
        ttt = "not reached" if r["time_to_target"] is None else f"{r['time_to_target']:.1f}"
        final = f"{r['final_val_loss']:.4f}"
        if r.get("averaged_val_loss") is not None:
            final += f" (averaged {r['averaged_val_loss']:.4f})"
        lines.append(f"| {r['method']} | {r['steps']} | {r['time_per_step']:.3f} | "
                     f"{_fmt_bytes(r['bytes_per_rank_per_step'])} | {fewer} | {final} | {vs} | {ttt} | {speed} |")
    return "\n".join(lines)


def compute_share(rows, baseline):
    """The no-communication reference's step time against the baseline's: (compute s/step,
    baseline s/step, compute fraction) or None."""
    comp = next((r for r in rows if r["method"] == "diag-compute" and "curve" in r), None)
    base = next((r for r in rows if r["method"] == baseline and "curve" in r), None)
    if comp is None or base is None:
        return None
    return comp["time_per_step"], base["time_per_step"], comp["time_per_step"] / base["time_per_step"]


def plot(rows, target, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(9, 5.5))
    styles = {"diag-": ":", "allreduce-gloo": "--"}
    lo, hi = [], []
    colors = plt.cm.tab20.colors
    for i, r in enumerate(r for r in rows if "curve" in r):
        style = next((s for k, s in styles.items() if r["method"].startswith(k)), "-")
        width = 2.0 if "diloco" in r["method"] else 1.2
        ax.plot([c["time"] for c in r["curve"]], [c["val_loss"] for c in r["curve"]], marker=".",
                markersize=3, linewidth=width, linestyle=style, label=r["method"],
                color=colors[(2 * i) % 20 + (2 * i) // 20 % 2])
        lo.append(min(c["val_loss"] for c in r["curve"]))
        hi.append(r["curve"][min(1, len(r["curve"]) - 1)]["val_loss"])
    ax.axhline(target, color="gray", linewidth=0.8, linestyle=":")
    if lo:
        ax.set_ylim(min(lo + [target]) - 0.05, max(hi + [target]) + 0.1)
    ax.set_xlabel("training wall-clock time (s, evaluation excluded; slowest rank)")
    ax.set_ylabel("validation loss (nats/byte, mean over ranks)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right", fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description="The LM workload: a byte-level GPT on the fortunes text, once per method.")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--network", default="100mbit",
                   help="local, or an emulated_cluster preset: " + ", ".join(emulated_cluster.PRESETS) +
                        ", or rate=..[,delay=..]")
    p.add_argument("--methods", default="all", help="all (" + ", ".join(lm.ALL) + "), or a comma list of: " +
                   ", ".join(lm.known()))
    p.add_argument("--target", type=float, default=None,
                   help="validation loss for the time-to-target column (default 3.0; 4.0 with --smoke)")
    p.add_argument("--smoke", action="store_true", help="a tiny model for 30 steps per method (seconds each)")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds per method before its ranks are killed (default: 3x the time budget + 120)")
    p.add_argument("--results", default=None, help="results folder (default results/lm-<date-time>)")
    p.add_argument("--baseline", default="allreduce-gloo")
    p.add_argument("--no-plot", action="store_true")
    model_args = argparse.ArgumentParser(add_help=False)
    lm_worker.add_model_args(model_args)
    group = p.add_argument_group("model, data and training (passed to every rank)")
    lm_worker.add_model_args(group)
    for action in group._group_actions:
        action.help = (action.help + " " if action.help else "") + f"(default {action.default}" + (
            f"; --smoke {SMOKE[action.dest]})" if action.dest in SMOKE else ")")
        action.default = argparse.SUPPRESS  # to tell flags given from defaults (--smoke's)
    args = p.parse_args(argv)

    worker_args = vars(model_args.parse_args([]))
    if args.smoke:
        worker_args.update(SMOKE)
    for key in list(worker_args):
        if key in vars(args):
            worker_args[key] = getattr(args, key)
    if args.target is None:
        args.target = 4.0 if args.smoke else 3.0
    try:
        names = lm.names(args.methods)
        if args.network != "local":
            emulated_cluster.parse_network(args.network)
    except ValueError as e:
        p.error(str(e))
    timeout = args.timeout or 3 * worker_args["time_budget"] + 120
    if args.smoke and args.timeout is None:
        timeout = 120
    results = args.results or os.path.join("results", time.strftime("lm-%Y%m%d-%H%M%S"))
    os.makedirs(results, exist_ok=True)
    if args.network == "local":
        cluster = emulated_cluster.LocalCluster(args.ranks)
    else:
        cluster = emulated_cluster.EmulatedCluster(args.ranks, args.network)

    w = worker_args
    shape = f"GPT d={w['d_model']} layers={w['layers']} heads={w['heads']} context={w['context']}"
    print(f"gossipcc LM workload: {args.ranks} ranks, network {args.network}, {shape}, batch {w['batch']}/rank, "
          f"{w['time_budget']:g} s of training or {w['max_steps']} steps per method, on {w['data']}; "
          f"results in {results}", flush=True)
    flags = []
    for key, value in worker_args.items():
        flags += ["--" + key.replace("_", "-"), str(value)]
    def run_one(i, name):
        m = lm.resolve(name)
        reason = lm.unsupported_reason(m)
        if reason is not None:
            print(f"[{i + 1}/{len(names)}] {name}: skipped: the installed gossipcc rejects outer_sync "
                  f"{m.outer_sync!r}: {reason}", flush=True)
            return {"method": name, "skipped": reason}
        print(f"[{i + 1}/{len(names)}] {name}: {m.description}   (load {load_average()})", flush=True)

        def command(r, out):
            return [sys.executable, WORKER, "--method", name, "--out", out] + flags + (["--progress"] if r == 0 else [])

        def row_of(ranks, run):
            row = summarize(name, ranks, args.target)
            row["run_wall_seconds"] = run.wall_seconds
            if "skipped" in row:
                print(f"  skipped: {row['skipped']}", flush=True)
            return row

        return run_method(cluster, results, name, args.ranks, command, timeout, row_of)

    rows, status = run_methods(cluster, names, run_one, "lm_job")
    if rows is None:
        return status

    table = format_table(rows, args.target, args.baseline)
    share = compute_share(rows, args.baseline)
    params = next((r["params"] for r in rows if "params" in r), None)
    head = (f"{args.ranks} ranks, network {args.network}, {shape} ({params} parameters), batch {w['batch']}/rank, "
            f"AdamW lr {w['lr']}, DiLoCo H={w['sync_every']} outer lr {w['outer_lr']} (Nesterov 0.9), streaming "
            f"fragments={w['fragments']} overlap={w['overlap']} mix={w['mix']}, budget {w['time_budget']:g} s or "
            f"{w['max_steps']} steps, target val loss {args.target}")
    text = head + "\n\n" + table + "\n"
    if share is not None:
        text += (f"\nCompute vs communication: a step without communication (diag-compute) took "
                 f"{share[0]:.3f} s, a step of {args.baseline} {share[1]:.3f} s: compute {100 * share[2]:.0f}%, "
                 f"communication {100 * (1 - share[2]):.0f}% of the baseline's step.\n")
    print("\n" + text)
    with open(os.path.join(results, "results.md"), "w") as f:
        f.write(text)
    with open(os.path.join(results, "summary.json"), "w") as f:
        json.dump({"args": vars(args), "worker_args": worker_args, "rows": rows}, f, indent=1)
    if not args.no_plot:
        png = os.path.join(results, "val_loss_vs_time.png")
        plot(rows, args.target, png, f"byte-level GPT on fortunes, {args.ranks} ranks, network {args.network}")
        print(f"plot: {png}")
    print(f"results: {results}/results.md")
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
