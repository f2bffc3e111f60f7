#!/usr/bin/env python3
"""Benchmark (c): one gossip round (push-sum, one peer per round, exponential graph: what SGP
does each step) vs an exact all-reduce of the same tensor, at n = 2, 4, 8 ranks, each rank its
own host with a 1 Gbit/s link; compared with one message time, bytes / rate.

    tools/bench/run.sh gossip_vs_allreduce [--sizes-n 2,4,8] [--network 1gbit] [--bytes 16777216]

Per n, in the same processes and on the same tensor: gossipcc's push_sum_round on the process
group, all-reduce through backend gossipcc and through gloo, alternating iteration by
iteration, each op preceded by an untimed barrier; a cell is the median over --iters of the
slowest rank's time. Bytes: NIC tx counters per rank per op (until after the next barrier).
A push-sum round must send every rank's share to its peer and receive one: its floor is one
message time, flat in n; a ring all-reduce's is 2(n-1)/n message times.
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

OPS = ("push-sum round", "all-reduce gossipcc", "all-reduce gloo")


def worker(args):
    import datetime
    import torch
    import torch.distributed as dist
    import gossipcc
    torch.set_num_threads(1)
    rank, n = common.worker_env()
    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=300))
    gloo = dist.new_group(backend="gloo")
    gcc = dist.new_group(backend="gossipcc")
    backend = gossipcc.get_backend_object(gcc)
    x = torch.empty(args.bytes // 4, dtype=torch.float32)
    w = torch.ones(1, dtype=torch.float64)
    times = {op: [] for op in OPS}
    sent = {op: 0 for op in OPS}
    step = 0
    for i in range(-1, args.iters):  # -1: warm-up
        order = OPS if i % 2 == 0 else OPS[::-1]
        for op in order:
            x.fill_(rank + 1)
            w.fill_(1.0)
            dist.barrier()
            c0 = common.rank_tx_bytes()
            t0 = time.perf_counter()
            if op == "push-sum round":
                backend.push_sum_round([x], w, step, args.graph).wait()
                step += 1
            elif op == "all-reduce gossipcc":
                dist.all_reduce(x, group=gcc)
            else:
                dist.all_reduce(x, group=gloo)
            dt = time.perf_counter() - t0
            dist.barrier()
            c1 = common.rank_tx_bytes()
            if op != "push-sum round" and x[0].item() != n * (n + 1) / 2:
                raise AssertionError(f"{op}: got {x[0].item()}, expected {n * (n + 1) / 2}")
            if i >= 0:
                times[op].append(dt)
                if c0 is not None:
                    sent[op] += c1 - c0
    # Push-sum conserves sum(x) and sum(w): check one more round.
    x.fill_(rank + 1)
    w.fill_(1.0)
    backend.push_sum_round([x], w, step, args.graph).wait()
    check = torch.tensor([x[0].item(), w.item()], dtype=torch.float64)
    dist.all_reduce(check, group=gloo)
    if abs(check[0].item() - n * (n + 1) / 2) > 1e-3 or abs(check[1].item() - n) > 1e-9:
        raise AssertionError(f"push-sum round did not conserve mass: sum x {check[0].item()}, sum w {check[1].item()}")
    dist.barrier()
    dist.destroy_process_group()
    with open(args.out, "w") as f:
        json.dump({"times": times, "tx_per_op": {op: sent[op] / args.iters for op in OPS}}, f)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--sizes-n", default="2,4,8", help="world sizes")
    p.add_argument("--network", default="1gbit")
    p.add_argument("--bytes", type=int, default=16 << 20, help="tensor size")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--graph", default="exponential:peers=1")
    args = p.parse_args()
    if args.worker:
        return worker(args)
    import emulated_cluster
    rate, _ = emulated_cluster.parse_network(args.network) if args.network != "local" else (None, None)
    bps = emulated_cluster.rate_bits_per_second(rate) / 8 if rate else None
    msg = args.bytes / bps if bps else None
    print(f"gossip round (push_sum_round, graph {args.graph}) vs exact all-reduce, {common.human_bytes(args.bytes)} "
          f"float32, network {args.network}" + (f", one message time {1e3 * msg:.1f} ms" if msg else ""))
    rows = []
    for n in [int(v) for v in args.sizes_n.split(",")]:
        load0 = common.load_average()
        try:
            with common.make_cluster(n, args.network) as cluster:
                docs = common.run_ranks(cluster, os.path.abspath(__file__),
                                        ["--bytes", str(args.bytes), "--iters", str(args.iters), "--graph", args.graph],
                                        timeout=900)
        except common.NamespacesUnavailable as e:
            common.fail(f"gossip_vs_allreduce: emulated network not available: {e}")
        med = {op: common.median([max(d["times"][op][j] for d in docs) for j in range(args.iters)]) for op in OPS}
        tx = {op: sum(d["tx_per_op"][op] for d in docs) / len(docs) for op in OPS}
        g, a, b = med["push-sum round"], med["all-reduce gossipcc"], med["all-reduce gloo"]
        row = [n, f"{1e3 * g:.1f}"]
        row += [f"{g / msg:.2f}"] if msg else ["-"]
        row += [f"{1e3 * a:.1f}", f"{1e3 * b:.1f}", f"{a / g:.2f}", f"{b / g:.2f}"]
        row += [f"{2 * (n - 1) / n * args.bytes / bps / g:.2f}" if msg else "-"]
        row += [f"{tx[op] / args.bytes:.3f}" if docs[0]["tx_per_op"][op] else "-" for op in OPS]
        row += [f"{load0} -> {common.load_average()}"]
        rows.append(row)
        print(f"  n = {n}: round {1e3 * g:.1f} ms, all-reduce gossipcc {1e3 * a:.1f} ms, gloo {1e3 * b:.1f} ms", flush=True)
    print()
    print(common.markdown_table(
        ["n", "push-sum round (ms)", "round / message time", "all-reduce gossipcc (ms)", "all-reduce gloo (ms)",
         "gossipcc all-reduce / round", "gloo all-reduce / round", "ring bound / round",
         "sent/rank ÷ size: round", "all-reduce gossipcc", "all-reduce gloo", "load average"], rows))


if __name__ == "__main__":
    main()
