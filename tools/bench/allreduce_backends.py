#!/usr/bin/env python3
"""Benchmark (a): exact all-reduce through backend="gossipcc" vs backend="gloo" (c10d's
ProcessGroupGloo), same processes and tensors, N ranks (default 4), 4 KB .. 256 MB, on an
unshaped emulated network and at 1 Gbit/s per host; and gossipcc with its lossless packing
(GOSSIPCC_LOSSLESS_FLOAT32_ALLREDUCE=1, "gossipcc packed").

    tools/bench/run.sh allreduce_backends [--ranks 4] [--networks none,1gbit] [--max-bytes 268435456] [--plot PNG]
                                          [--iterations K] [--quantiles] [--data gradients|constant]

Every rank is its own host (tools/emulated_cluster.py). Per size, the two backends alternate
iteration by iteration (which goes first alternates too), each op preceded by an untimed
barrier; a cell is the median over iterations of the slowest rank's time. Bytes are the ranks'
NIC tx counters (frames with headers, TCP ACKs included) from just before the op to after the
barrier that follows it (so the op's last queued segments count; the barrier adds a few
hundred bytes), averaged over ranks. Link bound: the
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
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def iterations(nbytes, override=None):
    if override:
        return override
    # 1-16 MB unshaped vary most from op to op (CPU-bound veths): at 5-10 iterations a median
    # moved by 20% between runs, at 30 by a few percent.
    return 30 if nbytes <= (16 << 20) else 10 if nbytes <= (64 << 20) else 3


BACKENDS = ("gloo", "gossipcc", "gossipcc packed")


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
    groups = {"gloo": dist.new_group(backend="gloo"), "gossipcc": dist.new_group(backend="gossipcc")}
    os.environ["GOSSIPCC_LOSSLESS_FLOAT32_ALLREDUCE"] = "1"  # read when the group is created
    groups["gossipcc packed"] = dist.new_group(backend="gossipcc")
    del os.environ["GOSSIPCC_LOSSLESS_FLOAT32_ALLREDUCE"]
    expected = n * (n + 1) / 2
    sizes = []
    nbytes = args.min_bytes
    while nbytes <= args.max_bytes:
        sizes.append(nbytes)
        nbytes *= 4
    source = gradient_source(rank, n, sizes[-1]) if args.data == "gradients" else None
    out = []
    for nbytes in sizes:
        t = torch.empty(nbytes // 4, dtype=torch.float32)
        k = iterations(nbytes, args.iterations)
        times = {name: [] for name in groups}
        sent = {name: 0 for name in groups}
        results = {}
        for i in range(-1, k):  # i = -1: warm-up, not recorded
            # Each backend goes first, second and last in turn.
            order = list(groups)[i % 3:] + list(groups)[:i % 3]
            for name in order:
                if source is None:
                    t.fill_(rank + 1)
                else:
                    t.copy_(source[:t.numel()])
                dist.barrier()
                c0 = common.rank_tx_bytes()
                t0 = time.perf_counter()
                dist.all_reduce(t, group=groups[name])
                dt = time.perf_counter() - t0
                dist.barrier()  # the op's last segments may still sit in the rank's queue
                c1 = common.rank_tx_bytes()
                if source is None and (t[0].item() != expected or t[-1].item() != expected):
                    raise AssertionError(f"{name} all-reduce of {nbytes} bytes: got {t[0].item()}, "
                                         f"{t[-1].item()}, expected {expected}")
                if i == -1:
                    results[name] = t.clone()
                if i >= 0:
                    times[name].append(dt)
                    if c0 is not None:
                        sent[name] += c1 - c0
        check_results(results, nbytes)
        del results
        out.append({"bytes": nbytes, "k": k, "times": times,
                    "tx_per_op": {name: sent[name] / k for name in groups}})
        del t
    dist.barrier()
    dist.destroy_process_group()
    with open(args.out, "w") as f:
        json.dump(out, f)


def check_results(results, nbytes):
    """The packed ring returns the plain one's bits; gloo sums in another order."""
    import torch
    plain, packed, gloo = results["gossipcc"], results["gossipcc packed"], results["gloo"]
    if not torch.equal(plain.view(torch.int32), packed.view(torch.int32)):
        bad = (plain.view(torch.int32) != packed.view(torch.int32)).nonzero()[0].item()
        raise AssertionError(f"packed all-reduce of {nbytes} bytes differs from the plain one at element {bad}: "
                             f"{packed[bad].item()} vs {plain[bad].item()}")
    if not torch.allclose(plain, gloo, rtol=1e-5, atol=1e-6 * max(1.0, gloo.abs().max().item())):
        bad = (plain - gloo).abs().argmax().item()
        raise AssertionError(f"gossipcc and gloo all-reduces of {nbytes} bytes differ at element {bad}: "
                             f"{plain[bad].item()} vs {gloo[bad].item()}")


def link_bytes_per_second(network):
    """The preset's per-host rate in bytes/s, or None (unshaped, loopback)."""
    import emulated_cluster
    rate, _ = emulated_cluster.parse_network(network) if network != "local" else (None, None)
    return emulated_cluster.rate_bits_per_second(rate) / 8 if rate else None


def backends_of(rows):
    """The backends the rows have times for, in BACKENDS' order."""
    return [name for name in BACKENDS if rows and name in rows[0]]


def summarize(docs, n, bps):
    """Per size: the median over iterations of the slowest rank's time per backend (s), the
    ring's link bound (s; None when unshaped) and the tx bytes per op averaged over ranks."""
    rows = []
    for i, entry in enumerate(docs[0]):
        nbytes, k = entry["bytes"], entry["k"]
        row = {"bytes": nbytes, "k": k, "bound": 2 * (n - 1) / n * nbytes / bps if bps else None}
        for name in (b for b in BACKENDS if b in entry["times"]):
            row["slowest_" + name] = [max(doc[i]["times"][name][j] for doc in docs) for j in range(k)]
            row[name] = common.median(row["slowest_" + name])
            row["tx_" + name] = sum(doc[i]["tx_per_op"][name] for doc in docs) / len(docs)
        rows.append(row)
    return rows


def table(rows, network):
    names = backends_of(rows)
    others = [b for b in names if b != "gloo"]
    body = []
    for r in rows:
        nbytes = r["bytes"]
        row = [common.human_bytes(nbytes), r["k"]] + [f"{1e3 * r[b]:.2f}" for b in names]
        row += [f"{r[b] / r['gloo']:.2f}" for b in others]
        if r["bound"]:
            row += [f"{1e3 * r['bound']:.2f}"] + [f"{r[b] / r['bound']:.2f}" for b in names]
        row += [f"{r['tx_' + b] / nbytes:.3f}" if network != "local" else "-" for b in names]
        body.append(row)
    header = ["size", "k"] + [f"{b} (ms)" for b in names] + [f"ratio {b}/gloo" for b in others]
    if rows and rows[0]["bound"]:
        header += ["link bound (ms)"] + [f"{b}/bound" for b in names]
    header += [f"sent/rank/op ÷ size, {b}" for b in names]
    return common.markdown_table(header, body)


QUANTILES = (("p10", 2), ("p25", 5), ("median", 10), ("p75", 15), ("p90", 18))  # 5% cut points


def quantile_table(rows):
    """Per size and backend: quantiles (linear interpolation between the sorted times) and the
    mean of the slowest rank's time per iteration, in ms."""
    body = []
    for r in rows:
        for name in backends_of(rows):
            xs = r["slowest_" + name]
            cuts = statistics.quantiles(xs, n=20, method="inclusive") if len(xs) > 1 else [xs[0]] * 19
            body.append([common.human_bytes(r["bytes"]), name, len(xs)]
                        + [f"{1e3 * cuts[i - 1]:.2f}" for _, i in QUANTILES]
                        + [f"{1e3 * statistics.mean(xs):.2f}"])
    return common.markdown_table(["size", "backend", "k"] + [q for q, _ in QUANTILES] + ["mean"], body)


def plot(results, path, title):
    """results: {network: summarize() rows}. Left: each backend's time per size (and the link
    bound where shaped), log-log; right: each gossipcc variant's time over gloo's per size,
    1.0 marked."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (times, ratios) = plt.subplots(1, 2, figsize=(12, 4.5))
    for network, rows in results.items():
        sizes = [r["bytes"] for r in rows]
        line, = times.plot(sizes, [1e3 * r["gossipcc"] for r in rows], "o-", label=f"gossipcc, {network}")
        times.plot(sizes, [1e3 * r["gloo"] for r in rows], "s--", color=line.get_color(), label=f"gloo, {network}")
        ratios.plot(sizes, [r["gossipcc"] / r["gloo"] for r in rows], "o-", color=line.get_color(),
                    label=f"gossipcc, {network}")
        if "gossipcc packed" in backends_of(rows):
            times.plot(sizes, [1e3 * r["gossipcc packed"] for r in rows], "^-.", color=line.get_color(),
                       label=f"gossipcc packed, {network}")
            ratios.plot(sizes, [r["gossipcc packed"] / r["gloo"] for r in rows], "^-.", color=line.get_color(),
                        label=f"gossipcc packed, {network}")
        if rows and rows[0]["bound"]:
            times.plot(sizes, [1e3 * r["bound"] for r in rows], ":", color="gray", label=f"ring link bound, {network}")
    times.set(xscale="log", yscale="log", xlabel="all-reduce size (bytes)", ylabel="time (ms, slowest rank, median)")
    ratios.axhline(1.0, color="gray", linewidth=1)
    ratios.set(xscale="log", xlabel="all-reduce size (bytes)", ylabel="time / gloo's time (below 1: faster)")
    times.legend(fontsize=8)
    ratios.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--networks", default="none,1gbit", help="comma list of emulated_cluster presets (or local)")
    p.add_argument("--min-bytes", type=int, default=4096)
    p.add_argument("--max-bytes", type=int, default=256 << 20)
    p.add_argument("--plot", metavar="PNG", help="also write a plot of the tables (time and ratio per size) here")
    p.add_argument("--iterations", type=int, help="timed iterations per size and backend (default: 30 up to 16 MB, "
                   "10 up to 64 MB, then 3)")
    p.add_argument("--data", choices=("gradients", "constant"), default="gradients",
                   help="what the tensors hold (see the module's doc; packing's gain depends on it)")
    p.add_argument("--quantiles", action="store_true",
                   help="also print the per-iteration distribution of the slowest rank's time")
    args = p.parse_args()
    if args.worker:
        return worker(args)
    title = (f"all-reduce, backend gossipcc (plain and packed) vs gloo, {args.ranks} ranks, "
             f"{common.human_bytes(args.min_bytes)}..{common.human_bytes(args.max_bytes)}, float32 {args.data}")
    print(title)
    results = {}
    for network in args.networks.split(","):
        load0 = common.load_average()
        try:
            with common.make_cluster(args.ranks, network) as cluster:
                docs = common.run_ranks(cluster, os.path.abspath(__file__),
                                        ["--min-bytes", str(args.min_bytes), "--max-bytes", str(args.max_bytes),
                                         "--data", args.data]
                                        + (["--iterations", str(args.iterations)] if args.iterations else []),
                                        timeout=1200)
        except common.NamespacesUnavailable as e:
            common.fail(f"allreduce_backends: emulated network not available: {e}")
        print(f"\nnetwork {network} (load average before {load0}, after {common.load_average()}):\n")
        results[network] = summarize(docs, args.ranks, link_bytes_per_second(network))
        print(table(results[network], network), flush=True)
        if args.quantiles:
            print(f"\nper-iteration distribution, network {network} (ms, slowest rank per iteration):\n")
            print(quantile_table(results[network]), flush=True)
    if args.plot:
        plot(results, args.plot, title)
        print(f"\nplot: {args.plot}")


if __name__ == "__main__":
    main()
