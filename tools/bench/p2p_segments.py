#!/usr/bin/env python3
"""Diagnostic for benchmark (c): two ranks exchange one message each way at once (what a
gossip round does) through c10d gloo's isend/irecv, whole or cut into segments, at 1 Gbit/s.
Shows whether Gloo overlaps the two directions of one large message.

    tools/bench/run.sh p2p_segments [--bytes 16777216] [--segments 16777216,1048576,262144]
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def worker(args):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    rank, _ = common.worker_env()
    dist.init_process_group("gloo", init_method="env://")
    group = None
    if args.backend == "gossipcc":
        import gossipcc  # noqa: F401  (registers the backend)
        group = dist.new_group(backend="gossipcc")
    peer = 1 - rank
    x = torch.full((args.bytes // 4,), float(rank + 1))
    y = torch.empty(args.bytes // 4)
    out = {}
    for seg in [int(s) for s in args.segments.split(",")]:
        n = seg // 4
        times = []
        for it in range(args.iters + 1):
            dist.barrier()
            t = time.perf_counter()
            works = []
            for off in range(0, x.numel(), n):
                works.append(dist.isend(x[off:off + n], peer, group=group))
                works.append(dist.irecv(y[off:off + n], peer, group=group))
            for w in works:
                w.wait()
            if it > 0:
                times.append(time.perf_counter() - t)
            if y[0].item() != peer + 1 or y[-1].item() != peer + 1:
                raise AssertionError("wrong data received")
        out[seg] = times
    dist.barrier()
    dist.destroy_process_group()
    with open(args.out, "w") as f:
        json.dump(out, f)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--bytes", type=int, default=16 << 20)
    p.add_argument("--segments", default=f"{16 << 20},{1 << 20},{256 << 10}")
    p.add_argument("--network", default="1gbit")
    p.add_argument("--iters", type=int, default=4)
    p.add_argument("--backend", default="gloo", choices=["gloo", "gossipcc"],
                   help="whose isend/irecv (gossipcc cuts messages itself: GOSSIPCC_P2P_SEGMENT_BYTES)")
    args = p.parse_args()
    if args.worker:
        return worker(args)
    import emulated_cluster
    bps = emulated_cluster.rate_bits_per_second(emulated_cluster.parse_network(args.network)[0]) / 8
    load0 = common.load_average()
    with common.make_cluster(2, args.network) as cluster:
        docs = common.run_ranks(cluster, os.path.abspath(__file__),
                                ["--bytes", str(args.bytes), "--segments", args.segments, "--iters", str(args.iters),
                                 "--backend", args.backend])
    msg = args.bytes / bps
    rows = []
    for seg in args.segments.split(","):
        t = common.median([max(d[seg][j] for d in docs) for j in range(args.iters)])
        rows.append([common.human_bytes(int(seg)), f"{1e3 * t:.1f}", f"{t / msg:.2f}"])
    seg_env = os.environ.get("GOSSIPCC_P2P_SEGMENT_BYTES", "default")
    backend = args.backend if args.backend == "gloo" else f"gossipcc (GOSSIPCC_P2P_SEGMENT_BYTES={seg_env})"
    print(f"{backend}: 2 ranks, {common.human_bytes(args.bytes)} each way at once, network {args.network}, one message time "
          f"{1e3 * msg:.1f} ms, load average {load0} -> {common.load_average()}\n")
    print(common.markdown_table(["segment", "exchange (ms)", "/ message time"], rows))


if __name__ == "__main__":
    main()
