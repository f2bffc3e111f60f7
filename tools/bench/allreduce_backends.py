#!/usr/bin/env python3
"""Benchmark (a): exact all-reduce through backend="gossipcc" vs backend="gloo" (c10d's
ProcessGroupGloo), same processes and tensors, N ranks (default 4), 4 KB .. 256 MB, on an
unshaped emulated network and at 1 Gbit/s per host; gossipcc with its lossless packing
(GOSSIPCC_LOSSLESS_FLOAT32_ALLREDUCE=1, "gossipcc packed"); and with hosts of several ranks
(--ranks-per-host > 1), gossipcc's two-level all-reduce (GOSSIPCC_TOPOLOGY=hierarchical,
"gossipcc hierarchical").

    tools/bench/run.sh allreduce_backends [--hosts 4 [--ranks-per-host 1] | --ranks 4] [--networks none,1gbit] [--max-bytes 268435456] [--plot PNG]
                                          [--iterations K] [--quantiles] [--data gradients|constant]
                                          [--trials 5] [--max-load 0.5] [--allow-load] [--results-dir DIR]

Every rank is its own host by default (tools/emulated_cluster.py; --hosts H --ranks-per-host G
puts G ranks on each of H hosts, sharing its link). On tools/bench/harness.py: per network,
one run of the ranks: an untimed warm-up op per size and backend, then --trials trials, each
going through every size; at each size a trial runs K iterations (--iterations; default by
size), and in each iteration the three backends run in rotating order (iteration i of trial t
starts at backend t + i), each op preceded by an untimed barrier. A trial's sample is the median
over its iterations of the slowest rank's time; a cell is the median over the trials with its
min-max, and the ratios to gloo are the medians of the per-trial ratios. Bytes are the ranks'
NIC tx counters (frames with headers, TCP ACKs included) from just before the op to after the
barrier that follows it (so the op's last queued segments count; the barrier adds a few
hundred bytes), per rank (its own sockets) and per host (its NIC: every rank of the host),
averaged over ranks. Link bound: the
ring all-reduce's 2(n-1)/n * bytes at the link rate, unpacked.

Data (--data): "gradients" (default): each rank's tensor is made of real gradients, those of
the main job's digits MLP (tools/train/worker.py, 64-512-512-10, batch 32 of the rank's
shard), one SGD step apart, concatenated to the size; packing's gain depends on the values,
and these are what DDP would all-reduce. "constant": rank r's tensor is all r + 1 (packs to
0.75: one exponent per block). Checks: the packed result is bitwise the plain gossipcc
result (the same ring order), gloo's agrees with it to float32 rounding, and with constant
data all three equal the exact sum. --quantiles adds a table of the per-iteration distribution (the slowest rank's
time per iteration: p10, p25, median, p75, p90, mean), to tell a shift of every call from a
few slow ones.
"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import harness  # noqa: E402


def iterations(nbytes, override=None):
    """Iterations per trial at a size: --iterations, or 10 up to 16 MB, 3 up to 64 MB, then 1
    (with the default 5 trials: 50, 15 and 5 ops per backend)."""
    if override:
        return override
    return 10 if nbytes <= (16 << 20) else 3 if nbytes <= (64 << 20) else 1


BACKENDS = ("gloo", "gossipcc", "gossipcc packed", "gossipcc hierarchical")


def gradient_source(rank, n, nbytes):
    """nbytes of this rank's gradients of the main job's MLP (one SGD step apart), float32."""
    import torch
    sys.path.insert(0, os.path.join(common.TOOLS, "train"))
    from worker import Shard, load_digits, make_model
    x, y, _, _ = load_digits(0)
    model = make_model(512, 0)
    shard = Shard(x, y, rank, n, 32, 0)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    out = torch.empty(nbytes // 4, dtype=torch.float32)
    filled = 0
    while filled < out.numel():
        bx, by = shard.next()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(bx), by).backward()
        flat = torch.cat([p.grad.flatten() for p in model.parameters()])
        take = min(flat.numel(), out.numel() - filled)
        out[filled:filled + take] = flat[:take]
        filled += take
        opt.step()
    return out


def worker(args):
    import datetime
    import torch
    import torch.distributed as dist
    import gossipcc  # noqa: F401  (registers the backend)
    torch.set_num_threads(1)
    rank, n = common.worker_env()
    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=300))
    groups = {"gloo": dist.new_group(backend="gloo")}
    os.environ["GOSSIPCC_TOPOLOGY"] = "flat"  # the default (auto) is two-level on hosts of several ranks
    groups["gossipcc"] = dist.new_group(backend="gossipcc")
    os.environ["GOSSIPCC_LOSSLESS_FLOAT32_ALLREDUCE"] = "1"  # read when the group is created
    groups["gossipcc packed"] = dist.new_group(backend="gossipcc")
    del os.environ["GOSSIPCC_LOSSLESS_FLOAT32_ALLREDUCE"]
    if args.ranks_per_host > 1:  # the two-level all-reduce over the emulated hosts
        os.environ["GOSSIPCC_TOPOLOGY"] = "hierarchical"
        groups["gossipcc hierarchical"] = dist.new_group(backend="gossipcc")
    del os.environ["GOSSIPCC_TOPOLOGY"]
    expected = n * (n + 1) / 2
    sizes = []
    nbytes = args.min_bytes
    while nbytes <= args.max_bytes:
        sizes.append(nbytes)
        nbytes *= 4
    source = gradient_source(rank, n, sizes[-1]) if args.data == "gradients" else None

    def fill(t):
        if source is None:
            t.fill_(rank + 1)
        else:
            t.copy_(source[:t.numel()])

    def one(name, t):
        fill(t)
        dt, tx, host_tx = common.timed(lambda: dist.all_reduce(t, group=groups[name]), dist.barrier)
        if source is None and (t[0].item() != expected or t[-1].item() != expected):
            raise AssertionError(f"{name} all-reduce of {t.numel() * 4} bytes: got {t[0].item()}, "
                                 f"{t[-1].item()}, expected {expected}")
        return dt, tx, host_tx

    for nbytes in sizes:  # warm-up, not timed: its results are the ones checked
        t = torch.empty(nbytes // 4, dtype=torch.float32)
        results = {}
        for name in groups:
            one(name, t)
            results[name] = t.clone()
        check_results(results, nbytes)
        del results, t
    names = list(groups)
    probe = harness.LoadProbe()
    trials = []
    for trial in range(args.trials):
        dist.barrier()
        probe.start()
        out = []
        for nbytes in sizes:
            t = torch.empty(nbytes // 4, dtype=torch.float32)
            k = iterations(nbytes, args.iterations)
            times = {name: [] for name in names}
            sent = {name: 0 for name in names}
            host_sent = {name: 0 for name in names}
            for i in range(k):
                for name in harness.trial_order(names, trial, i):
                    dt, tx, host_tx = one(name, t)
                    times[name].append(dt)
                    sent[name] += tx or 0
                    host_sent[name] += host_tx or 0
            out.append({"bytes": nbytes, "k": k, "times": times,
                        "tx_per_op": {name: sent[name] / k for name in names},
                        "host_tx_per_op": {name: host_sent[name] / k for name in names}})
            del t
        dist.barrier()
        trials.append({"sizes": out, "order": harness.trial_order(names, trial), "load": probe.stop()})
    dist.barrier()
    dist.destroy_process_group()
    with open(args.out, "w") as f:
        json.dump({"trials": trials}, f)


def check_results(results, nbytes):
    """The packed ring returns the plain one's bits; gloo sums in another order."""
    import torch
    plain, packed, gloo = results["gossipcc"], results["gossipcc packed"], results["gloo"]
    if not torch.equal(plain.view(torch.int32), packed.view(torch.int32)):
        bad = (plain.view(torch.int32) != packed.view(torch.int32)).nonzero()[0].item()
        raise AssertionError(f"packed all-reduce of {nbytes} bytes differs from the plain one at element {bad}: "
                             f"{packed[bad].item()} vs {plain[bad].item()}")
    for name in ("gossipcc", "gossipcc hierarchical"):
        if name not in results:
            continue
        mine = results[name]
        if not torch.allclose(mine, gloo, rtol=1e-5, atol=1e-6 * max(1.0, gloo.abs().max().item())):
            bad = (mine - gloo).abs().argmax().item()
            raise AssertionError(f"{name} and gloo all-reduces of {nbytes} bytes differ at element {bad}: "
                                 f"{mine[bad].item()} vs {gloo[bad].item()}")


link_bytes_per_second = common.link_bytes_per_second


def cell_name(network, nbytes):
    return f"{network} {common.human_bytes(nbytes)}"


def trial_samples(docs, trial, network):
    """One trial's samples at every size from every rank's document: per backend the median over
    the trial's iterations of the slowest rank's time (s) and the tx bytes per op averaged over
    the ranks; and per size and backend the slowest rank's time per iteration (for --quantiles)."""
    samples, slowest = {}, {}
    runs = [d["trials"][trial]["sizes"] for d in docs]
    for i, entry in enumerate(runs[0]):
        cell = cell_name(network, entry["bytes"])
        samples[cell], slowest[cell] = {}, {}
        for name in (b for b in BACKENDS if b in entry["times"]):
            per_iteration = [max(r[i]["times"][name][j] for r in runs) for j in range(entry["k"])]
            slowest[cell][name] = per_iteration
            host = [r[i]["host_tx_per_op"][name] for r in runs if "host_tx_per_op" in r[i]]
            samples[cell][name] = {"time": common.median(per_iteration),
                                   "tx": sum(r[i]["tx_per_op"][name] for r in runs) / len(runs),
                                   "host_tx": sum(host) / len(host) if host else None}
    return samples, slowest


def record(run, docs, network, n, bps):
    """One network's documents into the harness run: a cell per size (its bytes, k, the ring's
    link bound), a trial per trial (rank 0's load probe)."""
    for entry in docs[0]["trials"][0]["sizes"]:
        run.cell(cell_name(network, entry["bytes"]), network=network, bytes=entry["bytes"], k=entry["k"],
                 bound=2 * (n - 1) / n * entry["bytes"] / bps if bps else None)
    for trial in range(len(docs[0]["trials"])):
        samples, slowest = trial_samples(docs, trial, network)
        run.add_trial(samples, docs[0]["trials"][trial]["load"], docs[0]["trials"][trial]["order"],
                      group=network, detail={"slowest": slowest})


def backends_in(doc, network):
    cells = [c for c, info in doc["cells"].items() if info["network"] == network]
    have = doc["summary"]["cells"][cells[0]]["methods"] if cells else {}
    return [b for b in BACKENDS if b in have]


def networks_of(doc):
    out = []
    for info in doc["cells"].values():
        if info["network"] not in out:
            out.append(info["network"])
    return out


def table(doc, network):
    """One network's table: per size the median time of every backend (min-max), each gossipcc
    variant's time over gloo's (the median of the per-trial ratios), the link bound and each
    backend's time over it where the link is shaped, and each backend's bytes sent per rank and
    per host per op over the size."""
    names = backends_in(doc, network)
    others = [b for b in names if b != "gloo"]
    cells = [(c, info) for c, info in doc["cells"].items() if info["network"] == network]
    shaped = bool(cells and cells[0][1]["bound"])
    body = []
    for c, info in cells:
        s = doc["summary"]["cells"][c]
        nbytes = info["bytes"]
        row = [common.human_bytes(nbytes), info["k"]] + [harness.cell_text(s["methods"][b]["time"], 1e3, 2)
                                                          for b in names]
        row += [harness.cell_text(s["ratios"][b], 1, 2) for b in others]
        if shaped:
            row += [f"{1e3 * info['bound']:.2f}"] + [f"{s['methods'][b]['time']['median'] / info['bound']:.2f}"
                                                    for b in names]
        for key in ("tx", "host_tx"):
            row += [f"{s['methods'][b][key]['median'] / nbytes:.3f}" if network != "local"
                    and s["methods"][b].get(key) else "-" for b in names]
        body.append(row)
    header = ["size", "k per trial"] + [f"{b} (ms)" for b in names] + [f"ratio {b}/gloo" for b in others]
    if shaped:
        header += ["link bound (ms)"] + [f"{b}/bound" for b in names]
    header += [f"sent/rank/op ÷ size, {b}" for b in names] + [f"sent/host/op ÷ size, {b}" for b in names]
    return harness.markdown_table(header, body)


QUANTILES = (("p10", 2), ("p25", 5), ("median", 10), ("p75", 15), ("p90", 18))  # 5% cut points


def quantile_table(doc, network):
    """Per size and backend: quantiles (linear interpolation between the sorted times) and the
    mean of the slowest rank's time per iteration, over every iteration of every trial, in ms."""
    body = []
    for c, info in doc["cells"].items():
        if info["network"] != network:
            continue
        for name in backends_in(doc, network):
            xs = [x for t in doc["trials"] if c in t["detail"]["slowest"] for x in t["detail"]["slowest"][c][name]]
            cuts = statistics.quantiles(xs, n=20, method="inclusive") if len(xs) > 1 else [xs[0]] * 19
            body.append([common.human_bytes(info["bytes"]), name, len(xs)]
                        + [f"{1e3 * cuts[i - 1]:.2f}" for _, i in QUANTILES]
                        + [f"{1e3 * statistics.mean(xs):.2f}"])
    return harness.markdown_table(["size", "backend", "iterations"] + [q for q, _ in QUANTILES] + ["mean"], body)


def title(args):
    variants = "plain, packed and hierarchical" if args.get("ranks_per_host", 1) > 1 else "plain and packed"
    return (f"all-reduce, backend gossipcc ({variants}) vs gloo, {common.args_world(args)}, "
            f"{common.human_bytes(args['min_bytes'])}..{common.human_bytes(args['max_bytes'])}, "
            f"float32 {args['data']}")


def report(doc):
    parts = [harness.preamble(doc), title(doc["args"])]
    for network in networks_of(doc):
        parts.append(f"network {network}:\n\n{table(doc, network)}")
        if doc["args"].get("quantiles"):
            parts.append(f"per-iteration distribution, network {network} (ms, slowest rank per iteration, "
                         f"every trial):\n\n{quantile_table(doc, network)}")
    parts.append(harness.trials_table(doc))
    return "\n\n".join(parts)


def plot(doc, path):
    """Left: each backend's median time per size (and the link bound where shaped), log-log;
    right: each gossipcc variant's time over gloo's per size (median of the per-trial ratios,
    min-max as error bars), 1.0 marked."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (times, ratios) = plt.subplots(1, 2, figsize=(12, 4.5))
    for network in networks_of(doc):
        cells = [(c, info) for c, info in doc["cells"].items() if info["network"] == network]
        sizes = [info["bytes"] for _, info in cells]
        summ = [doc["summary"]["cells"][c] for c, _ in cells]
        color = None
        for name, style in zip(BACKENDS, ("s--", "o-", "^-.", "d:")):
            if name not in backends_in(doc, network):
                continue
            line, = times.plot(sizes, [1e3 * s["methods"][name]["time"]["median"] for s in summ], style, color=color,
                               label=f"{name}, {network}")
            color = line.get_color()
            if name != "gloo":
                med = [s["ratios"][name]["median"] for s in summ]
                err = [[m - s["ratios"][name]["min"] for m, s in zip(med, summ)],
                       [s["ratios"][name]["max"] - m for m, s in zip(med, summ)]]
                ratios.errorbar(sizes, med, yerr=err, fmt=style, color=color, capsize=2, label=f"{name}, {network}")
        if cells and cells[0][1]["bound"]:
            times.plot(sizes, [1e3 * info["bound"] for _, info in cells], ":", color="gray",
                       label=f"ring link bound, {network}")
    times.set(xscale="log", yscale="log", xlabel="all-reduce size (bytes)",
              ylabel="time (ms, slowest rank, median of trials)")
    ratios.axhline(1.0, color="gray", linewidth=1)
    ratios.set(xscale="log", xlabel="all-reduce size (bytes)",
               ylabel="time / gloo's (per-trial ratios: median, min-max)")
    times.legend(fontsize=8)
    ratios.legend(fontsize=8)
    fig.suptitle(title(doc["args"]))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    common.add_cluster_arguments(p, hosts=4, network="none,1gbit", sweep_networks=True)
    p.add_argument("--min-bytes", type=int, default=4096)
    p.add_argument("--max-bytes", type=int, default=256 << 20)
    p.add_argument("--plot", metavar="PNG", help="also write a plot of the tables (time and ratio per size) here")
    p.add_argument("--iterations", type=int, help="timed iterations per size and backend in each trial (default: 10 up "
                   "to 16 MB, 3 up to 64 MB, then 1)")
    p.add_argument("--data", choices=("gradients", "constant"), default="gradients",
                   help="what the tensors hold (see the module's doc; packing's gain depends on it)")
    p.add_argument("--quantiles", action="store_true",
                   help="also print the per-iteration distribution of the slowest rank's time")
    harness.add_arguments(p)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    common.resolve_cluster_arguments(args, "allreduce_backends")
    run = harness.Run("allreduce_backends", args, BACKENDS, "gloo", "time")
    for network in args.networks:
        try:
            with common.make_cluster(args.hosts, args.ranks_per_host, network) as cluster:
                docs = common.run_ranks(cluster, os.path.abspath(__file__),
                                        ["--min-bytes", str(args.min_bytes), "--max-bytes", str(args.max_bytes),
                                         "--data", args.data, "--trials", str(args.trials),
                                         "--ranks-per-host", str(args.ranks_per_host)]
                                        + (["--iterations", str(args.iterations)] if args.iterations else []),
                                        timeout=3600)
        except common.NamespacesUnavailable as e:
            common.fail(f"allreduce_backends: emulated network not available: {e}")
        record(run, docs, network, args.ranks, common.link_bytes_per_second(network))
        print(f"network {network}: done", flush=True)
    doc = run.finish(report)
    if args.plot:
        plot(doc, args.plot)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
