"""`tools/bench/projection.py project`: the calibrated model (projection_model.py) at real scale.

From a check's results file (projection.py check) it takes the constants (constants()): the
software's per-message cost (alpha - delay), one TCP stream's window, and each method's CPU per
unit on one core; then, for each model, number of hosts of --gpus-per-host ranks, NIC rate and
one-way delay, each method's time per step (compute + communication, no overlap between them)
and bytes per step per host (what its NIC sends). The assumptions are printed above the tables.
"""
import datetime
import math
import statistics

import common
import harness
import model_shapes
import projection_model as pm

MODELS = {"124M": lambda: model_shapes.gpt2_shapes(),
          "1B": lambda: model_shapes.gpt2_shapes(layers=18, d=2048, context=2048)}
HOSTS = (8, 32, 128)
RATES_GBIT = (1, 10)
DELAYS_MS = (10, 50)
BUCKET_BYTES = 25 << 20
# The stock host's receive buffer maximum (emulated_cluster.STOCK_TCP's tcp_rmem); a window of
# half of it (tcp_adv_win_scale 1) where no calibrated configuration was window-bound.
STOCK_RMEM_MAX = int(common.emulated_cluster.STOCK_TCP["net.ipv4.tcp_rmem"].split()[2])
# The measured methods whose CPU the projection uses (model_shapes's cells and method names).
MODELLED = ("ddp/gossipcc exact", "ddp/quantized 8 bits", "ddp/quantized 4 bits", "ddp/PowerSGD r4 (gossipcc)",
            "diloco/gossipcc exact", "diloco/quantized 4 bits", "diloco/push-sum round (gossipcc)")
COLUMNS = ("DDP (exact ring)", "quantized 8 bits", "quantized 4 bits", "PowerSGD r4", "push-sum (SGP)",
           "DiLoCo exact", "DiLoCo 4 bits", "DDP, hierarchical", "4 bits, hierarchical", "push-sum, hierarchical")


FLAGS = ("--calibration", "--compute-124m", "--compute-1b", "--diloco-h", "--streams", "--gpus-per-host",
         "--intra-gbit", "--intra-alpha-us")


def add_arguments(p):
    p.add_argument("--calibration", help="project: a check's results.json (or its directory)")
    p.add_argument("--compute-124m", type=float, default=0.25, help="project: compute per step of 124M, s (given)")
    p.add_argument("--compute-1b", type=float, default=2.0, help="project: compute per step of 1B, s (given)")
    p.add_argument("--diloco-h", type=int, default=20, help="project: DiLoCo's inner steps per outer sync")
    p.add_argument("--streams", type=int, default=1, help="project: TCP streams per peer (GOSSIPCC_STREAMS_PER_PEER)")
    p.add_argument("--gpus-per-host", type=int, default=8, help="project: ranks per host, sharing its NIC")
    p.add_argument("--intra-gbit", type=float, default=1200.0, help="project: intra-host rate, Gbit/s (assumed)")
    p.add_argument("--intra-alpha-us", type=float, default=10.0, help="project: intra-host message cost, us")


def units(key, layout):
    """What a method's CPU scales with: bytes (exact), elements (quantized, push-sum), n m r (PowerSGD)."""
    section, method = key.split("/", 1)
    if method.startswith("PowerSGD"):
        return sum(pm.psgd_sizes([layout.shapes[i] for i in b])[3] for b in layout.buckets)
    if method in ("gloo", "gossipcc exact"):
        return 4 * layout.total
    return layout.total


def constants(check):
    """{"costs": {primitive: (delays, seconds)}, "window", "window_from", "cpu": {section/method:
    seconds per unit on one core}}
    from a check's results document."""
    info = check["info"]
    if info.get("mode") != "check":
        raise harness.HarnessError("--calibration: not a results file of `projection.py check`")
    layout = model_shapes.Layout("resnet50", check["args"]["scale"], 25.0)
    cores = info["cores"]
    per_message, windows, restarts, cpu = {p: [] for p in pm.PRIMITIVES}, [], [], {}
    for c in info["configs"].values():
        alpha, beta = c["fits"]["cross"]
        for p in pm.PRIMITIVES:
            per_message[p].append((c["delay"], c["link"][p]))
        if c["delay"] > 0 and beta < 0.9 * c["link"]["nic"]:
            windows.append(beta * 2 * c["delay"])
        if c["delay"] > 0:
            restarts.append(c["link"]["restart"])
        n = c["hosts"] * c["ranks_per_host"]
        for cell, per in c["local"].items():
            section = "ddp" if cell.endswith("DDP step") else "diloco"
            for method, t in per.items():
                key = f"{section}/{method}"
                if key not in MODELLED:
                    continue
                cpu.setdefault(key, []).append(t * min(1.0, cores / n) / units(key, layout))
    return {"costs": {p: pm.per_delay(v) for p, v in per_message.items()},
            "window": statistics.median(windows) if windows else STOCK_RMEM_MAX / 2,
            "window_from": "calibrated" if windows else "stock tcp_rmem max / 2",
            "restart": statistics.median(restarts) if restarts else pm.INITIAL_WINDOW,
            "cpu": {k: statistics.median(v) for k, v in cpu.items()}}


class Model:
    def __init__(self, name, shapes):
        self.name, self.shapes = name, [s for _, s in shapes]
        self.total = sum(math.prod(s) for s in self.shapes)
        self.buckets = [[self.shapes[i] for i in b] for b in model_shapes.ddp_buckets(self.shapes, BUCKET_BYTES)]
        self.bucket_bytes = [4 * sum(math.prod(s) for s in b) for b in self.buckets]
        self.nmr = sum(pm.psgd_sizes(b)[3] for b in self.buckets)


def idle_for(link, idle, floor):
    """The link as seen by connections idle for `idle` seconds between uses (restart_after)."""
    out = pm.Link(link.alpha, link.beta, link.nic, link.local_alpha, link.local_rate, exchange=link.exchange,
                  ring=link.ring, gloo=link.gloo, rtt=link.rtt)
    out.restart = pm.restart_after(idle, link.rtt, link.beta * link.rtt, floor)
    return out


def step_costs(model, world, link_, k, compute, every):
    """{column: (seconds per step, bytes per step per host)} (module's doc). A method's
    connections sit idle for a step's compute between its calls (DiLoCo's for H steps)."""
    cpu = k["cpu"]
    link = idle_for(link_, compute, k["restart"])
    outer_link = idle_for(link_, compute * every, k["restart"])
    byte = 4 * model.total

    def ddp_exact(w):
        return pm.bucketed(pm.gossipcc_allreduce(s, w, link, cpu["ddp/gossipcc exact"], idle=i < pm.COLLECTIVE_LANES)
                           for i, s in enumerate(model.bucket_bytes))

    def quantized(bits, w):
        c = cpu[f"ddp/quantized {bits} bits"]
        return pm.bucketed((pm.quantized_allreduce(s // 4, bits, w, link, c) for s in model.bucket_bytes), lanes=1)

    def push(w):
        return pm.push_sum_round(byte, w, link, cpu["diloco/push-sum round (gossipcc)"])

    psgd = pm.bucketed((pm.powersgd_allreduce(b, world, link, cpu["ddp/PowerSGD r4 (gossipcc)"])
                        for b in model.buckets), lanes=1)
    exact_sync = pm.gossipcc_allreduce(byte, world, outer_link, cpu["diloco/gossipcc exact"], idle=True)
    q4_sync = pm.quantized_allreduce(model.total, 4, world, outer_link, cpu["diloco/quantized 4 bits"])
    ddp_bytes = sum(pm.allreduce_bytes_per_host(s, world) for s in model.bucket_bytes)
    q_bytes = {b: sum(pm.quantized_bytes_per_host(s // 4, b, world) for s in model.bucket_bytes) for b in (8, 4)}
    outer = pm.World(world.hosts, 1)  # the hierarchical form's world: one rank per host
    return {
        "DDP (exact ring)": (compute + ddp_exact(world).total, ddp_bytes),
        "quantized 8 bits": (compute + quantized(8, world).total, q_bytes[8]),
        "quantized 4 bits": (compute + quantized(4, world).total, q_bytes[4]),
        "PowerSGD r4": (compute + psgd.total, sum(pm.powersgd_bytes_per_host(b, world) for b in model.buckets)),
        "push-sum (SGP)": (compute + push(world).total, pm.push_sum_bytes_per_host(byte, world)),
        "DiLoCo exact": (pm.diloco_step(compute, exact_sync.total, every),
                         pm.allreduce_bytes_per_host(byte, world) / every),
        "DiLoCo 4 bits": (pm.diloco_step(compute, q4_sync.total, every),
                          pm.quantized_bytes_per_host(model.total, 4, world) / every),
        "DDP, hierarchical": (compute + pm.hierarchical(ddp_exact, world, link, byte).total,
                              sum(pm.allreduce_bytes_per_host(s, outer) for s in model.bucket_bytes)),
        "4 bits, hierarchical": (compute + pm.hierarchical(lambda w: quantized(4, w), world, link, byte).total,
                                 sum(pm.quantized_bytes_per_host(s // 4, 4, outer) for s in model.bucket_bytes)),
        "push-sum, hierarchical": (compute + pm.hierarchical(push, world, link, byte).total,
                                   pm.push_sum_bytes_per_host(byte, outer)),
    }


def project(k, args):
    """Every row of the projection: {model, hosts, rate_gbit, delay_ms, link, costs}."""
    rows = []
    for name, shapes in MODELS.items():
        model = Model(name, shapes())
        compute = args.compute_124m if name == "124M" else args.compute_1b
        for hosts in HOSTS:
            world = pm.World(hosts, args.gpus_per_host)
            for rate in RATES_GBIT:
                for delay in DELAYS_MS:
                    link = pm.network_link(rate * 1e9, delay / 1e3, k["window"], k["costs"], args.streams,
                                           args.intra_alpha_us * 1e-6, args.intra_gbit * 1e9 / 8, k["restart"])
                    rows.append({"model": name, "parameters": model.total, "hosts": hosts, "rate_gbit": rate,
                                 "delay_ms": delay, "beta": link.beta, "compute": compute,
                                 "costs": step_costs(model, world, link, k, compute, args.diloco_h)})
    return rows


def run(args):
    if not args.calibration:
        raise harness.HarnessError("project needs --calibration: the results of `projection.py check`")
    for flag, v in (("--compute-124m", args.compute_124m), ("--compute-1b", args.compute_1b),
                    ("--intra-gbit", args.intra_gbit)):
        if not v > 0:
            raise harness.HarnessError(f"{flag} must be > 0, got {v}")
    for flag, v in (("--diloco-h", args.diloco_h), ("--streams", args.streams), ("--gpus-per-host", args.gpus_per_host)):
        if v < 1:
            raise harness.HarnessError(f"{flag} must be >= 1, got {v}")
    check = harness.read(args.calibration)
    k = constants(check)
    doc = {"format": harness.FORMAT, "benchmark": "projection", "refused": None,
           "created_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "commit": harness.commit_info(), "args": {a: v for a, v in vars(args).items() if not a.startswith("_")},
           "machine": harness.machine_info(),
           "info": {"mode": "project", "calibration": args.calibration, "calibration_commit": check["commit"],
                    "constants": k, "rows": project(k, args)}}
    path = harness.write(doc, args.results_dir)
    text = report(doc)
    print(text)
    print(f"\nresults: {path}", flush=True)
    return 0


def assumptions(doc):
    a, k = doc["args"], doc["info"]["constants"]
    cpu = ", ".join(f"{key} {v * 1e9:.3g} ns" for key, v in sorted(k["cpu"].items()))
    return "\n".join([
        f"Projection from {doc['info']['calibration']} (commit {(doc['info']['calibration_commit'].get('head') or '?')[:12]}).",
        f"- Hosts of {a['gpus_per_host']} ranks; no method is topology-aware: every rank's messages to other hosts "
        f"leave through its host's NIC (the hierarchical columns: reduce inside the host first, at "
        f"{a['intra_gbit']:g} Gbit/s and {a['intra_alpha_us']:g} us per message, assumed).",
        "- Per message (calibrated, delays x one-way delay + software): "
        + ", ".join(f"{p} {d:.2f} d + {o * 1e3:.2f} ms" for p, (d, o) in k["costs"].items())
        + f"; one stream's window "
        f"{k['window'] / 2**20:.2f} MiB ({k['window_from']}), {a['streams']} stream(s) per peer: beta = "
        "min(NIC x 1448/1514, streams x window / RTT).",
        "- A connection idle between calls restarts in slow start (Linux's slow start after idle): its window "
        "halved per retransmission timeout (RTT + 200 ms) of idle time, at least "
        f"{k['restart'] / 1024:.0f} KiB (calibrated after 3 s idle); idle for a step's compute (DiLoCo's "
        "connections: H steps'): every quantized scatter round and push-sum message, the first step of each "
        "DDP lane's first bucket and of DiLoCo's ring.",
        f"- Compute per step (given): 124M {a['compute_124m']:g} s, 1B {a['compute_1b']:g} s; communication is "
        "not overlapped with it (DDP's overlap with backward would hide up to the compute).",
        f"- CPU per unit on one core (calibrated on this machine, CPU tensors): {cpu} (per byte for exact, per "
        "element for quantized and push-sum, per n m r for PowerSGD).",
        f"- DiLoCo: a blocking outer sync every {a['diloco_h']} inner steps; DDP's buckets of 25 MiB, PowerSGD "
        "rank 4; push-sum: one round (one peer per rank) per step."])


def report(doc):
    rows = doc["info"]["rows"]
    t_rows, b_rows = [], []
    for r in rows:
        head = [r["model"], r["hosts"], f"{r['rate_gbit']:g}", f"{r['delay_ms']:g}", f"{r['beta'] * 8 / 1e9:.2f}"]
        ddp = r["costs"]["DDP (exact ring)"][0]
        t_rows.append(head + [f"{r['costs'][c][0]:.2f}" + ("" if c == COLUMNS[0] else f" ({ddp / r['costs'][c][0]:.1f}x)")
                              for c in COLUMNS])
        b_rows.append(head[:4] + [f"{r['costs'][c][1] / 1e6:.1f}" for c in COLUMNS])
    head = ["model", "hosts", "Gbit/s", "delay (ms)", "stream (Gbit/s)"]
    return "\n\n".join([
        assumptions(doc),
        "Time per step, s (speed-up against DDP's exact ring):",
        harness.markdown_table(head + list(COLUMNS), t_rows),
        "Bytes per step per host, MB (what its NIC sends):",
        harness.markdown_table(head[:4] + list(COLUMNS), b_rows)])
