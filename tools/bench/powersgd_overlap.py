#!/usr/bin/env python3
"""Benchmark (e): does gossipcc's PowerSGD policy hook overlap backward? DDP step time with the
overlapping policy hook, with the old blocking one, and with PyTorch's powerSGD_hook on gloo,
against backward alone and the compressed all-reduce alone, in one run (issue 30, item 4).

    tools/bench/run.sh powersgd_overlap [--hosts 2 [--ranks-per-host 1] | --ranks 2] [--network 100mbit] [--width 256] [--layers 32]
                                        [--batch 128] [--bucket-cap-mb 1] [--psgd-rank 2]
                                        [--steps 20] [--wait 1800] [--wait-load 1.5]
                                        [--trials 5] [--max-load 0.5] [--allow-load] [--results-dir DIR]

Every rank is its own host by default (tools/emulated_cluster.py; --hosts H --ranks-per-host G:
G ranks sharing each host's link), one torch thread per rank. The model is
an MLP of --layers square Linear(W, W) + ReLU layers and a Linear(W, 10) head, on random
inputs (batch --batch per rank); DDP buckets of --bucket-cap-mb (DDP's first bucket too), so
that a bucket's communication can overlap the backward of the layers before it. The defaults
(32 layers of 256 x 256, batch 128, 8 buckets) make backward and the compressed all-reduce take
about as long, and the all-reduce mostly link time: its 170 KB per step are well above the
shaper's 64 KB burst (at 100 Mbit/s). PowerSGD rank --psgd-rank, start_iter --start-iter (exact
all-reduce before it) in all three variants:

  overlap   DDP on a gossipcc group with policy "powersgd:rank=R,start_iter=S": the comm hook
            that gossipcc installs (gossipcc.hooks.powerSGD_hook, the native asynchronous
            powersgd_allreduce; its future completes off the Python thread).
  blocking  DDP on a gossipcc group (policy exact) with BLOCKING_HOOK below: the policy hook as it
            was before 741b47b, which ran the whole compressed all-reduce inside the hook
            (PowerSGD.allreduce, the blocking binding) and returned a completed future.
  torch     DDP on gloo with torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook, in one
            bucket (with several, gloo aborts here: see the worker), so it cannot overlap.

and the references, same model, batch and gradients:

  backward  the model without DDP: forward, backward, optimizer step (no communication).
  ddp-nocomm  DDP (gossipcc group, the same buckets) with a hook that returns the bucket as it
            is: DDP's own cost (copying gradients into buckets and back), no communication.
  comm      the compressed all-reduce alone: the native powersgd_allreduce (one call, every
            parameter's gradient of one step, on gossipcc), past its start_iter, waited for.
  comm-buckets  the same gradients in DDP's buckets: one call per bucket (as the hooks make
            them), all issued, then waited for.

Each variant first runs start_iter + 3 untimed steps (DDP's bucket rebuild after step 1,
PowerSGD's exact warm-up), then --trials trials (tools/bench/harness.py), each running every
variant for --steps timed steps in turn (trial t starts at variant t: the order rotates from
trial to trial), the load recorded around each trial; an untimed barrier (gloo) precedes each
step so that the ranks start together. A step's time is the slowest rank's; a trial's sample is
the median over its steps; a variant's figure is the median over the trials with its min-max,
and every ratio (bwd+comm / max(backward, comm) and the others) the median of the ratios
computed within each trial. "bwd+comm" is the time of
loss.backward() (DDP returns from it once every bucket's future has completed): the part of a
step that communication can overlap; "computing" is its part until the first layer's weight
gradient exists (a tensor hook), after which backward only waits for the buckets. The goal:
bwd+comm <= 1.15 * max(backward, comm), with "backward" the model's without DDP and "comm" the
one-call figure. The shaper (tbf) lets a 64 KB burst through at veth speed, so "its bytes at
the link rate" can exceed the measured comm time, and traffic spread over backward in small
buckets may never wait for the link at all.
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import harness  # noqa: E402

VARIANTS = ("overlap", "blocking", "torch")
REFERENCES = ("backward", "ddp-nocomm", "comm", "comm-buckets")
GOAL = 1.15  # bwd+comm <= GOAL * max(backward, comm)


def blocking_policy_hook(state, bucket):
    """BLOCKING_HOOK: the policy hook as it was before 741b47b (the baseline the
    overlapping hook replaced), the same code (its comments and key lookup aside): the whole compressed all-reduce
    runs here, on the Python thread inside backward, through the blocking binding
    PowerSGD.allreduce(pg, tensors, keys); the returned future is already complete. `state` is a
    gossipcc.hooks.PowerSGDState made by PowerSGDState.from_policy."""
    import torch
    grads = bucket.gradients()
    keys = state.parameter_keys(bucket.parameters())  # "param<i>": i the position in the model
    contiguous = [g if g.is_contiguous() else g.contiguous() for g in grads]
    state.powersgd.allreduce(state.backend, contiguous, keys)
    for g, c in zip(grads, contiguous):
        if g is not c:
            g.copy_(c)
    future = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


def noop_hook(state, bucket):
    import torch
    future = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


def make_model(width, layers, seed=0):
    import torch
    torch.manual_seed(seed)
    mods = []
    for _ in range(layers):
        mods += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*mods, torch.nn.Linear(width, 10))


def worker(args):
    import datetime
    import torch
    import torch.distributed as dist
    import gossipcc
    from gossipcc import _C
    from gossipcc.hooks import PowerSGDState
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as torch_powersgd
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    rank, n = common.worker_env()
    timeout = datetime.timedelta(seconds=args.timeout)
    dist.init_process_group("gloo", init_method="env://", timeout=timeout)  # torch's variant and barriers
    policy = f"powersgd:rank={args.psgd_rank},start_iter={args.start_iter}"
    gossipcc.configure(allreduce=policy)
    overlap_group = dist.new_group(backend="gossipcc", timeout=timeout)
    gossipcc.configure(allreduce="exact", new_groups_only=True)  # overlap_group keeps its policy
    plain_group = dist.new_group(backend="gossipcc", timeout=timeout)  # blocking hook and comm alone
    plain_backend = gossipcc.get_backend_object(plain_group)
    options = _C.powersgd_policy_options(policy)
    cap = args.bucket_cap_mb

    modules = {name: make_model(args.width, args.layers) for name in VARIANTS + ("backward", "ddp-nocomm")}
    models = {"backward": modules["backward"]}

    def ddp(module, group, cap_mb):
        # DDP's first bucket (the last layers) has a cap of its own (1 MiB): the same cap here,
        # so every bucket holds about cap_mb of gradients.
        saved = dist._DEFAULT_FIRST_BUCKET_BYTES
        dist._DEFAULT_FIRST_BUCKET_BYTES = int(cap_mb * (1 << 20))
        try:
            return DDP(module, process_group=group, bucket_cap_mb=cap_mb)
        finally:
            dist._DEFAULT_FIRST_BUCKET_BYTES = saved

    models["overlap"] = ddp(modules["overlap"], overlap_group, cap)
    state = getattr(models["overlap"], "_gossipcc_policy_state", None)
    if state is None:
        raise RuntimeError("gossipcc did not install its PowerSGD policy hook on the overlap variant's DDP model")
    models["blocking"] = ddp(modules["blocking"], plain_group, cap)
    bucket_params = []  # each bucket's parameter indices as DDP hands them over (blocking variant)

    def recording_blocking_hook(state, bucket):
        bucket_params.append([int(k[5:]) for k in state.parameter_keys(bucket.parameters())])
        return blocking_policy_hook(state, bucket)

    models["blocking"].register_comm_hook(PowerSGDState.from_policy(plain_backend, modules["blocking"], options),
                                          recording_blocking_hook)
    # PyTorch's hook on gloo gets one bucket: with several, it issues a bucket's second
    # all-reduce from the first one's callback on gloo's thread, the ranks can issue them in
    # different orders, and gloo aborts ("op.preamble.length <= op.nbytes"; tools/train/methods.py).
    models["torch"] = ddp(modules["torch"], None, 1 << 20)
    models["torch"].register_comm_hook(
        torch_powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=args.psgd_rank,
                                     start_powerSGD_iter=args.start_iter), torch_powersgd.powerSGD_hook)
    # DDP's own cost, without communication: a hook that hands the bucket back as it is.
    models["ddp-nocomm"] = ddp(modules["ddp-nocomm"], plain_group, cap)
    models["ddp-nocomm"].register_comm_hook(None, noop_hook)
    opts = {name: torch.optim.SGD(m.parameters(), lr=1e-3) for name, m in models.items()}
    gen = torch.Generator().manual_seed(1000 + rank)
    batches = [(torch.randn(args.batch, args.width, generator=gen), torch.randint(0, 10, (args.batch,), generator=gen))
               for _ in range(8)]

    # When the first layer's weight gradient has been computed, backward's compute is over
    # (the input needs no gradient): what follows inside loss.backward() is DDP waiting for its
    # buckets. A tensor hook sees it without touching DDP or the comm hooks.
    computed = {}
    for name, module in modules.items():
        module[0].weight.register_hook(lambda grad, name=name: computed.__setitem__(name, time.perf_counter()))

    def train_step(name, i):
        x, y = batches[i % len(batches)]
        t0 = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(models[name](x), y)
        opts[name].zero_grad()
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opts[name].step()
        t3 = time.perf_counter()
        return {"step": t3 - t0, "bwd": t2 - t1, "computed": computed[name] - t1}

    # The compressed all-reduce alone: the gradients of one step of the plain model, averaged by
    # the native collective with a state of its own; each call on a fresh copy of them.
    train_step("backward", 0)
    grads = [p.grad.detach().clone() for p in modules["backward"].parameters()]
    work = [g.clone() for g in grads]
    comm_state = _C.PowerSGD(options)
    keys = [f"param{i}" for i in range(len(grads))]

    buckets_state = _C.PowerSGD(options)
    buckets = None  # DDP's buckets, from the blocking variant's last warm-up step (after the rebuild)

    def comm_call(name):
        for w, g in zip(work, grads):
            w.copy_(g)
        t0 = time.perf_counter()
        if name == "comm":
            plain_backend.powersgd_allreduce(work, None, comm_state, keys).wait()
        else:  # one call per DDP bucket, in DDP's order, all issued before the first wait
            calls = [plain_backend.powersgd_allreduce([work[i] for i in b], None, buckets_state, [keys[i] for i in b])
                     for b in buckets]
            for c in calls:
                c.wait()
        return {"step": time.perf_counter() - t0}

    def run(name, i):
        return comm_call(name) if name.startswith("comm") else train_step(name, i)

    names = VARIANTS + REFERENCES
    for name in names:  # warm-up: DDP's bucket rebuild, PowerSGD's exact steps, allocator
        for i in range(args.start_iter + 3):
            dist.barrier()
            bucket_params.clear()
            run(name, i)
            if name == "blocking":
                buckets = list(bucket_params)
    rounds = []
    probe = harness.LoadProbe()
    for trial in range(args.trials):
        order = harness.trial_order(names, trial)
        got = {}
        dist.barrier()
        probe.start()
        for name in order:
            times, tx0 = [], common.tx_counters()
            for i in range(args.steps):
                dist.barrier()
                times.append(run(name, i))
            tx1 = common.tx_counters()
            got[name] = {"times": times, "tx_per_step": None if tx0[0] is None else (tx1[0] - tx0[0]) / args.steps,
                         "host_tx_per_step": None if tx0[1] is None else (tx1[1] - tx0[1]) / args.steps}
        dist.barrier()
        rounds.append({"order": list(order), "load": probe.stop(), "runs": got})
    dist.barrier()
    with open(args.out, "w") as f:
        json.dump({"rank": rank, "rounds": rounds, "params": sum(p.numel() for p in modules["backward"].parameters()),
                   "buckets": len(buckets),
                   "torch": torch.__version__}, f)
    dist.destroy_process_group()


CELL = "overlap"  # the benchmark's one configuration
METRICS = ("step", "bwd", "computed")


def trial_samples(docs, trial):
    """One trial's samples from its ranks' documents: per variant and reference the median over
    the trial's steps of the slowest rank's time, for the whole step, backward ("bwd") and its
    computing part (s; comm has the step only); bytes sent per rank and per host per step (None
    without tx counters); and for each variant the trial's own ratios: bwd / max(backward, comm),
    bwd / (backward + comm) and step / step bound (see table_rows)."""
    out = {}
    runs_of = {name: [doc["rounds"][trial]["runs"][name] for doc in docs] for name in docs[0]["rounds"][trial]["runs"]}
    for name, runs in runs_of.items():
        steps = len(runs[0]["times"])
        sample = {key: common.median([max(run["times"][i][key] for run in runs) for i in range(steps)])
                  for key in METRICS if key in runs[0]["times"][0]}
        for key in ("tx_per_step", "host_tx_per_step"):
            sample[key] = (sum(run[key] for run in runs) / len(runs) if runs[0].get(key) is not None else None)
        out[name] = sample
    if "backward" in out and "comm" in out:
        backward, comm = out["backward"]["bwd"], out["comm"]["step"]
        bound = max(backward, comm)
        step_bound = out["backward"]["step"] - backward + bound
        for name in VARIANTS:
            if name in out:
                v = out[name]
                v["bwd_over_bound"] = v["bwd"] / bound
                v["bwd_over_sum"] = v["bwd"] / (backward + comm)
                v["step_over_step_bound"] = v["step"] / step_bound
    return {CELL: out}


def record(run, docs):
    run.cell(CELL)
    run.info.update(params=docs[0]["params"], buckets=docs[0]["buckets"])
    for trial in range(len(docs[0]["rounds"])):
        r = docs[0]["rounds"][trial]
        run.add_trial(trial_samples(docs, trial), r["load"], r["order"])


def table_rows(doc, bytes_per_second=None):
    """The table's rows (figures in ms, each the median over the trials): one per variant (step;
    bwd+comm with its min-max over the trials, and how long backward computed (until the first
    layer's weight gradient); bwd+comm / max(backward, comm) and the goal; bwd+comm / (backward
    + comm), 1.0 where nothing overlaps; step / step bound; KB sent per rank and per host per
    step), then the
    references. Every ratio is the median of the per-trial ratios. The step bound is the step
    without DDP with its backward replaced by max(backward, comm): forward and optimizer step
    overlap nothing."""
    s = doc["summary"]["cells"][CELL]["methods"]

    def ms(x):
        return harness.cell_text(x, 1e3, 1)

    def med(x):
        return "-" if x is None else f"{1e3 * x['median']:.1f}"

    def kb(x):
        return "-" if x is None else f"{x['median'] / 1e3:.1f}"

    rows = []
    for name in (v for v in VARIANTS if v in s):
        v = s[name]
        ratio = v["bwd_over_bound"]
        rows.append([name, med(v["step"]), ms(v["bwd"]), med(v["computed"]), harness.cell_text(ratio, 1, 2),
                     "yes" if ratio["median"] <= GOAL else "no", harness.cell_text(v["bwd_over_sum"], 1, 2),
                     harness.cell_text(v["step_over_step_bound"], 1, 2), kb(v["tx_per_step"]),
                     kb(v.get("host_tx_per_step"))])
    for name, label in (("backward", "backward alone (no DDP)"), ("ddp-nocomm", "DDP, no communication")):
        if name in s:
            rows.append([label, med(s[name]["step"]), ms(s[name]["bwd"]), med(s[name]["computed"]),
                         "", "", "", "", kb(s[name]["tx_per_step"]), kb(s[name].get("host_tx_per_step"))])
    for name, label in (("comm", "comm alone (powersgd_allreduce)"), ("comm-buckets", "comm alone, in DDP's buckets")):
        if name not in s:
            continue
        wire = ""
        if bytes_per_second and s[name]["tx_per_step"] is not None:
            wire = f" (its bytes at the link rate: {1e3 * s[name]['tx_per_step']['median'] / bytes_per_second:.1f})"
        rows.append([label, "", ms(s[name]["step"]) + wire, "", "", "", "", "", kb(s[name]["tx_per_step"]),
                     kb(s[name].get("host_tx_per_step"))])
    return rows


HEADER = ["variant", "step (ms)", "**bwd+comm (ms)**", "of it, computing (ms)",
          "**bwd+comm / max(backward, comm)**", f"<= {GOAL:.2f}?", "bwd+comm / (backward + comm)",
          "step / step bound", "KB sent/rank/step", "KB sent/host/step"]


link_bytes_per_second = common.link_bytes_per_second


def verdict(doc):
    """The closing lines: the bound, the goal for the overlapping hook, the other ratios (medians
    of the per-trial ratios)."""
    s = doc["summary"]["cells"][CELL]["methods"]
    trials = doc["trials"]
    backward, comm = s["backward"]["bwd"]["median"], s["comm"]["step"]["median"]
    o = s["overlap"]["bwd_over_bound"]["median"]

    def per_trial(a, b, metric):
        return harness.ratio_stats(trials, CELL, a, b, metric)["median"]

    lines = [f"max(backward {1e3 * backward:.1f}, comm {1e3 * comm:.1f}) = {1e3 * max(backward, comm):.1f} ms "
             f"(medians over the trials); backward + comm = {1e3 * (backward + comm):.1f} ms",
             f"goal, overlap's bwd+comm <= {GOAL:.2f} x max(backward, comm): {o:.2f}: "
             f"{'met' if o <= GOAL else 'NOT met'}",
             f"overlap / blocking: {per_trial('overlap', 'blocking', 'bwd'):.2f} (bwd+comm), "
             f"{per_trial('overlap', 'blocking', 'step'):.2f} (step); torch / overlap: "
             f"{per_trial('torch', 'overlap', 'step'):.2f} (step)"]
    return "\n".join(lines)


def report(doc):
    a = doc["args"]
    head = (f"PowerSGD overlap: {common.args_world(a)}, network {a['network']}, MLP {a['layers']} x {a['width']}^2 + head, "
            f"batch {a['batch']}/rank, PowerSGD rank {a['psgd_rank']}, start_iter {a['start_iter']}, "
            f"{a['steps']} steps per variant per trial; {doc['info']['params']} parameters "
            f"({doc['info']['params'] * 4 / (1 << 20):.1f} MiB of gradients), {doc['info']['buckets']} DDP buckets")
    rows = table_rows(doc, common.link_bytes_per_second(a["network"]) if "network" in a else None)
    return "\n\n".join([harness.preamble(doc), head, harness.markdown_table(HEADER, rows), verdict(doc),
                         harness.trials_table(doc)])


def plot(doc, path):
    """bwd+comm per variant and reference: each trial's sample (points) and the median (bar),
    with max(backward, comm) and the goal as lines."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    s = doc["summary"]["cells"][CELL]["methods"]
    names = [n for n in VARIANTS + REFERENCES if n in s]
    key = {n: "step" if n.startswith("comm") else "bwd" for n in names}
    fig, ax = plt.subplots(figsize=(8, 4.5))
    xs = list(range(len(names)))
    ax.bar(xs, [1e3 * s[n][key[n]]["median"] for n in names], color="lightsteelblue", label="median of trials")
    for x, n in zip(xs, names):
        ys = [1e3 * v for v in harness.samples_of(doc["trials"], CELL, n, key[n])]
        ax.plot([x] * len(ys), ys, "k.", label="trials" if x == 0 else None)
    bound = max(s["backward"]["bwd"]["median"], s["comm"]["step"]["median"])
    ax.axhline(1e3 * bound, color="gray", linewidth=1, label="max(backward, comm)")
    ax.axhline(1e3 * GOAL * bound, color="red", linewidth=1, label=f"goal: {GOAL:.2f} x max(backward, comm)")
    ax.set(xticks=xs, ylabel="bwd+comm (ms; comm: the call)")
    ax.set_xticklabels(names, fontsize=8)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def wait_for_quiet(max_load, wait_s):
    """Waits until the 1-minute load average is below max_load, checking every 15 s, for at most
    wait_s seconds; returns the load seen last and whether it was below."""
    deadline = time.time() + wait_s
    while True:
        load = harness.loadavg()[0]
        if load < max_load or time.time() >= deadline:
            return load, load < max_load
        print(f"  load {load:.2f} >= {max_load}: waiting (up to {deadline - time.time():.0f} s more)", flush=True)
        time.sleep(15)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    common.add_cluster_arguments(p, hosts=2, network="100mbit")
    p.add_argument("--width", type=int, default=256, help="W: the MLP's square layers are W x W")
    p.add_argument("--layers", type=int, default=32, help="square layers")
    p.add_argument("--batch", type=int, default=128, help="per rank")
    p.add_argument("--psgd-rank", type=int, default=2, help="PowerSGD matrix approximation rank")
    p.add_argument("--start-iter", type=int, default=10, help="PowerSGD's exact warm-up steps (all variants)")
    p.add_argument("--bucket-cap-mb", type=float, default=1.0, help="DDP's bucket cap, its first bucket's too")
    p.add_argument("--steps", type=int, default=20, help="timed steps per variant per trial")
    p.add_argument("--timeout", type=float, default=120, help="seconds for any collective")
    p.add_argument("--wait-load", type=float, default=1.5,
                   help="with --wait: wait for the 1-min load average to drop below this")
    p.add_argument("--wait", type=float, default=0, help="seconds to wait for --wait-load before measuring anyway")
    p.add_argument("--plot", metavar="PNG", help="also write a plot (bwd+comm per variant, every trial) here")
    harness.add_arguments(p)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    common.resolve_cluster_arguments(args, "powersgd_overlap")
    if args.wait > 0:
        load, quiet = wait_for_quiet(args.wait_load, args.wait)
        print(f"load {load:.2f}: {'below' if quiet else 'still not below'} {args.wait_load}, measuring", flush=True)
    print(f"PowerSGD overlap: {common.world_text(args.hosts, args.ranks_per_host)}, network {args.network}, MLP {args.layers} x {args.width}^2 + head, "
          f"batch {args.batch}/rank, PowerSGD rank {args.psgd_rank}, start_iter {args.start_iter}, "
          f"{args.steps} steps x {args.trials} trials per variant", flush=True)
    run = harness.Run("powersgd_overlap", args, VARIANTS + REFERENCES, "overlap", "bwd")
    flags = ["--width", str(args.width), "--layers", str(args.layers), "--batch", str(args.batch),
             "--psgd-rank", str(args.psgd_rank), "--start-iter", str(args.start_iter),
             "--bucket-cap-mb", str(args.bucket_cap_mb), "--steps", str(args.steps),
             "--trials", str(args.trials), "--timeout", str(args.timeout)]
    try:
        with common.make_cluster(args.hosts, args.ranks_per_host, args.network) as cluster:
            docs = common.run_ranks(cluster, os.path.abspath(__file__), flags, timeout=1800)
    except common.NamespacesUnavailable as e:
        common.fail(f"powersgd_overlap: emulated network not available: {e}")
    record(run, docs)
    doc = run.finish(report)
    if args.plot:
        plot(doc, args.plot)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
