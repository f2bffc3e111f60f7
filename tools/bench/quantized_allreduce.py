#!/usr/bin/env python3
"""Benchmark (f): the quantized all-reduce (8 and 4 bits, compression/quantized_allreduce.h) vs the exact
float32 all-reduce, through backend="gossipcc" and, side by side, through a gloo group on the same
ranks (dist.new_group(backend="gloo")), 4 emulated hosts of one rank each by default (--hosts,
--ranks-per-host), 16 MB of float32 at 100 Mbit/s per host.

    tools/bench/run.sh quantized_allreduce [--hosts 4 [--ranks-per-host 1] | --ranks 4] [--network 100mbit]
                                           [--bytes 16777216] [--iterations 1] [--trials 5] [--max-load 0.5] [--allow-load] [--results-dir DIR]

On tools/bench/harness.py: one untimed warm-up iteration, then --trials trials of --iterations
iterations each, in the same processes. In every iteration the four variants run in rotating
order (iteration i of trial t starts at variant t + i), each preceded by an untimed barrier. A
trial's sample of a variant is the median over the trial's iterations of the slowest rank's time
(ProcessGroupGossipcc.quantized_allreduce(...).wait() against dist.all_reduce, both averaging:
the exact one divides by n after its sum, as DiLoCo's exact transport does); the table shows the
median over the trials with its min-max, and the speed-ups are the median of the per-trial
speed-ups. Data: each rank's tensor is standard normal draws (its own seed). Bytes: the NIC tx
counters (frames with headers, TCP ACKs included), from just before the op to after the
barrier that follows it, per rank (its own sockets' bytes) and per host (every rank of it). Error (of the warm-up's results): the largest |quantized -
exact average| over the tensor, over the largest |exact average| (the exact average computed in
float64 from every rank's tensor, which each rank regenerates from the seeds). Every variant's
result must be bitwise the same on every rank (a hash per rank; the table is refused otherwise).
The goal: at least 3.5x (8 bits) and 6x (4 bits) less time than the exact all-reduce
("speed-up vs exact": gossipcc's; "vs gloo": ProcessGroupGloo's).

The flat variants run on a group with GOSSIPCC_TOPOLOGY=flat (every rank its own node). On
hosts of several ranks (--ranks-per-host > 1, an emulated network) two more variants run on a
group with the default topology (auto: two-level there): the quantized all-reduce compressed only
across hosts (compression/hierarchical_quantized_allreduce.h), "vs flat" giving its speed-up over the
flat variant of the same bits.
"""
import argparse
import hashlib
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import harness  # noqa: E402

VARIANTS = ("exact float32", "exact float32 (gloo)", "quantized 8 bits", "quantized 4 bits")
OVER_HOSTS = ("quantized 8 bits over hosts", "quantized 4 bits over hosts")


def variants_for(ranks_per_host, network):
    """The variants of a run: the two-level ones where hosts hold several ranks (and are hosts
    of their own network)."""
    return VARIANTS + (OVER_HOSTS if ranks_per_host > 1 and network != "local" else ())


def data(rank, count):
    import torch
    return torch.randn(count, generator=torch.Generator().manual_seed(1234 + rank))


def worker(args):
    import datetime
    import torch
    import torch.distributed as dist
    import gossipcc
    torch.set_num_threads(1)
    rank, n = common.worker_env()
    variants = variants_for(args.ranks_per_host, args.network)
    # Flat: every rank its own node (the default, auto, is two-level on hosts of several ranks).
    os.environ["GOSSIPCC_TOPOLOGY"] = "flat"
    dist.init_process_group("gossipcc", init_method="env://", timeout=datetime.timedelta(seconds=600))
    del os.environ["GOSSIPCC_TOPOLOGY"]
    pg = gossipcc.get_backend_object()
    gloo = dist.new_group(backend="gloo")  # the alternative a PyTorch user has, on the same hosts
    over_hosts = None
    if OVER_HOSTS[0] in variants:
        over_hosts = gossipcc.get_backend_object(dist.new_group(backend="gossipcc"))  # the default: auto
        if not over_hosts.topology()["hierarchical"]:
            raise AssertionError(f"rank {rank}: the default topology is not two-level on these hosts: "
                                 f"{over_hosts.topology()['description']}")
    count = args.bytes // 4
    source = data(rank, count)
    t = torch.empty(count, dtype=torch.float32)

    def run(name):
        if name.startswith("exact float32"):
            dist.all_reduce(t, group=gloo if "gloo" in name else None)
            t.div_(n)
        else:
            group = over_hosts if name.endswith("over hosts") else pg
            group.quantized_allreduce([t], 8 if "8" in name else 4, True).wait()

    def one(name):
        t.copy_(source)
        return common.timed(lambda: run(name), dist.barrier)

    results = {}
    for name in variants:  # warm-up, not timed: its results are the ones checked
        one(name)
        results[name] = t.clone()
    trials = common.run_trials(dist.barrier, variants, args.trials, args.iterations, one)
    # Accuracy, against the exact average in float64.
    exact = torch.zeros(count, dtype=torch.float64)
    for r in range(n):
        exact += data(r, count).double()
    exact /= n
    scale = exact.abs().max().item()
    error = {name: (results[name].double() - exact).abs().max().item() / scale for name in variants}
    # Every rank must hold the same bits (the exact all-reduce's too: every gossipcc all-reduce path
    # gives every rank the same bits).
    digest = {name: hashlib.sha256(results[name].numpy().tobytes()).hexdigest() for name in variants}
    dist.barrier()
    dist.destroy_process_group()
    with open(args.out, "w") as f:
        json.dump({"trials": trials, "error": error, "digest": digest, "variants": list(variants)}, f)


def doc_variants(docs_or_doc):
    """The variants a run measured (older documents: the flat four)."""
    if isinstance(docs_or_doc, list):
        return tuple(docs_or_doc[0].get("variants", VARIANTS))
    return tuple(docs_or_doc["info"].get("variants", VARIANTS))


CELL = "all-reduce"  # the benchmark's one configuration


def check_digests(docs):
    """AssertionError naming the first variant whose ranks hold different result bits."""
    for v in doc_variants(docs):
        if len({d["digest"][v] for d in docs}) != 1:
            raise AssertionError(f"{v}: ranks hold different results")


def trial_samples(docs, trial):
    """One trial's samples from every rank's document (common.slowest_samples): per variant the
    median over the trial's iterations of the slowest rank's time (s), and the bytes sent per op
    per rank and per host (the mean over iterations, then over the ranks; None without counters)."""
    return {CELL: common.slowest_samples(docs, trial, doc_variants(docs))}


def record(run, docs):
    """The ranks' documents into the harness run: the checks, the errors, one trial per trial
    (rank 0's load probe)."""
    check_digests(docs)
    run.cell(CELL)
    run.info["variants"] = list(doc_variants(docs))
    run.info["error"] = {v: max(d["error"][v] for d in docs) for v in doc_variants(docs)}
    for trial in range(len(docs[0]["trials"])):
        run.add_trial(trial_samples(docs, trial), docs[0]["trials"][trial]["load"],
                      docs[0]["trials"][trial]["orders"][0],
                      detail={"orders": docs[0]["trials"][trial]["orders"]})


def table(doc):
    """The table: per variant its time, the speed-ups against gossipcc's and gloo's exact
    all-reduce (medians of the per-trial ratios), MB sent per rank and per host per op and the
    worst error; with the two-level variants, each one's speed-up over its flat variant."""
    cell = doc["summary"]["cells"][CELL]["methods"]
    variants = doc_variants(doc)
    over = OVER_HOSTS[0] in variants
    rows = []
    for v in variants:
        flat = v[:-len(" over hosts")] if v.endswith(" over hosts") else None
        vs_flat = ([harness.cell_text(harness.ratio_stats(doc["trials"], CELL, flat, v, "time"), 1, 2, "x")
                    if flat else "-"] if over else [])
        rows.append([v, harness.cell_text(cell[v]["time"], 1e3, 0),
                     harness.cell_text(harness.ratio_stats(doc["trials"], CELL, "exact float32", v, "time"), 1, 2, "x"),
                     harness.cell_text(harness.ratio_stats(doc["trials"], CELL, "exact float32 (gloo)", v, "time"),
                                       1, 2, "x")] + vs_flat + [
                     common.bytes_text(cell[v].get("sent")), common.bytes_text(cell[v].get("host_sent")),
                     f"{doc['info']['error'][v]:.2e}"])
    return harness.markdown_table(["variant", "time (ms)", "speed-up vs exact", "vs gloo"] +
                                  (["vs flat"] if over else []) +
                                  ["MB sent/rank/op", "MB sent/host/op", "max error / max |average|"], rows)


def report(doc):
    a = doc["args"]
    return (f"{harness.preamble(doc)}\n\nquantized vs exact float32 all-reduce (average), backend gossipcc, "
            f"{common.args_world(a)}, {common.human_bytes(a['bytes'])} float32 normal draws, network {a['network']}, "
            f"{a['iterations']} iteration(s) per trial, the slowest rank's time\n\n{table(doc)}\n\n"
            f"{harness.trials_table(doc)}")


def plot(doc, path):
    """Each variant's time per trial (points) and median (bar)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cell = doc["summary"]["cells"][CELL]["methods"]
    variants = doc_variants(doc)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = list(range(len(variants)))
    ax.bar(xs, [1e3 * cell[v]["time"]["median"] for v in variants], color="lightsteelblue", label="median")
    for x, v in zip(xs, variants):
        ys = [1e3 * s for s in harness.samples_of(doc["trials"], CELL, v, "time")]
        ax.plot([x] * len(ys), ys, "k.", label="trials" if x == 0 else None)
    ax.set(xticks=xs, ylabel="ms (slowest rank)")
    ax.set_xticklabels(variants, fontsize=7)
    ax.legend(fontsize=8)
    ax.set_title(f"quantized vs exact all-reduce, {common.args_world(doc['args'])}, {doc['args']['network']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    common.add_cluster_arguments(p, hosts=4, network="100mbit")
    p.add_argument("--bytes", type=int, default=16 << 20)
    p.add_argument("--iterations", type=int, default=1, help="iterations per trial")
    p.add_argument("--plot", metavar="PNG", help="also write a plot (each variant's time per trial) here")
    harness.add_arguments(p)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    if args.iterations < 1:
        common.fail(f"quantized_allreduce: --iterations must be at least 1, got {args.iterations}")
    common.resolve_cluster_arguments(args, "quantized_allreduce")
    run = harness.Run("quantized_allreduce", args, variants_for(args.ranks_per_host, args.network), "exact float32",
                      "time")
    try:
        with common.make_cluster(args.hosts, args.ranks_per_host, args.network) as cluster:
            docs = common.run_ranks(cluster, os.path.abspath(__file__),
                                    ["--bytes", str(args.bytes), "--iterations", str(args.iterations),
                                     "--trials", str(args.trials), "--ranks-per-host", str(args.ranks_per_host),
                                     "--network", args.network], timeout=1800)
    except common.NamespacesUnavailable as e:
        common.fail(f"quantized_allreduce: emulated network not available: {e}")
    record(run, docs)
    doc = run.finish(report)
    if args.plot:
        plot(doc, args.plot)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
