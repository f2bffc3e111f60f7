#!/usr/bin/env python3
"""The main job's language-model workload: a byte-level GPT on the text of Debian's `fortunes`
package, trained on N ranks over an emulated network once per method (every method of the
project, PyTorch's own alternatives and the DiLoCo variants, lm.py); per method: time to each
target validation loss, bytes sent per rank and per host per inner step (the NICs' counters), final
validation loss, the loss at equal steps and at equal training time; and a plot of validation
loss against training time.

    tools/train.sh lm [--ranks 4 | --hosts 4 --ranks-per-host 2] [--network 100mbit] [--methods all]
                      [--time-budget 50] [--targets 3.0,2.9] [--trials 5] [--tuned tuned.json] [--smoke]
    tools/train.sh lm --tune [--time-budget 15] [--tune-lrs ..] [--tune-outer-lrs ..]
                                                                         (--help for all flags)

Each method trains for --time-budget seconds of training time (evaluation excluded) or
--max-steps steps; --smoke is a seconds-long run of a tiny model (what the tests use).
--trials N runs every method N times, interleaved (trial t in the order that starts at method
t mod m); each figure is then the median over the trials with its min-max, and a speed-up the
median of the per-trial ratios. --tune runs the learning-rate grid instead and writes the best
point per method to <results>/tuned.json; --tuned FILE makes a run use it.
Results go to --results (default results/lm-<time>): results.md, summary.json (every trial's
runs, order and load), val_loss_vs_time.png, and every rank's log under trial<k>/.
"""
import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))  # tools/: emulated_cluster
import emulated_cluster  # noqa: E402
import lm  # noqa: E402
import lm_worker  # noqa: E402
import methods  # noqa: E402
from train import (add_cluster_args, bytes_per_step, layout, load_average, make_cluster,  # noqa: E402
                   resolve_cluster_args, run_method, run_methods)

WORKER = os.path.join(HERE, "lm_worker.py")

# --smoke: a tiny model for a few steps (seconds per method); flags given explicitly win.
SMOKE = {"d_model": 32, "layers": 1, "heads": 2, "context": 32, "batch": 4, "max_steps": 30,
         "eval_every": 10, "sync_every": 5, "val_windows": 16, "warmup": 2, "powersgd_start_iter": 5,
         "fragments": 2, "local_sgd_start_iter": 5}
DEFAULT_TARGETS = "3.0,2.9"
SMOKE_TARGETS = "4.5,4.0"
DEFAULT_TUNE_LRS = "3e-3,6e-3,1.2e-2"
DEFAULT_TUNE_OUTER_LRS = "0.4,0.7,1.0"


def parse_floats(text, what):
    """"3.0,2.6" -> [3.0, 2.6]; ValueError naming `what` and the bad item."""
    out = []
    for item in str(text).split(","):
        item = item.strip()
        try:
            out.append(float(item))
        except ValueError:
            raise ValueError(f"{what}: {item!r} is not a number (expected a comma list such as 3.0,2.6)") from None
    if not out:
        raise ValueError(f"{what}: no values")
    return out


def target_key(target):
    return f"{target:g}"


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


def loss_at(curve, key, x):
    """The validation loss at curve position x of `key` ("step" or "time"), linearly interpolated
    between the evaluations around it; None beyond the curve's end."""
    for prev, cur in zip(curve, curve[1:]):
        if prev[key] <= x <= cur[key]:
            if cur[key] == prev[key]:
                return cur["val_loss"]
            frac = (x - prev[key]) / (cur[key] - prev[key])
            return prev["val_loss"] + frac * (cur["val_loss"] - prev["val_loss"])
    return curve[0]["val_loss"] if curve and x == curve[0][key] else None


def summarize(name, ranks, targets, ranks_per_host=1):
    """Per-rank JSON records of one run -> one row. Validation loss: mean over ranks (each rank
    evaluates its own model); time at a step: the slowest rank's training clock; bytes: mean
    over ranks and over hosts (ranks_per_host consecutive ranks). `targets`: a validation loss
    or a list of them."""
    targets = targets if isinstance(targets, (list, tuple)) else [targets]
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
    train_time = max(e["train_time"] for e in ends)
    averaged = [e["averaged_val_loss"] for e in ends if "averaged_val_loss" in e]
    return {
        "method": name,
        "params": start["params"],
        "lr": start.get("lr"),
        "outer_lr": start.get("outer_lr"),
        "steps": steps,
        "train_time": train_time,
        "time_per_step": train_time / steps,
        **bytes_per_step([e["tx_bytes"] for e in ends], steps, ranks_per_host),
        "final_val_loss": curve[-1]["val_loss"],
        "final_val_loss_max_rank": curve[-1]["val_loss_max_rank"],
        # How far apart the ranks' models end (before any final averaging): 0 for exact averaging.
        "final_param_spread": methods.param_spread(ends),
        "averaged_val_loss": averaged[0] if averaged else None,
        "time_to_target": {target_key(t): time_to_target(curve, t) for t in targets},
        "curve": curve,
    }


# ---- trials -----------------------------------------------------------------------------------
# The same conventions as tools/bench/harness.py: trial t runs the methods in the order that
# starts at method t mod m; a figure is the median over the trials with its min-max; a ratio
# against the baseline is taken within each trial and the median of those ratios is reported.
def trial_order(names, trial):
    """The methods in the order trial `trial` (0-based) runs them: starting at names[trial mod m]."""
    k = trial % len(names)
    return list(names[k:]) + list(names[:k])


def stats(values):
    """{"median", "min", "max", "n"} of the values, None values left out; None when none is left."""
    xs = [x for x in values if x is not None]
    if not xs:
        return None
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def aggregate(label, runs, targets, baseline_runs, equal_steps, equal_time):
    """One method's rows over the trials -> its summary row: stats of every figure, the
    per-trial speed-up against the baseline's run of the same trial, the loss at `equal_steps`
    steps and at `equal_time` seconds of training."""
    ok = [r for r in runs if "curve" in r]
    row = {"method": label, "trials": runs}
    skipped = [r["skipped"] for r in runs if "skipped" in r]
    errors = [r["error"] for r in runs if "error" in r]
    if skipped:
        row["skipped"] = skipped[0]
    if errors:
        row["errors"] = errors
    if not ok:
        if not skipped:
            row["error"] = errors[0] if errors else "no run"
        return row
    first = ok[0]
    row.update({
        "params": first["params"], "lr": first.get("lr"), "outer_lr": first.get("outer_lr"),
        "n": len(ok),
        "steps": stats([r["steps"] for r in ok]),
        "time_per_step": stats([r["time_per_step"] for r in ok]),
        "bytes_per_rank_per_step": stats([r["bytes_per_rank_per_step"] for r in ok]),
        "bytes_per_host_per_step": stats([r.get("bytes_per_host_per_step") for r in ok]),
        "final_val_loss": stats([r["final_val_loss"] for r in ok]),
        "averaged_val_loss": stats([r["averaged_val_loss"] for r in ok]),
        "final_param_spread": max((r["final_param_spread"] for r in ok if r["final_param_spread"] is not None),
                                  default=None),
        "loss_at_equal_steps": stats([loss_at(r["curve"], "step", equal_steps) for r in ok]),
        "loss_at_equal_time": stats([loss_at(r["curve"], "time", equal_time) for r in ok]),
        "time_to_target": {}, "speedup": {}, "final_vs_baseline": None,
    })
    for t in targets:
        key = target_key(t)
        times = [r["time_to_target"][key] for r in ok]
        row["time_to_target"][key] = dict(stats(times) or {"median": None}, reached=sum(x is not None for x in times))
        ratios = []
        for r, b in zip(runs, baseline_runs):
            if "curve" in r and b is not None and "curve" in b:
                mine, base = r["time_to_target"][key], b["time_to_target"][key]
                if mine and base:
                    ratios.append(base / mine)
        row["speedup"][key] = stats(ratios)
    finals = [r["final_val_loss"] / b["final_val_loss"] - 1 for r, b in zip(runs, baseline_runs)
              if "curve" in r and b is not None and "curve" in b]
    row["final_vs_baseline"] = stats(finals)
    return row


def _fmt_bytes(b):
    return "-" if b is None else (f"{b / 1e6:.3f} MB" if b >= 1e5 else f"{b / 1e3:.1f} kB")


def _fmt(s, fmt="{:.4f}", scale=1.0, suffix=""):
    """stats -> "median [min-max]" (just the median from one sample); "-" for None."""
    if s is None or s.get("median") is None:
        return "-"
    med = fmt.format(s["median"] * scale) + suffix
    if s["n"] == 1 or s["min"] == s["max"]:
        return med
    return f"{med} [{fmt.format(s['min'] * scale)}-{fmt.format(s['max'] * scale)}]"


def table_head(trials, eval_every, equal_steps, equal_time, baseline):
    spread = (f"median [min-max] over {trials} trials (methods in a rotating order per trial; speed-ups and "
              f"'vs {baseline}' are per-trial ratios against the baseline's run of the same trial)"
              if trials > 1 else "one trial (a single sample per figure)")
    return (f"Figures: {spread}. Times: training seconds on the slowest rank's clock, batch sampling "
            f"included; evaluation (every {eval_every} steps) and the stop decision excluded for every method "
            f"alike (communication a method runs in the background goes on during them). "
            f"Loss at equal steps: at step {equal_steps}; at equal time: at {equal_time:.1f} s of training "
            f"(the fewest steps and the shortest training any run had).")


def format_table(rows, targets, baseline, equal_steps, equal_time):
    cols = ["method", "lr", "steps", "s/step", "sent/rank/inner step", "sent/host/inner step", "final val loss",
            f"vs {baseline}",
            f"val loss at step {equal_steps}", f"val loss at {equal_time:.1f} s"]
    for t in targets:
        cols += [f"time to {target_key(t)} (s)", f"speed-up to {target_key(t)} vs {baseline}"]
    lines = ["| " + " | ".join(cols) + " |", "|---" * len(cols) + "|"]
    pad = " |" * (len(cols) - 2)
    for r in rows:
        if "curve" not in r and "n" not in r:
            what = f"skipped: {r['skipped']}" if "skipped" in r else f"failed: {r.get('error')}"
            lines.append(f"| {r['method']} | {what} |" + pad)
            continue
        lr = "-" if r.get("lr") is None else f"{r['lr']:g}"
        if r.get("outer_lr") is not None:
            lr += f", outer {r['outer_lr']:g}"
        final = _fmt(r["final_val_loss"])
        if r.get("averaged_val_loss") is not None:
            final += f" (averaged {_fmt(r['averaged_val_loss'])})"
        if r.get("errors"):
            final += f" ({len(r['errors'])} trial(s) failed)"
        cells = [r["method"], lr, _fmt(r["steps"], "{:.0f}"), _fmt(r["time_per_step"], "{:.3f}"),
                 _fmt_bytes(r["bytes_per_rank_per_step"]["median"]) if r["bytes_per_rank_per_step"] else "-",
                 _fmt_bytes(r["bytes_per_host_per_step"]["median"]) if r.get("bytes_per_host_per_step") else "-",
                 final, _fmt(r["final_vs_baseline"], "{:+.1f}", 100, "%"),
                 _fmt(r["loss_at_equal_steps"]), _fmt(r["loss_at_equal_time"])]
        for t in targets:
            key = target_key(t)
            ttt = r["time_to_target"][key]
            text = "not reached" if ttt["median"] is None else _fmt(ttt, "{:.1f}")
            if ttt["reached"] < r["n"]:
                text += f" (reached in {ttt['reached']}/{r['n']})"
            cells += [text, _fmt(r["speedup"][key], "{:.2f}", suffix="x")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def compute_share(rows, baseline):
    """The no-communication reference's step time against the baseline's (medians): (compute
    s/step, baseline s/step, compute fraction) or None."""
    comp = next((r for r in rows if r["method"] == "diag-compute" and "n" in r), None)
    base = next((r for r in rows if r["method"] == baseline and "n" in r), None)
    if comp is None or base is None:
        return None
    c, b = comp["time_per_step"]["median"], base["time_per_step"]["median"]
    return c, b, c / b


def plot(rows, targets, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(9, 5.5))
    styles = {"diag-": ":", "allreduce-gloo": "--", "torch-": "-."}
    lo, hi = [], []
    colors = plt.cm.tab20.colors
    for i, r in enumerate(r for r in rows if "n" in r):
        style = next((s for k, s in styles.items() if r["method"].startswith(k)), "-")
        width = 2.0 if "diloco" in r["method"] and not r["method"].startswith("torch-") else 1.2
        color = colors[(2 * i) % 20 + (2 * i) // 20 % 2]
        for j, run in enumerate(x for x in r["trials"] if "curve" in x):
            ax.plot([c["time"] for c in run["curve"]], [c["val_loss"] for c in run["curve"]], marker=".",
                    markersize=3, linewidth=width, linestyle=style, label=r["method"] if j == 0 else None,
                    color=color, alpha=1.0 if j == 0 else 0.5)
            lo.append(min(c["val_loss"] for c in run["curve"]))
            hi.append(run["curve"][min(1, len(run["curve"]) - 1)]["val_loss"])
    for t in targets:
        ax.axhline(t, color="gray", linewidth=0.8, linestyle=":")
    if lo:
        ax.set_ylim(min(lo + list(targets)) - 0.05, max(hi + list(targets)) + 0.1)
    ax.set_xlabel("training wall-clock time (s, evaluation excluded; slowest rank)")
    ax.set_ylabel("validation loss (nats/byte, mean over ranks)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right", fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---- tuning -----------------------------------------------------------------------------------
# What a tuned-values file must agree on with the run that uses it.
TUNED_CONFIG = ["ranks", "ranks_per_host", "network", "d_model", "layers", "heads", "context", "batch", "warmup",
                "sync_every", "fragments", "overlap", "mix", "powersgd_start_iter", "local_sgd_start_iter", "data",
                "seed"]


# Values a tuned-values file written before a key existed was tuned with.
TUNED_DEFAULTS = {"ranks_per_host": 1}


def tuning_grid(names, lrs, outer_lrs):
    """[(label, method, {"lr": .., "outer_lr": ..})]: every method at every lr, methods with an
    outer learning rate (lm.has_outer_lr) at every (lr, outer lr)."""
    grid = []
    for name in names:
        for lr in lrs:
            if lm.has_outer_lr(lm.resolve(name)):
                for outer in outer_lrs:
                    grid.append((f"{name} lr={lr:g} outer={outer:g}", name, {"lr": lr, "outer_lr": outer}))
            else:
                grid.append((f"{name} lr={lr:g}", name, {"lr": lr}))
    return grid


def choose(grid, rows):
    """Per method, the grid point with the lowest median final validation loss over the trials
    (the first of equals): {method: {"lr": .., ["outer_lr": ..]}}; failed and skipped points
    are not candidates. ValueError naming a method none of whose points finished."""
    by_label = {r["method"]: r for r in rows}
    best = {}
    for label, name, values in grid:
        r = by_label[label]
        if "n" not in r:
            continue
        loss = r["final_val_loss"]["median"]
        if name not in best or loss < best[name][0]:
            best[name] = (loss, label, values)
    missing = sorted({name for _, name, _ in grid} - set(best))
    if missing:
        raise ValueError(f"no learning rate of {', '.join(missing)} finished a tuning run")
    return {name: dict(values) for name, (_, _, values) in best.items()}


def grid_table(grid, rows, chosen, targets):
    by_label = {r["method"]: r for r in rows}
    cols = ["method", "lr", "outer lr", "steps", "final val loss", f"time to {target_key(targets[0])} (s)", "chosen"]
    lines = ["| " + " | ".join(cols) + " |", "|---" * len(cols) + "|"]
    for label, name, values in grid:
        r = by_label[label]
        outer = "-" if "outer_lr" not in values else f"{values['outer_lr']:g}"
        if "n" not in r:
            what = f"skipped: {r['skipped']}" if "skipped" in r else f"failed: {r.get('error')}"
            lines.append(f"| {name} | {values['lr']:g} | {outer} | {what} | | | |")
            continue
        ttt = r["time_to_target"][target_key(targets[0])]
        mark = "**chosen**" if chosen.get(name) == values else ""
        lines.append(f"| {name} | {values['lr']:g} | {outer} | {_fmt(r['steps'], '{:.0f}')} | "
                     f"{_fmt(r['final_val_loss'])} | {'not reached' if ttt['median'] is None else _fmt(ttt, '{:.1f}')} "
                     f"| {mark} |")
    return "\n".join(lines)


def read_tuned(path, names, config):
    """The tuned values of a --tune run for `names`: {method: {"lr", ["outer_lr"]}}; ValueError
    when the file is not one, holds no values for a method, or was tuned for another setup."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"--tuned {path}: cannot read it ({e})") from None
    if not isinstance(doc, dict) or "methods" not in doc or "config" not in doc:
        raise ValueError(f"--tuned {path}: not a file written by lm_job.py --tune (no 'methods'/'config')")
    differ = [f"{k} (tuned {doc['config'].get(k)!r}, this run {config.get(k)!r})"
              for k in TUNED_CONFIG if doc["config"].get(k, TUNED_DEFAULTS.get(k)) != config.get(k)]
    if differ:
        raise ValueError(f"--tuned {path} was tuned for another setup: " + "; ".join(differ))
    missing = [n for n in names if n not in doc["methods"]]
    if missing:
        raise ValueError(f"--tuned {path} has no values for {', '.join(missing)} (tuned: "
                         f"{', '.join(doc['methods'])}); tune them, or leave them out of --methods")
    return {n: doc["methods"][n] for n in names}


def main(argv=None):
    p = argparse.ArgumentParser(description="The LM workload: a byte-level GPT on the fortunes text, once per method.")
    add_cluster_args(p)
    p.add_argument("--network", default="100mbit",
                   help="local, or an emulated_cluster preset: " + ", ".join(emulated_cluster.PRESETS) +
                        ", or rate=..[,delay=..]")
    p.add_argument("--methods", default="all", help="all (" + ", ".join(lm.ALL) + "), or a comma list of: " +
                   ", ".join(lm.known()))
    p.add_argument("--targets", default=None,
                   help="validation losses for the time-to-target columns, a comma list "
                        f"(default {DEFAULT_TARGETS}; {SMOKE_TARGETS} with --smoke)")
    p.add_argument("--trials", type=int, default=1,
                   help="runs of every method, interleaved: trial t runs the methods in the order that starts at "
                        "method t mod m; each figure is the median over the trials with its min-max (default 1)")
    p.add_argument("--tune", action="store_true",
                   help="the tuning pass instead of the comparison: every method at every --tune-lrs (DiLoCo "
                        "variants and torch-diloco at every (lr, --tune-outer-lrs) pair) for the given budget; "
                        "per method the point with the lowest median final validation loss is written to "
                        "<results>/tuned.json, which --tuned then reads")
    p.add_argument("--tune-lrs", default=DEFAULT_TUNE_LRS, help=f"--tune's AdamW learning rates (default "
                   f"{DEFAULT_TUNE_LRS})")
    p.add_argument("--tune-outer-lrs", default=DEFAULT_TUNE_OUTER_LRS, help="--tune's DiLoCo outer learning "
                   f"rates (default {DEFAULT_TUNE_OUTER_LRS})")
    p.add_argument("--tuned", default=None,
                   help="a tuned.json written by --tune: every method trains with its tuned lr (and outer lr) "
                        "instead of --lr/--outer-lr; refused when it was tuned for another setup or lacks a method")
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
    resolve_cluster_args(args, p)

    worker_args = vars(model_args.parse_args([]))
    if args.smoke:
        worker_args.update(SMOKE)
    for key in list(worker_args):
        if key in vars(args):
            worker_args[key] = getattr(args, key)
    try:
        targets = parse_floats(args.targets or (SMOKE_TARGETS if args.smoke else DEFAULT_TARGETS), "--targets")
        names = lm.names(args.methods)
        if args.network != "local":
            emulated_cluster.parse_network(args.network)
        if args.trials < 1:
            raise ValueError(f"--trials must be at least 1, got {args.trials}")
        for key in ("sync_every", "eval_every", "max_steps"):
            if worker_args[key] < 1:
                raise ValueError(f"--{key.replace('_', '-')} must be at least 1, got {worker_args[key]}")
        if worker_args["local_sgd_start_iter"] < 0:
            raise ValueError(f"--local-sgd-start-iter must be >= 0, got {worker_args['local_sgd_start_iter']}")
        if args.tune and args.tuned:
            raise ValueError("--tune and --tuned together: tune first, then pass its tuned.json to the run")
        for flag in ("lr", "outer_lr"):
            if flag in vars(args) and (args.tune or args.tuned):
                raise ValueError(f"--{flag.replace('_', '-')} with {'--tune' if args.tune else '--tuned'}: the "
                                 "learning rates come from the grid or the tuned file")
        config = dict(worker_args, ranks=args.ranks, ranks_per_host=args.ranks_per_host, network=args.network)
        overrides = read_tuned(args.tuned, names, config) if args.tuned else {n: {} for n in names}
        if args.tune:
            grids = {}
            for flag, text in (("--tune-lrs", args.tune_lrs), ("--tune-outer-lrs", args.tune_outer_lrs)):
                grids[flag] = parse_floats(text, flag)
                if min(grids[flag]) <= 0 or len(set(grids[flag])) < len(grids[flag]):
                    raise ValueError(f"{flag}: learning rates must be positive and distinct, got {text}")
            specs = tuning_grid(names, grids["--tune-lrs"], grids["--tune-outer-lrs"])
        else:
            specs = [(n, n, overrides[n]) for n in names]
        if len(set(names)) < len(names):
            raise ValueError(f"--methods names a method twice: {args.methods}")
    except ValueError as e:
        p.error(str(e))
    timeout = args.timeout or 3 * worker_args["time_budget"] + 120
    if args.smoke and args.timeout is None:
        timeout = 120
    results = args.results or os.path.join("results", time.strftime("lm-tune-%Y%m%d-%H%M%S" if args.tune
                                                                     else "lm-%Y%m%d-%H%M%S"))
    os.makedirs(results, exist_ok=True)
    cluster = make_cluster(args)

    w = worker_args
    shape = f"GPT d={w['d_model']} layers={w['layers']} heads={w['heads']} context={w['context']}"
    print(f"gossipcc LM workload{' (tuning pass)' if args.tune else ''}: {layout(args)}, network {args.network}, "
          f"{shape}, batch {w['batch']}/rank, {w['time_budget']:g} s of training or {w['max_steps']} steps per run, "
          f"{len(specs)} runs x {args.trials} trial(s), on {w['data']}; results in {results}", flush=True)
    labels = [label for label, _, _ in specs]
    by_label = {label: (name, values) for label, name, values in specs}
    jobs = [(t, label) for t in range(args.trials) for label in trial_order(labels, t)]
    trials = [{"trial": t, "order": trial_order(labels, t)} for t in range(args.trials)]
    runs = {label: [None] * args.trials for label in labels}

    def run_one(i, job):
        trial, label = job
        name, values = by_label[label]
        if trials[trial]["order"][0] == label:
            trials[trial]["load_start"] = load_average()
        m = lm.resolve(name)
        where = f"[{i + 1}/{len(jobs)}]" + (f" trial {trial + 1}/{args.trials}" if args.trials > 1 else "")
        reason = lm.unsupported_reason(m)
        if reason is not None:
            print(f"{where} {label}: skipped: the installed gossipcc rejects outer_sync "
                  f"{m.outer_sync!r}: {reason}", flush=True)
            row = {"method": label, "skipped": reason}
        else:
            print(f"{where} {label}: {m.description}   (load {load_average()})", flush=True)
            run_args = dict(worker_args, **values)
            flags = []
            for key, value in run_args.items():
                flags += ["--" + key.replace("_", "-"), str(value)]
            folder = os.path.join(results, f"trial{trial + 1}")
            os.makedirs(folder, exist_ok=True)
            stem = label.replace(" ", ".").replace("=", "")

            def command(r, out):
                return [sys.executable, WORKER, "--method", name, "--out", out] + flags + (
                    ["--progress"] if r == 0 else [])

            def row_of(ranks, run):
                row = summarize(label, ranks, targets, args.ranks_per_host)
                row["run_wall_seconds"] = run.wall_seconds
                if "skipped" in row:
                    print(f"  skipped: {row['skipped']}", flush=True)
                return row

            row = run_method(cluster, folder, stem, args.ranks, command, timeout, row_of)
            row["method"] = label
        row["trial"] = trial
        runs[label][trial] = row
        if trials[trial]["order"][-1] == label:
            trials[trial]["load_end"] = load_average()
        return row

    done, status = run_methods(cluster, jobs, run_one, "lm_job")
    if done is None:
        return status

    finished = [r for rs in runs.values() for r in rs if "curve" in r]
    equal_steps = min((r["steps"] for r in finished), default=0)
    equal_time = min((r["train_time"] for r in finished), default=0.0)
    base_label = args.baseline if args.baseline in runs else None
    rows = [aggregate(label, runs[label], targets, runs[base_label] if base_label else [None] * args.trials,
                      equal_steps, equal_time) for label in labels]
    summary = {"args": vars(args), "worker_args": worker_args, "targets": targets, "trials": trials,
               "equal_steps": equal_steps, "equal_time": equal_time, "rows": rows}
    params = next((r["params"] for r in rows if "params" in r), None)
    head = (f"{layout(args)}, network {args.network}, {shape} ({params} parameters), batch {w['batch']}/rank, "
            f"AdamW ({'lr per method from ' + args.tuned if args.tuned else 'lr ' + str(w['lr'])}), "
            f"DiLoCo H={w['sync_every']} outer lr {'per method' if args.tuned else w['outer_lr']} (Nesterov 0.9), "
            f"streaming fragments={w['fragments']} overlap={w['overlap']} mix={w['mix']}, post-local SGD from step "
            f"{w['local_sgd_start_iter']} averaging every {w['sync_every']}, budget {w['time_budget']:g} s or "
            f"{w['max_steps']} steps, targets {', '.join(target_key(t) for t in targets)}; load (1/5/15 min) per "
            "trial: " + "; ".join(f"{t['trial'] + 1}: {t.get('load_start')} -> {t.get('load_end')}" for t in trials))
    if args.tune:
        try:
            chosen = choose(specs, rows)
        except ValueError as e:
            print(f"lm_job: {e}", file=sys.stderr)
            chosen = None
        text = (head + "\n\nTuning pass: the chosen point per method is the lowest median final validation loss "
                "at the end of the budget.\n\n" + grid_table(specs, rows, chosen or {}, targets) + "\n")
        print("\n" + text)
        with open(os.path.join(results, "results.md"), "w") as f:
            f.write(text)
        with open(os.path.join(results, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1)
        if chosen is None:
            return 1
        failed = [r["method"] for r in rows if "error" in r or r.get("errors")]
        tuned = os.path.join(results, "tuned.json")
        with open(tuned, "w") as f:
            json.dump({"criterion": "lowest median final validation loss over the trials at the end of the budget",
                       "config": config, "budget": {"time_budget": w["time_budget"], "max_steps": w["max_steps"]},
                       "trials": args.trials, "methods": chosen, "failed": failed,
                       "grid": [{"method": name, **values,
                                 "final_val_loss": next(r for r in rows if r["method"] == label).get("final_val_loss")}
                                for label, name, values in specs]}, f, indent=1)
        print(f"tuned values: {tuned} (use: lm_job.py --tuned {tuned} ...)")
        if failed:
            print(f"lm_job: {len(failed)} grid point(s) failed, so the choice is among the others: "
                  f"{', '.join(failed)} (logs under {results}/trial<k>/)", file=sys.stderr)
            return 1
        return 0

    table = format_table(rows, targets, args.baseline, equal_steps, equal_time)
    share = compute_share(rows, args.baseline)
    text = head + "\n\n" + table_head(args.trials, w["eval_every"], equal_steps, equal_time, args.baseline) + \
        "\n\n" + table + "\n"
    if share is not None:
        text += (f"\nCompute vs communication: a step without communication (diag-compute) took "
                 f"{share[0]:.3f} s, a step of {args.baseline} {share[1]:.3f} s (medians): compute "
                 f"{100 * share[2]:.0f}%, communication {100 * (1 - share[2]):.0f}% of the baseline's step.\n")
    print("\n" + text)
    with open(os.path.join(results, "results.md"), "w") as f:
        f.write(text)
    with open(os.path.join(results, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    if not args.no_plot:
        png = os.path.join(results, "val_loss_vs_time.png")
        plot(rows, targets, png, f"byte-level GPT on fortunes, {layout(args)}, network {args.network}")
        print(f"plot: {png}")
    print(f"results: {results}/results.md")
    return 1 if any("error" in r or r.get("errors") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
