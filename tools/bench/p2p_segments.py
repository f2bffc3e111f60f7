#!/usr/bin/env python3
"""Diagnostic for benchmark (c): two ranks exchange one message each way at once (what a
gossip round does) through c10d gloo's isend/irecv, whole or cut into segments, at 1 Gbit/s.
Shows whether Gloo overlaps the two directions of one large message.

    tools/bench/run.sh p2p_segments [--bytes 16777216] [--segments 16777216,1048576,262144] [--iters 1]
                                    [--hosts 2 [--ranks-per-host 1]] [--network 1gbit]
                                    [--trials 5] [--max-load 0.5] [--allow-load] [--results-dir DIR]

Pairs: rank r exchanges with rank (r + n/2) mod n, on another host (the number of hosts must be
even); with --ranks-per-host G every rank of a host exchanges at once, so the host's link carries
G messages each way, and the message time is G x bytes / rate.

On tools/bench/harness.py, the segment sizes being the methods: an untimed warm-up exchange per
segment size, then --trials trials of --iters iterations, the sizes in rotating order within
each (iteration i of trial t starts at size t + i), a barrier before each exchange. A trial's
sample is the median over its iterations of the slower rank's time; the table shows the median
over the trials with its min-max, and each size's time over the whole message's (the first
size) as the median of the per-trial ratios.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import harness  # noqa: E402


def worker(args):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    rank, n = common.worker_env()
    dist.init_process_group("gloo", init_method="env://")
    group = None
    if args.backend == "gossipcc":
        import gossipcc  # noqa: F401  (registers the backend)
        group = dist.new_group(backend="gossipcc")
    peer = (rank + n // 2) % n
    x = torch.full((args.bytes // 4,), float(rank + 1))
    y = torch.empty(args.bytes // 4)
    segments = args.segments.split(",")

    def exchange(seg):
        k = int(seg) // 4
        works = []
        for off in range(0, x.numel(), k):
            works.append(dist.isend(x[off:off + k], peer, group=group))
            works.append(dist.irecv(y[off:off + k], peer, group=group))
        for w in works:
            w.wait()

    def one(seg):
        measured = common.timed(lambda: exchange(seg), dist.barrier)
        if y[0].item() != peer + 1 or y[-1].item() != peer + 1:
            raise AssertionError("wrong data received")
        y.zero_()
        return measured

    for seg in segments:  # warm-up, not timed
        one(seg)
    trials = common.run_trials(dist.barrier, segments, args.trials, args.iters, one)
    out = {"trials": trials}
    dist.barrier()
    dist.destroy_process_group()
    with open(args.out, "w") as f:
        json.dump(out, f)


CELL = "exchange"  # the benchmark's one configuration


def record(run, docs, msg):
    run.cell(CELL, message_time=msg)
    for trial in range(len(docs[0]["trials"])):
        runs = [d["trials"][trial] for d in docs]
        run.add_trial({CELL: common.slowest_samples(docs, trial, list(runs[0]["times"]))}, runs[0]["load"],
                      runs[0]["order"])


def report(doc):
    a = doc["args"]
    msg = doc["cells"][CELL]["message_time"]
    s = doc["summary"]["cells"][CELL]
    rows = []
    for seg in doc["methods"]:
        st = s["methods"][seg]
        rows.append([common.human_bytes(int(seg)), harness.cell_text(st["time"], 1e3, 1),
                     harness.cell_text(st["time"], 1 / msg, 2),
                     "1.00" if seg == doc["baseline"] else harness.cell_text(s["ratios"][seg], 1, 2),
                     common.bytes_text(st.get("sent")), common.bytes_text(st.get("host_sent"))])
    backend = a["backend"] if a["backend"] == "gloo" else \
        f"gossipcc (GOSSIPCC_P2P_SEGMENT_BYTES={doc['info']['segment_env']})"
    head = (f"{backend}: {common.args_world(dict({'ranks': 2}, **a))}, {common.human_bytes(a['bytes'])} each way "
            f"at once per pair, network {a['network']}, "
            f"one message time {1e3 * msg:.1f} ms, {a['iters']} iteration(s) per trial")
    table = harness.markdown_table(["segment", "exchange (ms)", "/ message time",
                                    f"/ whole message ({common.human_bytes(int(doc['baseline']))})",
                                    "MB sent/rank", "MB sent/host"], rows)
    return "\n\n".join([harness.preamble(doc), head, table, harness.trials_table(doc)])


def plot(doc, path):
    """Each segment size's exchange time in message times: every trial (points), the median (bar)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    msg = doc["cells"][CELL]["message_time"]
    s = doc["summary"]["cells"][CELL]["methods"]
    segs = doc["methods"]
    xs = list(range(len(segs)))
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.bar(xs, [s[g]["time"]["median"] / msg for g in segs], color="lightsteelblue", label="median of trials")
    for x, g in zip(xs, segs):
        ys = [v / msg for v in harness.samples_of(doc["trials"], CELL, g, "time")]
        ax.plot([x] * len(ys), ys, "k.", label="trials" if x == 0 else None)
    ax.axhline(1.0, color="gray", linewidth=1)
    ax.set(xticks=xs, ylabel="exchange time / one message time")
    ax.set_xticklabels([common.human_bytes(int(g)) for g in segs])
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--bytes", type=int, default=16 << 20)
    p.add_argument("--segments", default=f"{16 << 20},{1 << 20},{256 << 10}",
                   help="segment sizes in bytes, comma-separated; the first is the ratios' baseline")
    common.add_cluster_arguments(p, hosts=2, network="1gbit")
    p.add_argument("--iters", type=int, default=1, help="iterations per trial")
    p.add_argument("--backend", default="gloo", choices=["gloo", "gossipcc"],
                   help="whose isend/irecv (gossipcc cuts messages itself: GOSSIPCC_P2P_SEGMENT_BYTES)")
    p.add_argument("--plot", metavar="PNG", help="also write a plot (exchange time per segment size) here")
    harness.add_arguments(p)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    segments = args.segments.split(",")
    bad = [seg for seg in segments if not seg.isdigit() or int(seg) <= 0 or int(seg) % 4]
    if bad or len(set(segments)) != len(segments):
        common.fail(f"p2p_segments: --segments must be distinct positive multiples of 4 bytes, got {args.segments}")
    if args.iters < 1:
        common.fail(f"p2p_segments: --iters must be at least 1, got {args.iters}")
    if args.network == "local":
        common.fail("p2p_segments: --network must be a shaped emulated_cluster preset (the table is in message times)")
    common.resolve_cluster_arguments(args, "p2p_segments")
    if args.hosts % 2:
        common.fail(f"p2p_segments: --hosts must be even (each rank exchanges with one on another host), "
                    f"got {args.hosts}")
    bps = common.link_bytes_per_second(args.network)
    if not bps:
        common.fail(f"p2p_segments: --network {args.network} is unshaped; the table is in message times")
    run = harness.Run("p2p_segments", args, segments, segments[0], "time")
    run.info["segment_env"] = os.environ.get("GOSSIPCC_P2P_SEGMENT_BYTES", "default")
    try:
        with common.make_cluster(args.hosts, args.ranks_per_host, args.network) as cluster:
            docs = common.run_ranks(cluster, os.path.abspath(__file__),
                                    ["--bytes", str(args.bytes), "--segments", args.segments,
                                     "--iters", str(args.iters), "--backend", args.backend,
                                     "--trials", str(args.trials)])
    except common.NamespacesUnavailable as e:
        common.fail(f"p2p_segments: emulated network not available: {e}")
    record(run, docs, args.ranks_per_host * args.bytes / bps)
    doc = run.finish(report)
    if args.plot:
        plot(doc, args.plot)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
