#!/usr/bin/env python3
"""Benchmark (h): a projection to real scale. The alpha-beta model of tools/bench/projection_model.py
is calibrated and checked against measured runs on the emulated cluster (`check`), then projected
to a 124 M and a 1 B parameter model on hosts of 8 GPUs (`project`).

    tools/bench/run.sh projection check [--configs "4x1@rate=100mbit;4x1@rate=1gbit,delay=25ms;..."]
                                        [--scale 0.04] [--local-trials 3] [--trials 5] [--max-load 0.5]
                                        [--allow-load] [--results-dir DIR]
    tools/bench/run.sh projection project --calibration results/projection-<UTC>/ [--compute-124m 0.25]
                                        [--compute-1b 2.0] [--diloco-h 20] [--streams 1] [--gpus-per-host 8]
                                        [--intra-gbit 1200] [--intra-alpha-us 10] [--results-dir DIR]
(a flag of the other mode is refused).

check: per configuration (H x G hosts and ranks, a network; `;`-separated):
  1. The link (projection_model.Link), on the configuration's own cluster: alpha (one message)
     and beta (one stream's rate) from a ping-pong over backend="gossipcc" (dist.send of S bytes
     from rank 0 to rank G, the first rank of host 1, and a 1-byte reply) at sizes PING_SIZES,
     each the median of PING_REPS, by a least-squares fit of round trip = 2 alpha + S / beta
     (fit_alpha_beta); with G > 1 the same between rank 0 and rank 1 gives local_alpha and
     local_rate; nic: the link's rate x the payload share of full frames. The per-step costs of
     an exchange, of gossipcc's ring and of gloo's ring from SMALL_OPS (the slowest rank's time,
     median of PING_REPS; the ring's inverted by projection_model.step_cost), sizes that the
     checked tensors do not have. The restart window (Link.restart) from IDLE_BYTES sent after
     the connection sat idle (projection_model.restart_window).
  2. Each method's CPU: tools/bench/model_shapes.py's measurement (its worker, its checks) of the
     same tensors on the same number of local ranks over loopback (`--network local`): the
     median time of each method there is the model's cpu term of that method (its codec, reduce
     and copies through the kernel, with this machine's cores shared by n ranks as in the check).
  3. The measured side: model_shapes.py's worker on the emulated cluster (ResNet-50's shapes at
     --scale; --trials trials, methods interleaved), every method checked by model_shapes.
  The table: per configuration and method the prediction (latency + wire + cpu), the measured
  median (min-max) and the error; an error above 15% is flagged with how far off it is and the
  term that dominates the prediction. PyTorch's powerSGD_hook, which model_shapes also measures, is not modelled.

project: from a check's results file: each per-message cost as delays x delay + seconds
(projection_model.per_delay over its configurations), the TCP window of one stream (beta x RTT
where a delayed configuration was window-bound, else the stock host's tcp_rmem max / 2), the
restart window after idle, and each method's CPU per element (per byte, per n m r) on one core
(the check's local time x min(1, cores / n)); then, for each model, hosts, rate and delay, the
time per step and the bytes per step per host of every method next to DDP's exact ring, the
topology-aware (hierarchical) form beside quantized 4 bits and push-sum, with the assumptions
printed above the tables.
"""
import argparse
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import harness  # noqa: E402
import model_shapes  # noqa: E402
import projection_model as pm  # noqa: E402
import projection_scale  # noqa: E402

DEFAULT_CONFIGS = "4x1@rate=100mbit;4x1@rate=1gbit,delay=25ms;2x2@rate=100mbit,delay=25ms"
PING_SIZES = (8, 128 << 10, 512 << 10, 2 << 20)
PING_REPS = 5
# The small collectives the per-step costs come from: (name, backend, bytes): an eager all-reduce
# (one exchange of the signature check), gossipcc's ring just above the direct all-reduce's
# limit, and gloo's ring.
# The restart window: IDLE_BYTES sent after IDLE_SECONDS without traffic (longer than TCP's
# retransmission timeout), the median of IDLE_REPS, against the ping-pong's fit.
IDLE_BYTES, IDLE_SECONDS, IDLE_REPS = 2 << 20, 3.0, 3
SMALL_OPS = (("exchange", "gossipcc", 1 << 10), ("ring", "gossipcc", 640 << 10), ("gloo", "gloo", 64 << 10))
GOAL_PERCENT = 15.0
CHECK_FLAGS = ("--configs", "--scale", "--local-trials")
HARNESS_FLAGS = ("--trials", "--max-load", "--allow-load")  # (--results-dir: both modes)
CHECKED = (("ddp", "gloo"), ("ddp", "gossipcc exact"), ("ddp", "quantized 8 bits"), ("ddp", "quantized 4 bits"),
           ("ddp", "PowerSGD r4 (gossipcc)"), ("diloco", "gloo"), ("diloco", "gossipcc exact"),
           ("diloco", "quantized 8 bits"), ("diloco", "quantized 4 bits"), ("diloco", "push-sum round (gossipcc)"))


class ConfigError(ValueError):
    pass


def parse_configs(text):
    """[(hosts, ranks_per_host, network)] of "HxG@network;..." (networks: emulated_cluster presets
    and link specs, or local: processes on loopback, for smoke tests)."""
    out = []
    for part in [p.strip() for p in text.split(";") if p.strip()]:
        layout, sep, network = part.partition("@")
        h, x, g = layout.partition("x")
        if not sep or not x or not h.isdigit() or not g.isdigit():
            raise ConfigError(f"--configs: {part!r} is not HxG@network (e.g. 4x1@rate=100mbit)")
        hosts, g = int(h), int(g)
        if hosts < 2 or g < 1:
            raise ConfigError(f"--configs: {part!r}: needs at least 2 hosts of at least 1 rank")
        if network != "local":
            common.emulated_cluster.parse_link(network)
        out.append((hosts, g, network))
    if not out:
        raise ConfigError("--configs: no configuration given")
    return out


def config_name(hosts, g, network):
    return f"{hosts}x{g} {network}"


# ---- the ping-pong worker ---------------------------------------------------------------------

def pingpong_worker(args):
    """On every rank: the ping-pongs of the module's doc (rank 0 writes them: {pair: {size:
    seconds}}), then SMALL_OPS, each timed between barriers (every rank writes its times)."""
    import datetime
    import json
    import time
    import torch
    import torch.distributed as dist
    import gossipcc  # noqa: F401  (registers the backend)
    rank, n = common.worker_env()
    g = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=600))
    groups = {"gloo": dist.new_group(backend="gloo"), "gossipcc": dist.new_group(backend="gossipcc")}
    pairs = ([("cross", 0, g)] if n > g else []) + ([("intra", 0, 1)] if g > 1 else [])
    ack = torch.zeros(1, dtype=torch.uint8)
    pings = {}
    for name, a, b in pairs:
        pings[name] = {}
        for size in PING_SIZES:
            buf = torch.zeros(size, dtype=torch.uint8)
            times = []
            for _ in range(PING_REPS + 1):  # the first round trip of each size untimed
                dist.barrier()
                if rank == a:
                    t0 = time.perf_counter()
                    dist.send(buf, b, group=groups["gossipcc"])
                    dist.recv(ack, b, group=groups["gossipcc"])
                    times.append(time.perf_counter() - t0)
                elif rank == b:
                    dist.recv(buf, a, group=groups["gossipcc"])
                    dist.send(ack, a, group=groups["gossipcc"])
            pings[name][str(size)] = statistics.median(times[1:]) if times else None
    idle = []
    if pairs and pairs[0][0] == "cross":  # the same message after the connection sat idle
        a, b = pairs[0][1], pairs[0][2]
        buf = torch.zeros(IDLE_BYTES, dtype=torch.uint8)
        for _ in range(IDLE_REPS):
            time.sleep(IDLE_SECONDS)
            dist.barrier()  # (on the gloo group: gossipcc's connections stay idle)
            if rank == a:
                t0 = time.perf_counter()
                dist.send(buf, b, group=groups["gossipcc"])
                dist.recv(ack, b, group=groups["gossipcc"])
                idle.append(time.perf_counter() - t0)
            elif rank == b:
                dist.recv(buf, a, group=groups["gossipcc"])
                dist.send(ack, a, group=groups["gossipcc"])
    ops = {}
    for name, backend, size in SMALL_OPS:
        x = torch.ones(size // 4)
        ops[name] = []
        for _ in range(PING_REPS + 1):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(x, group=groups[backend])
            ops[name].append(time.perf_counter() - t0)
        ops[name] = ops[name][1:]
    dist.barrier()
    dist.destroy_process_group()
    with open(args.out, "w") as f:
        json.dump({"pings": pings if rank == 0 else {}, "idle": idle, "ops": ops}, f)


def fit_pairs(pings):
    """{pair: (alpha, beta)} from {pair: {size: round trip}}: round trip = 2 alpha + S / beta."""
    out = {}
    for pair, by_size in pings.items():
        sizes = [int(s) for s in by_size]
        a, b = pm.fit_alpha_beta(sizes, [by_size[str(s)] for s in sizes])
        out[pair] = (a / 2, b)
    return out


def op_seconds(docs, name):
    """The median over the repetitions of the slowest rank's time of one of SMALL_OPS."""
    reps = len(docs[0]["ops"][name])
    return statistics.median(max(d["ops"][name][i] for d in docs) for i in range(reps))


def link_of(network, world, docs):
    """The check's Link (module's doc): alpha and beta from the ping-pong, nic from the network's
    rate, the intra-host pair's alpha and rate where G > 1, and the per-step costs of the
    exchange, gossipcc's ring and gloo's ring from SMALL_OPS."""
    fits = fit_pairs(docs[0]["pings"])
    nic_bytes = common.link_bytes_per_second(network)
    alpha, beta = fits["cross"]
    nic = nic_bytes * pm.PAYLOAD_SHARE if nic_bytes else beta
    kw = {"local_alpha": fits["intra"][0], "local_rate": fits["intra"][1]} if "intra" in fits else {}
    spec = common.emulated_cluster.parse_link(network) if network != "local" else None
    delay = common.emulated_cluster.wan_link.seconds(spec.delay) if spec and spec.delay else 0.0
    link = pm.Link(alpha, beta, nic, rtt=2 * delay, **kw)
    if docs[0]["idle"] and delay > 0:
        extra = statistics.median(docs[0]["idle"]) - (2 * alpha + IDLE_BYTES / beta)
        link.restart = pm.restart_window(extra, IDLE_BYTES, min(beta, nic), 2 * delay)
    sizes = {name: size for name, _, size in SMALL_OPS}
    link.exchange = op_seconds(docs, "exchange") - pm.exchange(sizes["exchange"], world, link)[1]
    link.ring = pm.step_cost(op_seconds(docs, "ring"), sizes["ring"], world, link)
    link.gloo = pm.step_cost(op_seconds(docs, "gloo"), sizes["gloo"], world, link, gloo=True)
    return link, fits, delay


# ---- predictions of model_shapes's methods ----------------------------------------------------

def bucket_shapes(layout):
    return [[layout.shapes[i] for i in b] for b in layout.buckets]


def network_cost(section, method, layout, world, link):
    """The model's latency and wire terms (cpu 0) of one of model_shapes's methods."""
    total = layout.total
    if section == "ddp":
        sizes = [4 * sum(math.prod(layout.shapes[i]) for i in b) for b in layout.buckets]
        idle = [i < pm.COLLECTIVE_LANES for i in range(len(sizes))]  # each lane's first bucket
        if method == "gloo":
            return pm.bucketed(pm.ring_allreduce(s, world, link, gloo=True, idle=i) for s, i in zip(sizes, idle))
        if method == "gossipcc exact":
            return pm.bucketed(pm.gossipcc_allreduce(s, world, link, idle=i) for s, i in zip(sizes, idle))
        if method.startswith("quantized"):
            bits = 8 if "8" in method else 4
            return pm.bucketed((pm.quantized_allreduce(s // 4, bits, world, link) for s in sizes), lanes=1)
        if method.startswith("PowerSGD"):
            return pm.bucketed((pm.powersgd_allreduce(b, world, link) for b in bucket_shapes(layout)), lanes=1)
    else:
        if method == "gloo":
            return pm.ring_allreduce(4 * total, world, link, gloo=True, idle=True)
        if method == "gossipcc exact":
            return pm.gossipcc_allreduce(4 * total, world, link, idle=True)
        if method.startswith("quantized"):
            return pm.quantized_allreduce(total, 8 if "8" in method else 4, world, link)
        if method.startswith("push-sum"):
            return pm.push_sum_round(4 * total, world, link)
    raise ConfigError(f"no model of {section}/{method}")


def dominant(cost):
    return max((("latency", cost.latency), ("wire", cost.wire), ("cpu", cost.cpu)), key=lambda kv: kv[1])[0]


def check_rows(predicted, measured):
    """Rows [config, section, method, latency, wire, cpu, predicted, measured stats, error %,
    flag] of a check; predicted {cell: {method: Cost}}, measured {cell: {method: stats}} (s)."""
    rows = []
    for cell, methods in predicted.items():
        for method, cost in methods.items():
            st = measured.get(cell, {}).get(method)
            if st is None:
                continue
            err = pm.error_percent(cost.total, st["median"])
            miss = (cost.total - st["median"]) * 1e3
            flag = (f"**> {GOAL_PERCENT:g}%**: {miss:+.0f} ms, the {dominant(cost)} term "
                    f"{getattr(cost, dominant(cost)) * 1e3:.0f} ms" if abs(err) > GOAL_PERCENT else "")
            rows.append([cell, method, cost, st, err, flag])
    return rows


# ---- the check --------------------------------------------------------------------------------

def measure_shapes(cluster, args, trials):
    return common.run_ranks(cluster, model_shapes.__file__,
                            ["--model", "resnet50", "--scale", repr(args.scale), "--bucket-mb", "25",
                             "--iterations", "1", "--trials", str(trials)], timeout=3600)


def local_times(docs):
    """{cell suffix ("DDP step"...): {method: median seconds}} of a local model_shapes run."""
    model_shapes.check_documents(docs, "resnet50")
    per = {}
    for t in range(len(docs[0]["trials"])):
        for cell, methods in model_shapes.trial_samples(docs, t, "resnet50").items():
            for m, s in methods.items():
                per.setdefault(cell, {}).setdefault(m, []).append(s["time"])
    return {cell: {m: statistics.median(v) for m, v in ms.items()} for cell, ms in per.items()}


def run_check(args):
    configs = parse_configs(args.configs)
    methods = sorted({m for _, m in CHECKED}, key=[m for _, m in CHECKED].index)
    run = harness.Run("projection", args, methods, "gloo", "time")
    layout = model_shapes.Layout("resnet50", args.scale, 25.0)
    run.info.update(mode="check", elements=layout.total, buckets=len(layout.buckets), configs={}, cores=os.cpu_count())
    local = {}
    for hosts, g, network in configs:
        name = config_name(hosts, g, network)
        world = pm.World(hosts, g)
        if (hosts, g) not in local:
            print(f"{name}: the methods on {hosts * g} local ranks (their cpu)", flush=True)
            with common.make_cluster(hosts, g, "local") as cluster:
                local[(hosts, g)] = local_times(measure_shapes(cluster, args, args.local_trials))
        try:
            with common.make_cluster(hosts, g, network) as cluster:
                print(f"{name}: calibration (ping-pong, small collectives)", flush=True)
                calib = common.run_ranks(cluster, os.path.abspath(__file__), ["pingpong"], timeout=600)
                print(f"{name}: model_shapes, {args.trials} trials", flush=True)
                docs = measure_shapes(cluster, args, args.trials)
        except common.NamespacesUnavailable as e:
            common.fail(f"projection: emulated network not available: {e}")
        except common.ClusterError as e:
            common.fail(f"projection: {name}: {e}")
        link, fits, delay = link_of(network, world, calib)
        predicted = {}
        for section, method in CHECKED:
            cell_suffix = model_shapes.cell_name("resnet50", section)
            c = network_cost(section, method, layout, world, link)
            cpu = local[(hosts, g)][cell_suffix][method]
            predicted.setdefault(f"{name}: {cell_suffix}", {})[method] = pm.Cost(c.latency, c.wire, cpu)
        run.info["configs"][name] = {
            "hosts": hosts, "ranks_per_host": g, "network": network, "delay": delay,
            "pings": calib[0]["pings"], "ops": [d["ops"] for d in calib], "fits": fits, "link": vars(link), "local": local[(hosts, g)],
            "predicted": {cell: {m: c._asdict() for m, c in ms.items()} for cell, ms in predicted.items()}}
        try:
            model_shapes.check_documents(docs, "resnet50")
        except model_shapes.CheckFailed as e:
            common.fail(f"projection: {name}: check failed: {e}")
        for cell in predicted:
            run.cell(cell, config=name, section=cell.split(": ", 1)[1])
        for t in range(len(docs[0]["trials"])):
            samples = model_shapes.trial_samples(docs, t, "resnet50")
            mine = {f"{name}: {cell}": {m: s for m, s in ms.items() if m in methods}
                    for cell, ms in samples.items()}
            tr = docs[0]["trials"][t]
            run.add_trial(mine, tr["load"], tr["orders"][0], group=name)
    run.finish(report)


# ---- reports ----------------------------------------------------------------------------------

def calibration_table(doc):
    rows = []
    for name, c in doc["info"]["configs"].items():
        alpha, beta = c["fits"]["cross"]
        intra = c["fits"].get("intra")
        ln = c["link"]
        rows.append([name, f"{alpha * 1e3:.2f}", f"{ln['exchange'] * 1e3:.2f}", f"{ln['ring'] * 1e3:.2f}",
                     f"{ln['gloo'] * 1e3:.2f}", f"{beta * 8 / 1e6:.1f}", f"{ln['nic'] * 8 / 1e6:.1f}",
                     f"{ln['restart'] / 1024:.0f}" if ln["rtt"] > 0 else "-",
                     "-" if not intra else f"{intra[0] * 1e3:.3f} ms, {intra[1] * 8 / 1e9:.2f} Gbit/s"])
    return harness.markdown_table(["configuration", "alpha: message (ms)", "exchange (ms)", "ring step (ms)",
                                   "gloo ring step (ms)", "beta (Mbit/s)", "nic (Mbit/s)", "restart window (KiB)",
                                   "intra-host alpha, rate"], rows)


def check_table(doc):
    s = doc["summary"]["cells"]
    predicted = {cell: {m: pm.Cost(**c) for m, c in ms.items()}
                 for cfg in doc["info"]["configs"].values() for cell, ms in cfg["predicted"].items()}
    measured = {cell: {m: st["time"] for m, st in e["methods"].items()} for cell, e in s.items()}
    rows = []
    for cell, method, cost, st, err, flag in check_rows(predicted, measured):
        rows.append([cell, method, f"{cost.latency * 1e3:.1f}", f"{cost.wire * 1e3:.1f}", f"{cost.cpu * 1e3:.1f}",
                     f"{cost.total * 1e3:.1f}", harness.cell_text(st, 1e3, 1), f"{err:+.1f}%", flag])
    return harness.markdown_table(["configuration: section", "method", "latency (ms)", "wire (ms)", "cpu (ms)",
                                   "predicted (ms)", "measured (ms)", "error", f"> {GOAL_PERCENT:g}%?"], rows)


def report(doc):
    if doc["info"].get("mode") == "project":
        return projection_scale.report(doc)
    a = doc["args"]
    head = (f"projection check: ResNet-50's shapes at --scale {a['scale']:g} ({doc['info']['elements']:,} float32, "
            f"{doc['info']['buckets']} DDP buckets); the measured side is model_shapes.py's worker, the slowest "
            f"rank's time; cpu: the same method on the same number of local ranks (median of {a['local_trials']})")
    return "\n\n".join([harness.preamble(doc), head, "Calibration (ping-pong over backend=\"gossipcc\"):",
                        calibration_table(doc), "Predicted against measured:", check_table(doc),
                        harness.trials_table(doc)])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("mode", choices=("check", "project", "pingpong"), help="check: calibrate and compare; project")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--configs", default=DEFAULT_CONFIGS, help=f"check: HxG@network;... (default {DEFAULT_CONFIGS})")
    p.add_argument("--scale", type=float, default=0.04, help="check: ResNet-50's shapes x this (default 0.04)")
    p.add_argument("--local-trials", type=int, default=3, help="check: trials of the local run (default 3)")
    projection_scale.add_arguments(p)
    harness.add_arguments(p)
    args = p.parse_args()
    if args.worker:
        if args.mode != "pingpong":
            common.fail(f"projection: --worker runs the ping-pong only, not {args.mode}")
        return pingpong_worker(args)
    try:
        own = {"check": CHECK_FLAGS + HARNESS_FLAGS, "project": projection_scale.FLAGS}[args.mode] \
            if args.mode in ("check", "project") else ()
        stray = [f for f in CHECK_FLAGS + HARNESS_FLAGS + projection_scale.FLAGS
                 if f not in own and getattr(args, f.lstrip("-").replace("-", "_")) != p.get_default(
                     f.lstrip("-").replace("-", "_"))]
        if stray:
            raise ConfigError(f"{', '.join(stray)}: not a flag of {args.mode}")
        if args.mode == "check":
            if not 0 < args.scale <= 1:
                raise ConfigError(f"--scale must be in (0, 1], got {args.scale}")
            if args.local_trials < 1:
                raise ConfigError(f"--local-trials must be >= 1, got {args.local_trials}")
            parse_configs(args.configs)
            return run_check(args)
        if args.mode == "project":
            return projection_scale.run(args)
        raise ConfigError("pingpong is the check's worker (--worker)")
    except (ConfigError, pm.ModelError, harness.HarnessError, ValueError) as e:
        common.fail(f"projection: {e}")


if __name__ == "__main__":
    main()
