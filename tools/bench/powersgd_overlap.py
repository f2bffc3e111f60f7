#!/usr/bin/env python3
"""Benchmark (e): does gossipcc's PowerSGD policy hook overlap backward? DDP step time with the
overlapping policy hook, with the old blocking one, and with PyTorch's powerSGD_hook on gloo,
against backward alone and the compressed all-reduce alone, in one run (issue 30, item 4).

    tools/bench/run.sh powersgd_overlap [--ranks 2] [--network 100mbit] [--width 256] [--layers 32]
                                        [--batch 128] [--bucket-cap-mb 1] [--psgd-rank 2]
                                        [--steps 20] [--repeats 5] [--wait 1800] [--json FILE]

Every rank is its own host (tools/emulated_cluster.py), one torch thread per rank. The model is
an MLP of --layers square Linear(W, W) + ReLU layers and a Linear(W, 10) head, on random
inputs (batch --batch per rank); DDP buckets of --bucket-cap-mb (DDP's first bucket too), so
that a bucket's communication can overlap the backward of the layers before it. The defaults
(32 layers of 256 x 256, batch 128, 8 buckets) make backward and the compressed all-reduce take
about as long, and the all-reduce mostly link time: its 170 KB per step are well above the
shaper's 64 KB burst (at 100 Mbit/s). PowerSGD rank --psgd-rank, start_iter --start-iter (exact
all-reduce before it) in all three variants:

  overlap   DDP on a gossipcc group with policy "powersgd:rank=R,start_iter=S": the comm hook
            that gossipcc installs (gossipcc.powersgd.policy_hook, the native asynchronous
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
PowerSGD's exact warm-up), then --repeats rounds, each running every variant for --steps timed
steps in turn (the order rotates from round to round); an untimed barrier (gloo) precedes each
step so that the ranks start together. A step's time is the slowest rank's; a variant's figure
is the median over its rounds of the round's median step. "bwd+comm" is the time of
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

VARIANTS = ("overlap", "blocking", "torch")
REFERENCES = ("backward", "ddp-nocomm", "comm", "comm-buckets")
GOAL = 1.15  # bwd+comm <= GOAL * max(backward, comm)


def blocking_policy_hook(state, bucket):
    """BLOCKING_HOOK: gossipcc.powersgd.policy_hook as it was before 741b47b (the baseline the
    overlapping hook replaced), the same code (its comments aside): the whole compressed all-reduce
    runs here, on the Python thread inside backward, through the blocking binding
    PowerSGD.allreduce(pg, tensors, keys); the returned future is already complete. `state` is a
    gossipcc.powersgd.PolicyHookState."""
    import torch
    grads = bucket.gradients()
    keys = [f"param{state.param_index[id(p)]}" for p in bucket.parameters()]
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
    from gossipcc import powersgd as gpowersgd
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
        bucket_params.append([state.param_index[id(p)] for p in bucket.parameters()])
        return blocking_policy_hook(state, bucket)

    models["blocking"].register_comm_hook(gpowersgd.PolicyHookState(plain_backend, modules["blocking"], options),
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
    for rep in range(args.repeats):
        order = names[rep % len(names):] + names[:rep % len(names)]
        got = {}
        for name in order:
            times, tx0 = [], common.rank_tx_bytes()
            for i in range(args.steps):
                dist.barrier()
                times.append(run(name, i))
            tx1 = common.rank_tx_bytes()
            got[name] = {"times": times, "tx_per_step": None if tx0 is None else (tx1 - tx0) / args.steps}
        rounds.append(got)
    dist.barrier()
    with open(args.out, "w") as f:
        json.dump({"rank": rank, "rounds": rounds, "params": sum(p.numel() for p in modules["backward"].parameters()),
                   "buckets": len(buckets),
                   "torch": torch.__version__}, f)
    dist.destroy_process_group()


def summarize(docs):
    """Per variant and reference: the median over rounds of each round's median (over steps) of
    the slowest rank's time, for the whole step and for backward (s); the spread of the round
    medians; bytes sent per rank per step (None without tx counters)."""
    out = {}
    names = list(docs[0]["rounds"][0])
    for name in names:
        per_round = {"step": [], "bwd": [], "computed": []}
        tx = []
        for r in range(len(docs[0]["rounds"])):
            runs = [doc["rounds"][r][name] for doc in docs]
            steps = len(runs[0]["times"])
            for key in per_round:
                if key in runs[0]["times"][0]:
                    per_round[key].append(common.median([max(run["times"][i][key] for run in runs)
                                                         for i in range(steps)]))
            if runs[0]["tx_per_step"] is not None:
                tx.append(sum(run["tx_per_step"] for run in runs) / len(runs))
        out[name] = {key: common.median(v) for key, v in per_round.items() if v}
        out[name]["round_medians"] = per_round
        out[name]["tx_per_step"] = common.median(tx) if tx else None
    return out


def table_rows(s, bytes_per_second=None):
    """The table's rows (figures in ms): one per variant (step; bwd+comm, the spread of its
    round medians, and how long backward computed (until the first layer's weight gradient);
    bwd+comm / max(backward, comm) and the goal; bwd+comm / (backward + comm),
    1.0 where nothing overlaps; step / step bound; KB sent per rank per step), then the
    references. The step bound is the step without DDP with its backward replaced by
    max(backward, comm): forward and optimizer step overlap nothing. Also returns
    max(backward, comm) and the step bound (s)."""
    backward, comm = s["backward"]["bwd"], s["comm"]["step"]
    bound = max(backward, comm)
    step_bound = s["backward"]["step"] - backward + bound

    def ms(x):
        return f"{1e3 * x:.1f}"

    def kb(x):
        return "-" if x is None else f"{x / 1e3:.1f}"

    def spread(xs):
        return f"{1e3 * min(xs):.1f}-{1e3 * max(xs):.1f}"

    rows = []
    for name in (v for v in VARIANTS if v in s):
        v = s[name]
        ratio = v["bwd"] / bound
        rows.append([name, ms(v["step"]), ms(v["bwd"]), spread(v["round_medians"]["bwd"]), ms(v["computed"]),
                     f"{ratio:.2f}",
                     "yes" if ratio <= GOAL else "no", f"{v['bwd'] / (backward + comm):.2f}",
                     f"{v['step'] / step_bound:.2f}", kb(v["tx_per_step"])])
    for name, label in (("backward", "backward alone (no DDP)"), ("ddp-nocomm", "DDP, no communication")):
        if name in s:
            rows.append([label, ms(s[name]["step"]), ms(s[name]["bwd"]), spread(s[name]["round_medians"]["bwd"]),
                         ms(s[name]["computed"]), "", "", "", "", kb(s[name]["tx_per_step"])])
    for name, label in (("comm", "comm alone (powersgd_allreduce)"), ("comm-buckets", "comm alone, in DDP's buckets")):
        if name not in s:
            continue
        wire = ""
        if bytes_per_second and s[name]["tx_per_step"] is not None:
            wire = f" (its bytes at the link rate: {1e3 * s[name]['tx_per_step'] / bytes_per_second:.1f})"
        rows.append([label, "", ms(s[name]["step"]) + wire, spread(s[name]["round_medians"]["step"]),
                     "", "", "", "", "", kb(s[name]["tx_per_step"])])
    return rows, bound, step_bound


HEADER = ["variant", "step (ms)", "**bwd+comm (ms)**", "bwd+comm, round medians (ms)", "of it, computing (ms)",
          "**bwd+comm / max(backward, comm)**", f"<= {GOAL:.2f}?", "bwd+comm / (backward + comm)",
          "step / step bound", "KB sent/rank/step"]


def link_bytes_per_second(network):
    """The preset's per-host rate in bytes/s, or None (unshaped, loopback)."""
    import emulated_cluster
    rate, _ = emulated_cluster.parse_network(network) if network != "local" else (None, None)
    return emulated_cluster.rate_bits_per_second(rate) / 8 if rate else None


def verdict(s, bound):
    """The closing lines: the bound, the goal for the overlapping hook, the other ratios."""
    backward, comm = s["backward"]["bwd"], s["comm"]["step"]
    o = s["overlap"]["bwd"] / bound
    lines = [f"max(backward {1e3 * backward:.1f}, comm {1e3 * comm:.1f}) = {1e3 * bound:.1f} ms; "
             f"backward + comm = {1e3 * (backward + comm):.1f} ms",
             f"goal, overlap's bwd+comm <= {GOAL:.2f} x max(backward, comm): {o:.2f}: "
             f"{'met' if o <= GOAL else 'NOT met'}",
             f"overlap / blocking: {s['overlap']['bwd'] / s['blocking']['bwd']:.2f} (bwd+comm), "
             f"{s['overlap']['step'] / s['blocking']['step']:.2f} (step); torch / overlap: "
             f"{s['torch']['step'] / s['overlap']['step']:.2f} (step)"]
    return "\n".join(lines)


def wait_for_quiet(max_load, wait_s):
    """Waits until the 1-minute load average is below max_load, checking every 15 s, for at most
    wait_s seconds; returns the load seen last and whether it was below."""
    deadline = time.time() + wait_s
    while True:
        load = float(common.load_average().split()[0])
        if load < max_load or time.time() >= deadline:
            return load, load < max_load
        print(f"  load {load:.2f} >= {max_load}: waiting (up to {deadline - time.time():.0f} s more)", flush=True)
        time.sleep(15)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--network", default="100mbit",
                   help="an emulated_cluster preset, or local (loopback, no namespaces)")
    p.add_argument("--width", type=int, default=256, help="W: the MLP's square layers are W x W")
    p.add_argument("--layers", type=int, default=32, help="square layers")
    p.add_argument("--batch", type=int, default=128, help="per rank")
    p.add_argument("--psgd-rank", type=int, default=2, help="PowerSGD matrix approximation rank")
    p.add_argument("--start-iter", type=int, default=10, help="PowerSGD's exact warm-up steps (all variants)")
    p.add_argument("--bucket-cap-mb", type=float, default=1.0, help="DDP's bucket cap, its first bucket's too")
    p.add_argument("--steps", type=int, default=20, help="timed steps per variant per round")
    p.add_argument("--repeats", type=int, default=5, help="rounds, the variants' order rotating")
    p.add_argument("--timeout", type=float, default=120, help="seconds for any collective")
    p.add_argument("--max-load", type=float, default=1.5, help="wait for the 1-min load average to drop below this")
    p.add_argument("--wait", type=float, default=0, help="seconds to wait for --max-load before measuring anyway")
    p.add_argument("--json", metavar="FILE", help="also write the summary here")
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    if args.wait > 0:
        load, quiet = wait_for_quiet(args.max_load, args.wait)
        print(f"load {load:.2f}: {'below' if quiet else 'still not below'} {args.max_load}, measuring", flush=True)
    print(f"PowerSGD overlap: {args.ranks} ranks, network {args.network}, MLP {args.layers} x {args.width}^2 + head, "
          f"batch {args.batch}/rank, PowerSGD rank {args.psgd_rank}, start_iter {args.start_iter}, "
          f"{args.steps} steps x {args.repeats} rounds per variant", flush=True)
    load0 = common.load_average()
    t0 = time.time()
    flags = ["--width", str(args.width), "--layers", str(args.layers), "--batch", str(args.batch),
             "--psgd-rank", str(args.psgd_rank), "--start-iter", str(args.start_iter),
             "--bucket-cap-mb", str(args.bucket_cap_mb), "--steps", str(args.steps),
             "--repeats", str(args.repeats), "--timeout", str(args.timeout)]
    try:
        with common.make_cluster(args.ranks, args.network) as cluster:
            docs = common.run_ranks(cluster, os.path.abspath(__file__), flags, timeout=1800)
    except common.NamespacesUnavailable as e:
        common.fail(f"powersgd_overlap: emulated network not available: {e}")
    load1 = common.load_average()
    s = summarize(docs)
    rows, bound, step_bound = table_rows(s, link_bytes_per_second(args.network))
    print(f"\n{docs[0]['params']} parameters ({docs[0]['params'] * 4 / (1 << 20):.1f} MiB of gradients), "
          f"{docs[0]['buckets']} DDP buckets, torch {docs[0]['torch']}; {time.time() - t0:.0f} s; "
          f"load average {load0} -> {load1}\n")
    print(common.markdown_table(HEADER, rows))
    print()
    print(verdict(s, bound))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "summary": s, "load": [load0, load1]}, f, indent=1)


if __name__ == "__main__":
    main()
