#!/usr/bin/env python3
"""Benchmark (f): the quantized all-reduce (8 and 4 bits, comm/quantized_allreduce.h) vs the exact
float32 all-reduce, through backend="gossipcc" and, side by side, through a gloo group on the same
ranks (dist.new_group(backend="gloo")), N ranks (default 4) each on its own emulated host, 16 MB
of float32 at 100 Mbit/s per host.

    tools/bench/run.sh quantized_allreduce [--ranks 4] [--network 100mbit] [--bytes 16777216] [--iterations 5]

Per iteration the four variants run in rotating order (each in every position in turn),
each preceded by an untimed barrier; a cell is the median over iterations of the slowest rank's
time (ProcessGroupGossipcc.quantized_allreduce(...).wait() against dist.all_reduce, both averaging:
the exact one divides by n after its sum, as DiLoCo's exact transport does). Data: each rank's
tensor is standard normal draws (its own seed). Bytes: the ranks' NIC tx counters (frames with
headers, TCP ACKs included), from just before the op to after the barrier that follows it, per
rank. Error: the largest |quantized - exact average| over the tensor, over the largest |exact
average| (the exact average computed in float64 from every rank's tensor, which each rank
regenerates from the seeds). Every variant's result must be bitwise the same on every rank (a hash
per rank; the table is refused otherwise). The goal (issue 35): at least 3.5x (8 bits) and 6x
(4 bits) less time than the exact all-reduce ("speed-up vs exact": gossipcc's; "vs gloo":
ProcessGroupGloo's).
"""
import argparse
import hashlib
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

VARIANTS = ("exact float32", "exact float32 (gloo)", "quantized 8 bits", "quantized 4 bits")


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
    dist.init_process_group("gossipcc", init_method="env://", timeout=datetime.timedelta(seconds=600))
    pg = gossipcc.get_backend_object()
    gloo = dist.new_group(backend="gloo")  # the alternative a PyTorch user has, on the same hosts
    count = args.bytes // 4
    source = data(rank, count)
    t = torch.empty(count, dtype=torch.float32)

    def run(name):
        if name.startswith("exact float32"):
            dist.all_reduce(t, group=gloo if "gloo" in name else None)
            t.div_(n)
        else:
            pg.quantized_allreduce([t], 8 if "8" in name else 4, True).wait()

    times = {v: [] for v in VARIANTS}
    sent = {v: [] for v in VARIANTS}
    results = {}
    for i in range(-1, args.iterations):  # -1: warm-up, not recorded
        k = i % len(VARIANTS)
        order = list(VARIANTS)[k:] + list(VARIANTS)[:k]
        for name in order:
            t.copy_(source)
            dist.barrier()
            c0 = common.rank_tx_bytes()
            t0 = time.perf_counter()
            run(name)
            dt = time.perf_counter() - t0
            dist.barrier()
            c1 = common.rank_tx_bytes()
            if i == -1:
                results[name] = t.clone()
            else:
                times[name].append(dt)
                if c0 is not None:
                    sent[name].append(c1 - c0)
    # Accuracy, against the exact average in float64.
    exact = torch.zeros(count, dtype=torch.float64)
    for r in range(n):
        exact += data(r, count).double()
    exact /= n
    scale = exact.abs().max().item()
    error = {name: (results[name].double() - exact).abs().max().item() / scale for name in VARIANTS}
    # Every rank must hold the same bits (the exact all-reduce's too: every gossipcc all-reduce path
    # gives every rank the same bits).
    digest = {name: hashlib.sha256(results[name].numpy().tobytes()).hexdigest() for name in VARIANTS}
    dist.barrier()
    dist.destroy_process_group()
    with open(args.out, "w") as f:
        json.dump({"times": times, "sent": sent, "error": error, "digest": digest}, f)


def summarize(docs):
    rows = []
    k = len(docs[0]["times"][VARIANTS[0]])
    slowest = {v: [max(d["times"][v][i] for d in docs) for i in range(k)] for v in VARIANTS}
    med = {v: common.median(slowest[v]) for v in VARIANTS}
    for v in VARIANTS:
        if len({d["digest"][v] for d in docs}) != 1:
            raise AssertionError(f"{v}: ranks hold different results")
        sent = [sum(d["sent"][v]) / len(d["sent"][v]) for d in docs if d["sent"][v]]
        rows.append([v, f"{1e3 * med[v]:.0f}", f"{1e3 * min(slowest[v]):.0f}-{1e3 * max(slowest[v]):.0f}",
                     f"{med['exact float32'] / med[v]:.2f}x",
                     f"{med['exact float32 (gloo)'] / med[v]:.2f}x",
                     f"{sum(sent) / len(sent) / 1e6:.2f}" if sent else "-",
                     f"{max(d['error'][v] for d in docs):.2e}"])
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--network", default="100mbit", help="an emulated_cluster preset (or local)")
    p.add_argument("--bytes", type=int, default=16 << 20)
    p.add_argument("--iterations", type=int, default=5)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    print(f"quantized vs exact float32 all-reduce (average), backend gossipcc, {args.ranks} ranks, "
          f"{common.human_bytes(args.bytes)} float32 normal draws, network {args.network}, "
          f"median of {args.iterations} (slowest rank)")
    load0 = common.load_average()
    try:
        with common.make_cluster(args.ranks, args.network) as cluster:
            docs = common.run_ranks(cluster, os.path.abspath(__file__),
                                    ["--bytes", str(args.bytes), "--iterations", str(args.iterations)], timeout=1800)
    except common.NamespacesUnavailable as e:
        common.fail(f"quantized_allreduce: emulated network not available: {e}")
    print(f"load average before {load0}, after {common.load_average()}\n")
    print(common.markdown_table(["variant", "time (ms, median)", "range (ms)", "speed-up vs exact", "vs gloo",
                                 "MB sent/rank/op", "max error / max |average|"], summarize(docs)))


if __name__ == "__main__":
    main()
