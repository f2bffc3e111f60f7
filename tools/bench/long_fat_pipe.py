#!/usr/bin/env python3
"""Filling a long fat pipe: gossipcc with GOSSIPCC_STREAMS_PER_PEER = k (TCP connections per
pair of ranks, comm/gloo/striping.h) against gloo (ProcessGroupGloo: one connection per pair) on
emulated hosts with a long link (default 4 hosts, 1 Gbit/s, 50 ms one-way delay, the hosts'
stock TCP settings), in the same processes.

    tools/bench/run.sh long_fat_pipe [--hosts 4 | --ranks 4] [--network rate=1gbit,delay=50ms]
        [--streams 1,2,4,8] [--bytes 268435456] [--gossip-bytes 67108864] [--compressed-streams 1,4]
        [--ops allreduce,push_sum,quantized,powersgd] [--trials 5]

Methods, each on its own process group (one per k, created with GOSSIPCC_STREAMS_PER_PEER=k):
an exact float32 all-reduce of --bytes (gloo, and gossipcc at each k of --streams); one push-sum
round of --gossip-bytes (graph exponential:peers=1, one peer per round; each k of --streams);
the 8-bit quantized all-reduce and a PowerSGD all-reduce (rank 2, the --bytes tensor as a
square-ish matrix) of --bytes at each k of --compressed-streams. Trials: each trial runs every
method once, in an order that rotates from trial to trial (tools/bench/harness.py's
trial_order), each op between two barriers; a sample is the slowest rank's time; a cell is the
median over the trials with its min-max. Checks: every gossipcc all-reduce returns the bits of
k = 1 (the first trial's), and gloo's agrees to float32 rounding.

Bounds (the link's rate R, one-way delay d, n hosts): all-reduce 2(n-1)/n x bytes / R +
2(n-1) d (a ring's traffic per host and its steps' latencies); push-sum round bytes / R + 2d
(one message and a round trip: the receiver's announcement, then the payload).
"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import harness  # noqa: E402
import wan_link  # noqa: E402  (tools/, on the path through common)

GRAPH = "exponential:peers=1"


def method_names(args):
    names = []
    if "allreduce" in args.ops:
        names += ["gloo allreduce"] + [f"allreduce k={k}" for k in args.streams]
    if "push_sum" in args.ops:
        names += [f"push-sum k={k}" for k in args.streams]
    if "quantized" in args.ops:
        names += [f"quantized8 k={k}" for k in args.compressed_streams]
    if "powersgd" in args.ops:
        names += [f"powersgd k={k}" for k in args.compressed_streams]
    return names


def matrix_shape(count):
    rows = 1 << ((count.bit_length() - 1) // 2)
    return [rows, count // rows]


def worker(args):
    import datetime
    import torch
    import torch.distributed as dist
    import gossipcc
    from gossipcc import _C
    torch.set_num_threads(1)
    rank, n = common.worker_env()
    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=900))
    gloo = dist.new_group(backend="gloo")
    groups = {}
    if args.p2p_segment_bytes:
        os.environ["GOSSIPCC_P2P_SEGMENT_BYTES"] = str(args.p2p_segment_bytes)
    for k in sorted(set(args.streams) | set(args.compressed_streams)):
        os.environ["GOSSIPCC_STREAMS_PER_PEER"] = str(k)  # read when the group is created
        groups[k] = dist.new_group(backend="gossipcc")
    del os.environ["GOSSIPCC_STREAMS_PER_PEER"]
    count = args.bytes // 4
    t = torch.empty(count, dtype=torch.float32)
    gen = torch.Generator().manual_seed(rank + 1)
    source = torch.randn(count, generator=gen)
    x = torch.empty(args.gossip_bytes // 4, dtype=torch.float32)
    w = torch.ones(1, dtype=torch.float64)
    steps = {}
    powersgd = {k: _C.PowerSGD("rank=2,start_iter=0") for k in args.compressed_streams}
    shape = matrix_shape(count)
    reference = {}

    def run(name):
        kind, _, k = name.rpartition(" k=")
        if name == "gloo allreduce":
            dist.all_reduce(t, group=gloo)
            return
        k = int(k)
        backend = gossipcc.get_backend_object(groups[k])
        if kind == "allreduce":
            dist.all_reduce(t, group=groups[k])
        elif kind == "push-sum":
            step = steps.get(k, 0)
            backend.push_sum_round([x], w, step, GRAPH).wait()
            steps[k] = step + 1
        elif kind == "quantized8":
            backend.quantized_allreduce([t], 8, True).wait()
        else:
            backend.powersgd_allreduce([t], [shape], powersgd[k], ["t"]).wait()

    def one(name):
        t.copy_(source)
        x.fill_(rank + 1)
        w.fill_(1.0)
        measured = common.timed(lambda: run(name), dist.barrier)
        if name.startswith("allreduce") or name.startswith("gloo"):
            if "k=1" in name or name.startswith("gloo"):
                reference.setdefault(name, t.clone())
            check(name, t, reference)
        return measured

    names = method_names(args)
    for name in names:  # warm-up, not timed; its results are checked
        one(name)
    trials = common.run_trials(dist.barrier, names, args.trials, 1, one)
    dist.barrier()
    dist.destroy_process_group()
    with open(args.out, "w") as f:
        json.dump({"trials": trials}, f)


def check(name, t, reference):
    """gossipcc's all-reduce gives k = 1's bits at every k; gloo's agrees to float32 rounding."""
    import torch
    plain = reference.get("allreduce k=1")
    if plain is None:
        return
    if name.startswith("allreduce") and not torch.equal(t.view(torch.int32), plain.view(torch.int32)):
        bad = (t.view(torch.int32) != plain.view(torch.int32)).nonzero()[0].item()
        raise AssertionError(f"{name}: element {bad} is {t[bad].item()}, k=1 gave {plain[bad].item()}")
    if name.startswith("gloo") and not torch.allclose(t, plain, rtol=1e-4, atol=1e-4):
        raise AssertionError(f"gloo all-reduce differs from gossipcc's beyond rounding")


def bound(name, args, bps, delay):
    n = args.ranks
    if name.endswith("allreduce") or name.startswith("allreduce"):
        return 2 * (n - 1) / n * args.bytes / bps + 2 * (n - 1) * delay
    if name.startswith("push-sum"):
        return args.gossip_bytes / bps + 2 * delay
    return None


def uptime():
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def report(args, docs, before, after):
    names = method_names(args)
    link = common.emulated_cluster.parse_link(args.network) if args.network != "local" else None
    bps = common.link_bytes_per_second(args.network)
    delay = wan_link.seconds(link.delay) if link and link.delay else 0.0
    per_trial = [common.slowest_samples(docs, i, names) for i in range(args.trials)]
    body = []
    gloo = [s["gloo allreduce"]["time"] for s in per_trial] if "gloo allreduce" in names else None
    for name in names:
        times = [s[name]["time"] for s in per_trial]
        cell = {"median": common.median(times), "min": min(times), "max": max(times), "n": len(times)}
        b = bound(name, args, bps, delay) if bps else None
        vs_gloo = (common.median([g / tt for g, tt in zip(gloo, times)])
                   if gloo and name.startswith("allreduce") else None)
        sent = common.median([s[name]["sent"] for s in per_trial if s[name]["sent"]] or [0])
        payload = args.gossip_bytes if name.startswith("push-sum") else args.bytes
        body.append([name, harness.cell_text(cell, 1, 2), f"{b:.2f}" if b else "-",
                     f"{cell['median'] / b:.2f}" if b else "-", f"{vs_gloo:.2f}" if vs_gloo else "-",
                     f"{sent / payload:.3f}" if sent else "-"])
    head = ["method", "time (s): median (min-max)", "bound (s)", "time / bound", "gloo / time (per-trial median)",
            "sent/rank ÷ size"]
    return "\n".join([
        f"long fat pipe: {args.ranks} hosts, network {args.network}, all-reduce {common.human_bytes(args.bytes)}, "
        f"push-sum {common.human_bytes(args.gossip_bytes)}, {args.trials} trials"
        + (f", GOSSIPCC_P2P_SEGMENT_BYTES={args.p2p_segment_bytes}" if args.p2p_segment_bytes else ""),
        f"uptime before: {before}", f"uptime after:  {after}", "", harness.markdown_table(head, body)])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    common.add_cluster_arguments(p, hosts=4, network="rate=1gbit,delay=50ms")
    p.add_argument("--streams", default="1,2,4,8", help="k of the exact all-reduce and the push-sum round")
    p.add_argument("--compressed-streams", default="1,4", help="k of the quantized and PowerSGD all-reduces")
    p.add_argument("--bytes", type=int, default=256 << 20, help="all-reduce size (float32)")
    p.add_argument("--gossip-bytes", type=int, default=64 << 20, help="push-sum round size (float32)")
    p.add_argument("--ops", default="allreduce,push_sum,quantized,powersgd")
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--p2p-segment-bytes", type=int, default=0,
                   help="GOSSIPCC_P2P_SEGMENT_BYTES of the gossipcc groups (0: the default)")
    args = p.parse_args()
    args.streams = [int(s) for s in str(args.streams).split(",") if s]
    args.compressed_streams = [int(s) for s in str(args.compressed_streams).split(",") if s]
    args.ops = str(args.ops).split(",")
    if args.worker:
        return worker(args)
    common.resolve_cluster_arguments(args, "long_fat_pipe")
    args.network = args.networks[0]
    before = uptime()
    flags = ["--streams", ",".join(map(str, args.streams)),
             "--compressed-streams", ",".join(map(str, args.compressed_streams)),
             "--bytes", str(args.bytes), "--gossip-bytes", str(args.gossip_bytes), "--ops", ",".join(args.ops),
             "--trials", str(args.trials), "--p2p-segment-bytes", str(args.p2p_segment_bytes)]
    try:
        with common.make_cluster(args.hosts, args.ranks_per_host, args.network) as cluster:
            docs = common.run_ranks(cluster, os.path.abspath(__file__), flags, timeout=3600)
    except common.NamespacesUnavailable as e:
        common.fail(f"long_fat_pipe: emulated network not available: {e}")
    print(report(args, docs, before, uptime()))


if __name__ == "__main__":
    main()
