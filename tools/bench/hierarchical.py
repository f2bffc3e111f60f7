#!/usr/bin/env python3
"""Benchmark (h): every collective that has a two-level form, flat against over hosts, on the same
ranks: H emulated hosts of G ranks (default 4 x 2), 16 MB of float32, 100 Mbit/s per host with
25 ms one-way delay. Beside it, the same methods on H hosts of one rank each (the bytes each
host's NIC carries there are what the two-level form should match).

    tools/bench/run.sh hierarchical [--hosts 4] [--ranks-per-host 2] [--network rate=100mbit,delay=25ms]
                                    [--bytes 16777216] [--iterations 1] [--trials 5] [--no-one-rank-hosts]
                                    [--max-load 0.5] [--allow-load] [--results-dir DIR]

Methods, each a call of the backend on 16 MB (the slowest rank's time until its Work is done,
after an untimed barrier):
- "push-sum" (`push_sum_round`, graph exponential:peers=1: GossipDataParallel's SGP and OSGP
  rounds and DiLoCo's outer_sync="gossip", which are made of this call), "D-PSGD"
  (`symmetric_gossip_round`, ring), "quantized 8 bits" (`quantized_allreduce`, averaging),
  "PowerSGD rank 4" (`powersgd_allreduce`: the DDP hook's and DiLoCo's call, on the buffer viewed
  as 1024-wide matrices, compressing from the first call, error feedback and warm start on),
  "exact all-reduce" (`dist.all_reduce`), each on a group created with GOSSIPCC_TOPOLOGY=flat
  ("... flat") and on a group with the default topology (auto: two-level on hosts of several
  ranks, "... over hosts");
- "exact all-reduce gloo": `dist.all_reduce` on a gloo group of the same ranks (its flat ring).

On tools/bench/harness.py: one untimed warm-up, then --trials trials of --iterations iterations,
every method once per iteration in rotating order. The table: per method its time (median over
trials, min-max), the over-hosts form's speed-up over its flat form (median of per-trial
ratios), bytes per rank and per host per op (NIC tx counters, headers and ACKs included), and
the per-host bytes against the same method's at H x 1. Checks (the run is refused otherwise):
after each over-hosts gossip round every rank of a host holds the same bits; the quantized and
exact all-reduces give every rank the same bits.
"""
import argparse
import hashlib
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import harness  # noqa: E402

KINDS = ("push-sum", "D-PSGD", "quantized 8 bits", "PowerSGD rank 4", "exact all-reduce")
METHODS = tuple(f"{k} {form}" for k in KINDS for form in ("flat", "over hosts")) + ("exact all-reduce gloo",)
# Methods whose result every rank must hold bitwise the same (the gossip rounds: every rank of a host).
SAME_EVERYWHERE = ("quantized 8 bits flat", "quantized 8 bits over hosts", "PowerSGD rank 4 flat",
                   "PowerSGD rank 4 over hosts", "exact all-reduce flat", "exact all-reduce over hosts",
                   "exact all-reduce gloo")
# PowerSGD's tensors: the buffer viewed as square matrices of this side (the last one shorter).
POWERSGD_SIDE = 1024
SAME_IN_HOST = ("push-sum over hosts", "D-PSGD over hosts")


def data(rank, count):
    import torch
    return torch.randn(count, generator=torch.Generator().manual_seed(4321 + rank))


def worker(args):
    import datetime
    import torch
    import torch.distributed as dist
    import gossipcc
    torch.set_num_threads(1)
    rank, n = common.worker_env()
    os.environ["GOSSIPCC_TOPOLOGY"] = "flat"
    dist.init_process_group("gossipcc", init_method="env://", timeout=datetime.timedelta(seconds=600))
    del os.environ["GOSSIPCC_TOPOLOGY"]
    flat_group = None  # the default group
    flat = gossipcc.get_backend_object()
    hosts_group = dist.new_group(backend="gossipcc")  # the default topology: auto
    hosts = gossipcc.get_backend_object(hosts_group)
    gloo = dist.new_group(backend="gloo")
    topology = hosts.topology()
    if args.ranks_per_host > 1 and not topology["hierarchical"]:
        raise AssertionError(f"rank {rank}: the default topology is not two-level on these hosts: "
                             f"{topology['description']}")
    count = args.bytes // 4
    source = data(rank, count)
    t = torch.empty(count, dtype=torch.float32)
    w = torch.ones(1, dtype=torch.float64)
    steps = {m: 0 for m in METHODS}
    # PowerSGD: the buffer as matrices of POWERSGD_SIDE columns, one state per group.
    rows = [min(POWERSGD_SIDE, (count - start) // POWERSGD_SIDE)
            for start in range(0, count - count % POWERSGD_SIDE, POWERSGD_SIDE * POWERSGD_SIDE)]
    shapes = [[r, POWERSGD_SIDE] for r in rows] + ([[count % POWERSGD_SIDE]] if count % POWERSGD_SIDE else [])
    psgd = {m: gossipcc._C.PowerSGD("rank=4,start_iter=0") for m in METHODS if m.startswith("PowerSGD")}

    def run(name):
        backend, group = (hosts, hosts_group) if name.endswith("over hosts") else (flat, flat_group)
        step = steps[name]
        steps[name] += 1
        if name.startswith("push-sum"):
            w.fill_(1.0)
            backend.push_sum_round([t], w, step, "exponential:peers=1").wait()
        elif name.startswith("D-PSGD"):
            backend.symmetric_gossip_round([t], step, "ring").wait()
        elif name.startswith("quantized"):
            backend.quantized_allreduce([t], 8, True).wait()
        elif name.startswith("PowerSGD"):
            views, at = [], 0
            for shape in shapes:
                size = shape[0] * (shape[1] if len(shape) > 1 else 1)
                views.append(t[at:at + size])
                at += size
            backend.powersgd_allreduce(views, shapes, psgd[name], [f"m{i}" for i in range(len(views))]).wait()
        else:
            dist.all_reduce(t, group=gloo if name.endswith("gloo") else group)

    def one(name):
        t.copy_(source)
        return common.timed(lambda: run(name), dist.barrier)

    digests = {}
    for name in METHODS:  # warm-up, not timed: its results are the ones checked
        one(name)
        digests[name] = hashlib.sha256(t.numpy().tobytes()).hexdigest()
    trials = common.run_trials(dist.barrier, METHODS, args.trials, args.iterations, one)
    here = next(i for i, ranks in enumerate(topology["hosts"]) if rank in ranks)
    dist.barrier()
    dist.destroy_process_group()
    with open(args.out, "w") as f:
        json.dump({"trials": trials, "digest": digests, "host": here}, f)


def cell_name(hosts, ranks_per_host):
    return f"{hosts}x{ranks_per_host}"


def check(docs):
    """AssertionError naming the first method whose ranks (or a host's ranks) differ."""
    for m in SAME_EVERYWHERE:
        if len({d["digest"][m] for d in docs}) != 1:
            raise AssertionError(f"{m}: ranks hold different results")
    for m in SAME_IN_HOST:
        for host in {d["host"] for d in docs}:
            if len({d["digest"][m] for d in docs if d["host"] == host}) != 1:
                raise AssertionError(f"{m}: the ranks of host {host} hold different results")


def record(run, docs, cell, hosts, ranks_per_host):
    check(docs)
    run.cell(cell, hosts=hosts, ranks_per_host=ranks_per_host)
    for trial in range(len(docs[0]["trials"])):
        run.add_trial({cell: common.slowest_samples(docs, trial, METHODS)}, docs[0]["trials"][trial]["load"],
                      docs[0]["trials"][trial]["orders"][0], group=cell,
                      detail={"orders": docs[0]["trials"][trial]["orders"]})


def table(doc, cell, reference_cell):
    """Per method: time, speed-up of the over-hosts form over its flat form (gloo's ring for the
    exact all-reduce), bytes per rank and per host, and per host against the same method at H x 1."""
    methods = doc["summary"]["cells"][cell]["methods"]
    ref = doc["summary"]["cells"].get(reference_cell, {}).get("methods") if reference_cell else None
    rows = []
    for m in METHODS:
        if m.endswith("over hosts"):
            base = m[:-len("over hosts")] + "flat"
            speedup = harness.cell_text(harness.ratio_stats(doc["trials"], cell, base, m, "time"), 1, 2, "x")
        else:
            speedup = "-"
        vs_gloo = (harness.cell_text(harness.ratio_stats(doc["trials"], cell, "exact all-reduce gloo", m, "time"),
                                     1, 2, "x") if m.startswith("exact") else "-")
        host = methods[m].get("host_sent")
        vs_one = "-"
        if ref and host and ref[m].get("host_sent"):
            # The form at H x 1 (the same method; "over hosts" is flat there: one rank per host).
            vs_one = f"{host['median'] / ref[m]['host_sent']['median']:.2f}"
        rows.append([m, harness.cell_text(methods[m]["time"], 1e3, 0), speedup, vs_gloo,
                     common.bytes_text(methods[m].get("sent")), common.bytes_text(host), vs_one])
    return harness.markdown_table(["method", "time (ms)", "speed-up over flat", "speed-up over gloo",
                                   "MB sent/rank/op", "MB sent/host/op", "sent/host ÷ same at H x 1"], rows)


def report(doc):
    a = doc["args"]
    main = cell_name(a["hosts"], a["ranks_per_host"])
    one = cell_name(a["hosts"], 1) if cell_name(a["hosts"], 1) in doc["summary"]["cells"] and a["ranks_per_host"] > 1 \
        else None
    text = (f"{harness.preamble(doc)}\n\nflat vs over hosts, {common.args_world(a)}, "
            f"{common.human_bytes(a['bytes'])} float32, network {a['network']}, {a['iterations']} iteration(s) per "
            f"trial, the slowest rank's time\n\n{table(doc, main, one)}\n")
    if one:
        text += f"\nthe same at {a['hosts']} hosts x 1 rank (reference for bytes per host)\n\n{table(doc, one, None)}\n"
    return text + f"\n{harness.trials_table(doc)}"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    common.add_cluster_arguments(p, hosts=4, ranks_per_host=2, network="rate=100mbit,delay=25ms")
    p.add_argument("--bytes", type=int, default=16 << 20)
    p.add_argument("--iterations", type=int, default=1, help="iterations per trial")
    p.add_argument("--no-one-rank-hosts", action="store_true",
                   help="skip the run on H hosts of one rank each (the bytes-per-host reference)")
    harness.add_arguments(p)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    if args.iterations < 1:
        common.fail(f"hierarchical: --iterations must be at least 1, got {args.iterations}")
    common.resolve_cluster_arguments(args, "hierarchical")
    if args.network == "local":
        common.fail("hierarchical: needs an emulated network (hosts of their own), not --network local")
    run = harness.Run("hierarchical", args, METHODS, "push-sum flat", "time")
    layouts = [(args.hosts, args.ranks_per_host)]
    if args.ranks_per_host > 1 and not args.no_one_rank_hosts:
        layouts.append((args.hosts, 1))
    for hosts, per_host in layouts:
        try:
            with common.make_cluster(hosts, per_host, args.network) as cluster:
                docs = common.run_ranks(cluster, os.path.abspath(__file__),
                                        ["--bytes", str(args.bytes), "--iterations", str(args.iterations),
                                         "--trials", str(args.trials), "--ranks-per-host", str(per_host),
                                         "--hosts", str(hosts), "--network", args.network], timeout=3600)
        except common.NamespacesUnavailable as e:
            common.fail(f"hierarchical: emulated network not available: {e}")
        record(run, docs, cell_name(hosts, per_host), hosts, per_host)
    run.finish(report)


if __name__ == "__main__":
    main()
