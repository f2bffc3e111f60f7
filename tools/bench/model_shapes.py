#!/usr/bin/env python3
"""Benchmark (g): the collectives and outer syncs of training on real model shapes - ResNet-50
(25,557,032 parameters) and a GPT-2-small-sized transformer (124,439,808) - on the emulated hosts,
against gloo's all-reduce of the same tensors in the same run.

    tools/bench/run.sh model_shapes [--model resnet50|gpt2|both] [--scale 1.0] [--network 1gbit]
                                    [--hosts 4 [--ranks-per-host 1] | --ranks 4] [--iterations 1] [--bucket-mb 25]
                                    [--trials 5] [--max-load 0.5] [--allow-load] [--results-dir DIR]

Shapes: resnet50_shapes() walks torchvision's ResNet-50 (conv1, bn1, the four stages of [3, 4, 6, 3]
bottleneck blocks with their downsample convolutions and batch norms, fc); gpt2_shapes() a
GPT-2-small-sized transformer (12 layers, d = 768, vocabulary 50257, context 1024, the output
layer tied to the token embedding, Linear weights as [out, in]). --scale s shrinks every tensor to
about s of its elements: a vector of n to max(1, round(n s)); a tensor of k >= 2 dimensions,
viewed as n x m (its first dimension by the rest, as PowerSGD views it), to the 2-D
max(1, round(n sqrt s)) x max(1, round(m sqrt s)). The DDP bucket caps scale by s too, so a scaled
run has about the buckets of the full one.

Data: each rank's gradient (and outer-gradient) is standard normal draws, seeded by its rank, one
float32 element per parameter; every reference is computed from these draws, which any process
can regenerate.

Two sections per model, each a cell of tools/bench/harness.py:

- "DDP step": the gradients in DDP's buckets as DDP builds them after its first iteration
  (parameters in reverse order; the first bucket capped at 1 MiB, the others at --bucket-mb MiB,
  each closed once it reaches its cap), every bucket's collective issued back to back as DDP
  issues them and all waited for (no backward pass to overlap: the communication of one step):
  gloo's all-reduce (then / n, as DDP's default hook), gossipcc's exact all-reduce (the same),
  gossipcc's quantized all-reduce (8 and 4 bits, average, no error feedback), gossipcc's PowerSGD
  (rank 4, compressing from the first call, each parameter with its own shape, error feedback
  and warm start), and PyTorch's powerSGD_hook on the gloo group (rank 4, the same
  min_compression_rate 2, error feedback and warm start; given each bucket as DDP's GradBucket
  would present it: the flat buffer and per-parameter views; it runs its two exact warm-up
  iterations untimed, start_powerSGD_iter = 2 being its minimum). The hook issues its second
  and third all-reduce from the completion callback of the first and waits there, so with
  several buckets in flight gloo's collectives are issued in different orders on different
  ranks (a hang): its buckets run one after another, each waited for before the next is issued.
- "DiLoCo outer sync": one collective over every parameter's delta as one flat tensor, as
  gossipcc.DiLoCo launches it: gloo's all-reduce / n, gossipcc's exact all-reduce / n, gossipcc's
  quantized all-reduce (8 and 4 bits, with DiLoCo's error-feedback residuals), and one push-sum
  round (push_sum_round, graph "exponential:peers=1": DiLoCo's outer_sync="gossip").

Each rank runs one untimed warm-up of every method (its result is the one checked), then --trials
trials of --iterations iterations; in iteration i of trial t each section's methods run in the
order harness.trial_order(methods, t, i), each op preceded by an untimed barrier and its input
restored untimed. A sample is the median over the trial's iterations of the slowest rank's time;
a figure is the median over the trials with its min-max, and each ratio against gloo the median
of the per-trial ratios. Bytes: the NIC tx counters from just before the op to after the
barrier that follows it, per rank (its own sockets) and per host (its NIC, every rank of the
host), averaged over the ranks (none on --network local).

Checks (the run fails, naming the method, when one does not hold):
- exact (gloo, gossipcc): |result - average| <= (n + 2) 2^-24 sum_r |x_r| / n per element, the
  average computed in float64 from every rank's draws;
- quantized: within compression/quantized_allreduce.h's bound (docs/comm.md): (1/Q + (n + 32) 2^-24)
  sum_r M_r / n + 2^-96 per element, M_r rank r's maximum |x| over the element's block of 256 of
  the buffer the collective was given, Q = 2^(bits-1) - 1;
- PowerSGD (both): a tensor PowerSGD leaves exact (fewer than two dimensions, or one where
  (n + m) r 2 >= n m) as exact above; every compressed n x m tensor must be of rank r = min(n, m, 4)
  (its r-th singular value above 1e-4 of its first, and nothing outside an r-dimensional column
  space) and equal to the orthogonal projection of the float64 average onto that column space
  (P P^T M, what one power iteration with error feedback starting at zero gives), to 1e-3 of its
  norm;
- push-sum: each rank's x / w equals the round's exact mix of its in-peers' draws (from the peer
  schedule, uniform shares), to float32 rounding;
- every method but push-sum leaves the same bits on every rank.
"""
import argparse
import hashlib
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import harness  # noqa: E402

RESNET50_PARAMETERS = 25_557_032
GPT2_PARAMETERS = 124_439_808
SEED = 4000
PSGD_RANK = 4
PSGD_MIN_COMPRESSION_RATE = 2.0
FIRST_BUCKET_BYTES = 1 << 20  # DDP's dist._DEFAULT_FIRST_BUCKET_BYTES
GOSSIP_GRAPH = "exponential:peers=1"

DDP_METHODS = ("gloo", "gossipcc exact", "quantized 8 bits", "quantized 4 bits", "PowerSGD r4 (gossipcc)",
               "powerSGD_hook r4 (PyTorch, gloo)")
DILOCO_METHODS = ("gloo", "gossipcc exact", "quantized 8 bits", "quantized 4 bits", "push-sum round (gossipcc)")
METHODS = ("gloo", "gossipcc exact", "quantized 8 bits", "quantized 4 bits", "PowerSGD r4 (gossipcc)",
           "powerSGD_hook r4 (PyTorch, gloo)", "push-sum round (gossipcc)")
SECTIONS = (("ddp", "DDP step", DDP_METHODS), ("diloco", "DiLoCo outer sync", DILOCO_METHODS))
MODELS = ("resnet50", "gpt2")


# ---- shapes ---------------------------------------------------------------------------------

def resnet50_shapes():
    """[(name, shape)] of torchvision's resnet50() parameters, in the model's order."""
    out = []

    def conv(name, cout, cin, k):
        out.append((f"{name}.weight", (cout, cin, k, k)))

    def bn(name, c):
        out.append((f"{name}.weight", (c,)))
        out.append((f"{name}.bias", (c,)))

    conv("conv1", 64, 3, 7)
    bn("bn1", 64)
    inplanes = 64
    for stage, (planes, blocks) in enumerate(zip((64, 128, 256, 512), (3, 4, 6, 3)), start=1):
        for b in range(blocks):
            p = f"layer{stage}.{b}"
            conv(f"{p}.conv1", planes, inplanes, 1)
            bn(f"{p}.bn1", planes)
            conv(f"{p}.conv2", planes, planes, 3)
            bn(f"{p}.bn2", planes)
            conv(f"{p}.conv3", planes * 4, planes, 1)
            bn(f"{p}.bn3", planes * 4)
            if b == 0:  # the first block of a stage changes the width (and stride): a projection
                conv(f"{p}.downsample.0", planes * 4, inplanes, 1)
                bn(f"{p}.downsample.1", planes * 4)
            inplanes = planes * 4
    out.append(("fc.weight", (1000, 2048)))
    out.append(("fc.bias", (1000,)))
    return out


def gpt2_shapes(layers=12, d=768, vocab=50257, context=1024):
    """[(name, shape)] of a GPT-2-small-sized transformer: token and position embeddings, per
    layer two LayerNorms, the attention's fused q/k/v and output projections and the 4d MLP (Linear
    weights [out, in], with biases), a final LayerNorm; the output layer is the token embedding."""
    out = [("wte.weight", (vocab, d)), ("wpe.weight", (context, d))]
    for i in range(layers):
        p = f"h.{i}"
        out += [(f"{p}.ln_1.weight", (d,)), (f"{p}.ln_1.bias", (d,)),
                (f"{p}.attn.c_attn.weight", (3 * d, d)), (f"{p}.attn.c_attn.bias", (3 * d,)),
                (f"{p}.attn.c_proj.weight", (d, d)), (f"{p}.attn.c_proj.bias", (d,)),
                (f"{p}.ln_2.weight", (d,)), (f"{p}.ln_2.bias", (d,)),
                (f"{p}.mlp.c_fc.weight", (4 * d, d)), (f"{p}.mlp.c_fc.bias", (4 * d,)),
                (f"{p}.mlp.c_proj.weight", (d, 4 * d)), (f"{p}.mlp.c_proj.bias", (d,))]
    out += [("ln_f.weight", (d,)), ("ln_f.bias", (d,))]
    return out


SHAPES = {"resnet50": resnet50_shapes, "gpt2": gpt2_shapes}


def numel(shape):
    return math.prod(shape)


def scaled_shape(shape, scale):
    """About `scale` of the tensor's elements (see the module's doc); the shape itself at 1."""
    if scale == 1.0:
        return tuple(shape)
    if len(shape) < 2:
        return (max(1, round(numel(shape) * scale)),)
    root = math.sqrt(scale)
    return (max(1, round(shape[0] * root)), max(1, round(numel(shape[1:]) * root)))


def model_shapes(model, scale=1.0):
    return [(name, scaled_shape(shape, scale)) for name, shape in SHAPES[model]()]


def ddp_buckets(shapes, bucket_bytes, first_bucket_bytes=FIRST_BUCKET_BYTES, element_bytes=4):
    """DDP's buckets after its first iteration: lists of parameter indices, parameters in reverse
    order; a bucket closes once its bytes reach its cap (the first bucket's first_bucket_bytes,
    then bucket_bytes), as dist._compute_bucket_assignment_by_size does."""
    buckets, current, size = [], [], 0
    for i in reversed(range(len(shapes))):
        current.append(i)
        size += numel(shapes[i]) * element_bytes
        if size >= (first_bucket_bytes if not buckets else bucket_bytes):
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets


class Layout:
    """A model's scaled shapes, its DDP buckets and every parameter's place in the flat vector
    (bucket by bucket, so that each bucket is a contiguous slice of it)."""

    def __init__(self, model, scale, bucket_mb):
        self.model, self.scale = model, scale
        self.shapes = [s for _, s in model_shapes(model, scale)]
        self.names = [n for n, _ in SHAPES[model]()]
        self.buckets = ddp_buckets(self.shapes, max(1, round(bucket_mb * (1 << 20) * scale)),
                                   max(1, round(FIRST_BUCKET_BYTES * scale)))
        self.offset, self.bucket_range = {}, []
        at = 0
        for b in self.buckets:
            start = at
            for i in b:
                self.offset[i] = at
                at += numel(self.shapes[i])
            self.bucket_range.append((start, at))
        self.total = at


def rank_data(rank, total):
    import torch
    return torch.randn(total, generator=torch.Generator().manual_seed(SEED + rank))


def psgd_compressed(shape, rank=PSGD_RANK, rate=PSGD_MIN_COMPRESSION_RATE):
    """Whether PowerSGD (gossipcc's and PyTorch's rule) compresses a tensor of this shape."""
    if len(shape) < 2 or numel(shape) == 0:
        return False
    n = shape[0]
    m = numel(shape) // n
    r = min(n, m, rank)
    return (n + m) * r * rate < n * m


# ---- references and checks --------------------------------------------------------------------

class Reference:
    """From every rank's draws, in float64: the sum, the sum of |x|, and per buffer (the DDP
    buckets and the whole vector) the sum over ranks of the block maxima."""

    def __init__(self, layout, n, block=256):
        import torch
        self.layout, self.n, self.block = layout, n, block
        self.sum = torch.zeros(layout.total, dtype=torch.float64)
        self.abs = torch.zeros(layout.total, dtype=torch.float64)
        ranges = layout.bucket_range + [(0, layout.total)]
        self.block_max = {r: torch.zeros(-(-(r[1] - r[0]) // block), dtype=torch.float64) for r in ranges}
        for rank in range(n):
            x = rank_data(rank, layout.total)
            self.sum += x
            self.abs += x.abs()
            for (a, b), acc in self.block_max.items():
                acc += block_maxima(x[a:b], block)
        self.average = self.sum / n

    def per_element_block_max(self, a, b):
        """The sum over ranks of the block maxima, per element of the buffer [a, b)."""
        return self.block_max[(a, b)].repeat_interleave(self.block)[:b - a]


def block_maxima(x, block):
    import torch
    pad = (-x.numel()) % block
    if pad:
        x = torch.cat([x, x.new_zeros(pad)])
    return x.view(-1, block).abs().amax(1).double()


class CheckFailed(AssertionError):
    pass


def check_exact(name, out, ref, a, b):
    """out (the buffer [a, b) after an averaging all-reduce) against the float64 average; returns
    the largest error over its bound."""
    err = (out.double() - ref.average[a:b]).abs()
    bound = (ref.n + 2) * 2.0 ** -24 * ref.abs[a:b] / ref.n + 1e-30
    return _ratio(name, err, bound, "the float64 average (float32 tolerance)")


def quantized_bound(ref, bits, a, b):
    q = 2 ** (bits - 1) - 1
    return (1.0 / q + (ref.n + 32) * 2.0 ** -24) * ref.per_element_block_max(a, b) / ref.n + 2.0 ** -96


def check_quantized(name, out, ref, bits, a, b):
    err = (out.double() - ref.average[a:b]).abs()
    return _ratio(name, err, quantized_bound(ref, bits, a, b), f"the {bits}-bit error bound")


def _ratio(name, err, bound, what):
    import torch
    ratio = err / bound
    worst = int(torch.argmax(ratio).item()) if ratio.numel() else 0
    if not bool(torch.isfinite(err).all()) or (ratio.numel() and ratio[worst].item() > 1.0):
        bad = int(torch.nonzero(~torch.isfinite(err) | (ratio > 1.0))[0].item())
        raise CheckFailed(f"{name}: element {bad} is off by {err[bad].item():.3e}, beyond {what} "
                          f"{bound[bad].item():.3e}")
    return ratio[worst].item() if ratio.numel() else 0.0


def check_powersgd(name, out, ref, layout, bucket, rank=PSGD_RANK):
    """One bucket's PowerSGD result (see the module's doc); returns the largest error over its
    tolerance (exact tensors: over the float32 bound; compressed: the projection residual over
    1e-3 of the output's norm)."""
    import torch
    worst = 0.0
    a0 = layout.bucket_range[bucket][0]
    for i in layout.buckets[bucket]:
        shape = layout.shapes[i]
        a = layout.offset[i]
        b = a + numel(shape)
        piece = out[a - a0:b - a0]
        what = f"{name}, {layout.names[i]} {list(shape)}"
        if not psgd_compressed(shape, rank):
            err = (piece.double() - ref.average[a:b]).abs()
            bound = (ref.n + 2) * 2.0 ** -24 * ref.abs[a:b] / ref.n + 1e-30
            worst = max(worst, _ratio(what + " (left exact)", err, bound, "the float64 average"))
            continue
        n = shape[0]
        m = numel(shape) // n
        r = min(n, m, rank)
        o = piece.double().view(n, m)
        avg = ref.average[a:b].view(n, m)
        norm = o.norm().item()
        g = torch.randn(m, r, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
        u, _ = torch.linalg.qr(o @ g)
        outside = (o - u @ (u.T @ o)).norm().item()
        sv = torch.linalg.svdvals(u.T @ o)
        if norm == 0 or sv[-1].item() <= 1e-4 * sv[0].item() or outside > 1e-3 * norm:
            raise CheckFailed(f"{what}: not of rank {r} (norm {norm:.3e}, singular values "
                              f"{[round(s, 6) for s in sv.tolist()]}, {outside:.3e} outside an {r}-dimensional "
                              f"column space)")
        residual = (o - u @ (u.T @ avg)).norm().item()
        if residual > 1e-3 * norm:
            raise CheckFailed(f"{what}: {residual:.3e} away from the projection of the float64 average onto its "
                              f"column space (tolerance {1e-3 * norm:.3e})")
        worst = max(worst, residual / (1e-3 * norm))
    return worst


def push_sum_expected(x_of, n, rank, step, graph=GOSSIP_GRAPH):
    """x / w that `rank` holds after one push-sum round at `step` from every rank j's (x_j, 1):
    the uniform shares 1 / (|out_j| + 1) from the peer schedule; x_of(j) gives rank j's draws."""
    from gossipcc import _C
    period = _C.peer_graph_info(graph, n)["period"]
    x, w = 0.0, 0.0
    for j in range(n):
        out = list(_C.peer_graph_out_peers(graph, n, j, step % period))
        if j == rank or rank in out:
            share = 1.0 / (len(out) + 1)
            x = x + share * x_of(j).double()
            w += share
    return x / w


def check_push_sum(name, out, x_of, n, rank, step):
    expected = push_sum_expected(x_of, n, rank, step)
    err = (out.double() - expected).abs()
    bound = 4 * 2.0 ** -24 * expected.abs() + 1e-30
    return _ratio(f"{name} on rank {rank}", err, bound, "the round's exact mix")


# ---- the worker -------------------------------------------------------------------------------

class FakeGradBucket:
    """What PyTorch's powerSGD_hook reads of DDP's GradBucket: the flat buffer, the per-parameter
    gradients as views of it, the index, and whether it is the step's last bucket."""

    def __init__(self, index, count, buffer, views):
        self._index, self._count, self._buffer, self._views = index, count, buffer, views

    def index(self):
        return self._index

    def buffer(self):
        return self._buffer

    def gradients(self):
        return self._views

    def is_last(self):
        return self._index == self._count - 1


def worker(args):
    import datetime
    import torch
    import torch.distributed as dist
    import gossipcc
    from gossipcc import _C
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as torch_psgd
    torch.set_num_threads(1)
    rank, n = common.worker_env()
    layout = Layout(args.model, args.scale, args.bucket_mb)
    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=1200))
    gloo = dist.new_group(backend="gloo")
    gcc = dist.new_group(backend="gossipcc")
    pg = gossipcc.get_backend_object(gcc)
    source = rank_data(rank, layout.total)
    work = source.clone()
    buckets = [work[a:b] for a, b in layout.bucket_range]
    views = [[work[layout.offset[i]:layout.offset[i] + numel(layout.shapes[i])].view(layout.shapes[i])
              for i in b] for b in layout.buckets]
    flat_views = [[v.view(-1) for v in vs] for vs in views]
    shapes = [[list(layout.shapes[i]) for i in b] for b in layout.buckets]
    keys = [[f"param{i}" for i in b] for b in layout.buckets]
    psgd = _C.PowerSGD(f"rank={PSGD_RANK},start_iter=0,min_compression_rate={PSGD_MIN_COMPRESSION_RATE:g}")
    hook_state = torch_psgd.PowerSGDState(process_group=gloo, matrix_approximation_rank=PSGD_RANK,
                                          start_powerSGD_iter=2, min_compression_rate=PSGD_MIN_COMPRESSION_RATE,
                                          use_error_feedback=True, warm_start=True, random_seed=0)
    residuals = {b: (torch.zeros(layout.total), torch.zeros(layout.total)) for b in (8, 4)}
    gossip_round = [0]

    def divide(ts):
        for t in ts:
            t.div_(n)

    def ddp(method):
        if method in ("gloo", "gossipcc exact"):
            group = gloo if method == "gloo" else gcc
            for w in [dist.all_reduce(t, group=group, async_op=True) for t in buckets]:
                w.wait()
            divide(buckets)
        elif method.startswith("quantized"):
            bits = 8 if "8" in method else 4
            for w in [pg.quantized_allreduce([t], bits, True) for t in buckets]:
                w.wait()
        elif method == "PowerSGD r4 (gossipcc)":
            for w in [pg.powersgd_allreduce(flat_views[k], shapes[k], psgd, keys[k]) for k in range(len(buckets))]:
                w.wait()
        elif method == "powerSGD_hook r4 (PyTorch, gloo)":
            for k in range(len(buckets)):  # one at a time: see the module's doc
                torch_psgd.powerSGD_hook(hook_state, FakeGradBucket(k, len(buckets), buckets[k], views[k])).wait()
        else:
            raise ValueError(method)

    def diloco(method):
        if method in ("gloo", "gossipcc exact"):
            dist.all_reduce(work, group=gloo if method == "gloo" else gcc)
            work.div_(n)
        elif method.startswith("quantized"):
            bits = 8 if "8" in method else 4
            pg.quantized_allreduce([work], bits, True, *residuals[bits]).wait()
        elif method == "push-sum round (gossipcc)":
            weight = torch.ones(1, dtype=torch.float64)
            pg.push_sum_round([work], weight, gossip_round[0], GOSSIP_GRAPH, None).wait()
            gossip_round[0] += 1
            work.div_(weight.item())
        else:
            raise ValueError(method)

    run_section = {"ddp": ddp, "diloco": diloco}

    def one(section, method):
        work.copy_(source)
        return common.timed(lambda: run_section[section](method), dist.barrier)

    # Warm-up: every method once, untimed; these results are checked. PyTorch's hook runs its two
    # exact iterations first (start_powerSGD_iter = 2), so the checked call is its first compressed one.
    ref = Reference(layout, n) if rank == 0 else None
    checks, digests = {}, {}
    for section, _, methods in SECTIONS:
        for method in methods:
            if method.startswith("powerSGD_hook"):
                one(section, method)
                one(section, method)
            one(section, method)
            key = f"{section}/{method}"
            digests[key] = hashlib.sha256(work.numpy().tobytes()).hexdigest()
            if method.startswith("push-sum"):
                checks[key] = check_push_sum(method, work, lambda j: rank_data(j, layout.total), n, rank,
                                             gossip_round[0] - 1)
            elif ref is not None:
                checks[key] = verify(section, method, work, ref, layout)
    # Trials.
    probe = harness.LoadProbe()
    trials = []
    for trial in range(args.trials):
        dist.barrier()
        probe.start()
        times = {s: {m: [] for m in ms} for s, _, ms in SECTIONS}
        sent = {s: {m: [] for m in ms} for s, _, ms in SECTIONS}
        host_sent = {s: {m: [] for m in ms} for s, _, ms in SECTIONS}
        orders = []
        for i in range(args.iterations):
            for section, _, methods in SECTIONS:
                order = harness.trial_order(methods, trial, i)
                orders.append(order)
                for method in order:
                    dt, tx, host_tx = one(section, method)
                    times[section][method].append(dt)
                    if tx is not None:
                        sent[section][method].append(tx)
                    if host_tx is not None:
                        host_sent[section][method].append(host_tx)
        dist.barrier()
        trials.append({"times": times, "sent": sent, "host_sent": host_sent, "orders": orders, "load": probe.stop()})
    dist.barrier()
    dist.destroy_process_group()
    with open(args.out, "w") as f:
        json.dump({"trials": trials, "checks": checks, "digests": digests, "buckets": len(layout.buckets),
                   "elements": layout.total}, f)


def verify(section, method, out, ref, layout):
    """The largest error over its tolerance of one method's result (rank 0; CheckFailed when beyond)."""
    if section == "diloco":
        ranges = [(0, layout.total)]
    else:
        ranges = layout.bucket_range
    worst = 0.0
    for k, (a, b) in enumerate(ranges):
        piece = out[a:b]
        label = f"{method}, {section}" + (f" bucket {k}" if section == "ddp" else "")
        if method in ("gloo", "gossipcc exact"):
            worst = max(worst, check_exact(label, piece, ref, a, b))
        elif method.startswith("quantized"):
            worst = max(worst, check_quantized(label, piece, ref, 8 if "8" in method else 4, a, b))
        elif "PowerSGD" in method or "powerSGD" in method:
            worst = max(worst, check_powersgd(label, piece, ref, layout, k))
        else:
            raise ValueError(method)
    return worst


# ---- the driver -------------------------------------------------------------------------------

def cell_name(model, section):
    return f"{model} {dict((s, t) for s, t, _ in SECTIONS)[section]}"


def check_documents(docs, model):
    """CheckFailed unless every method was checked on rank 0 (push-sum on every rank) and every
    method but push-sum left the same bits on every rank."""
    for section, _, methods in SECTIONS:
        for method in methods:
            key = f"{section}/{method}"
            if key not in docs[0]["checks"]:
                raise CheckFailed(f"{model}: {key} was not checked")
            if method.startswith("push-sum"):
                missing = [r for r, d in enumerate(docs) if key not in d["checks"]]
                if missing:
                    raise CheckFailed(f"{model}: {key} not checked on ranks {missing}")
            elif len({d["digests"][key] for d in docs}) != 1:
                raise CheckFailed(f"{model}: {key}: the ranks hold different results")


def trial_samples(docs, trial, model):
    samples = {}
    for section, _, methods in SECTIONS:
        cell = {}
        runs = [d["trials"][trial] for d in docs]
        for m in methods:
            k = len(runs[0]["times"][section][m])
            slowest = [max(r["times"][section][m][i] for r in runs) for i in range(k)]
            sent = [sum(r["sent"][section][m]) / len(r["sent"][section][m]) for r in runs if r["sent"][section][m]]
            host = [sum(r["host_sent"][section][m]) / len(r["host_sent"][section][m]) for r in runs
                    if r.get("host_sent", {}).get(section, {}).get(m)]
            cell[m] = {"time": common.median(slowest), "sent": sum(sent) / len(sent) if sent else None,
                       "host_sent": sum(host) / len(host) if host else None}
        samples[cell_name(model, section)] = cell
    return samples


def record(run, docs, model, layout):
    check_documents(docs, model)
    for section, _, methods in SECTIONS:
        run.cell(cell_name(model, section), model=model, section=section, elements=layout.total,
                 bytes=4 * layout.total, buckets=len(layout.buckets) if section == "ddp" else 1,
                 checks={m: max(d["checks"].get(f"{section}/{m}", 0.0) for d in docs) for m in methods})
    for trial in range(len(docs[0]["trials"])):
        t = docs[0]["trials"][trial]
        run.add_trial(trial_samples(docs, trial, model), t["load"], t["orders"][0], group=model,
                      detail={"orders": t["orders"]})


def table(doc, cell):
    info = doc["cells"][cell]
    s = doc["summary"]["cells"][cell]
    gloo_sent = s["methods"]["gloo"]["sent"]
    rows = []
    for m in (x for x in METHODS if x in s["methods"]):
        st = s["methods"][m]
        ratio = harness.cell_text(s["ratios"][m], 1, 2) if m in s["ratios"] else "1"
        speedup = harness.cell_text(s["speedups"][m], 1, 2, "x") if m in s["speedups"] else "-"
        sent = harness.cell_text(st["sent"], 1e-6, 2)
        over = f"{st['sent']['median'] / gloo_sent['median']:.3f}" if st["sent"] and gloo_sent else "-"
        rows.append([m, harness.cell_text(st["time"], 1e3, 1), ratio, speedup, sent, over,
                     common.bytes_text(st.get("host_sent")), f"{info['checks'][m]:.2g}"])
    return harness.markdown_table(["method", "time (ms)", "time / gloo's", "speed-up vs gloo", "MB sent/rank",
                                   "sent / gloo's", "MB sent/host", "checked: worst error / tolerance"], rows)


def report(doc):
    a = doc["args"]
    parts = [harness.preamble(doc),
             f"collectives on model shapes, {doc['info']['world']}, network {a['network']}, --scale {a['scale']:g}, "
             f"{a['iterations']} iteration(s) per trial, the slowest rank's time"]
    for cell, info in doc["cells"].items():
        what = (f"{info['buckets']} DDP buckets (first 1 MiB, then {a['bucket_mb']:g} MiB, x scale)"
                if info["section"] == "ddp" else "one flat tensor")
        parts.append(f"{cell}: {info['elements']:,} float32 ({common.human_bytes(info['bytes'])}), {what}\n\n"
                     f"{table(doc, cell)}")
    parts.append(harness.trials_table(doc))
    return "\n\n".join(parts)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--model", default="both", choices=("resnet50", "gpt2", "both"))
    p.add_argument("--scale", type=float, default=1.0, help="fraction of every tensor's size, in (0, 1] (default 1)")
    common.add_cluster_arguments(p, hosts=4, network="1gbit")
    p.add_argument("--iterations", type=int, default=1, help="iterations per trial (default 1)")
    p.add_argument("--bucket-mb", type=float, default=25.0, help="DDP's bucket cap in MiB (default 25), x --scale")
    harness.add_arguments(p)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    if not 0 < args.scale <= 1:
        common.fail(f"model_shapes: --scale must be in (0, 1], got {args.scale}")
    if args.iterations < 1:
        common.fail(f"model_shapes: --iterations must be at least 1, got {args.iterations}")
    if not args.bucket_mb > 0:
        common.fail(f"model_shapes: --bucket-mb must be > 0, got {args.bucket_mb}")
    common.resolve_cluster_arguments(args, "model_shapes")
    run = harness.Run("model_shapes", args, METHODS, "gloo", "time")
    run.info["world"] = common.world_text(args.hosts, args.ranks_per_host)
    models = MODELS if args.model == "both" else (args.model,)
    for model in models:
        layout = Layout(model, args.scale, args.bucket_mb)
        try:
            with common.make_cluster(args.hosts, args.ranks_per_host, args.network) as cluster:
                docs = common.run_ranks(cluster, os.path.abspath(__file__),
                                        ["--model", model, "--scale", repr(args.scale), "--bucket-mb",
                                         repr(args.bucket_mb), "--iterations", str(args.iterations),
                                         "--trials", str(args.trials)], timeout=3600)
        except common.NamespacesUnavailable as e:
            common.fail(f"model_shapes: emulated network not available: {e}")
        except common.ClusterError as e:
            common.fail(f"model_shapes: {model}: {e}")
        try:
            record(run, docs, model, layout)
        except CheckFailed as e:
            common.fail(f"model_shapes: {model}: check failed: {e}")
        print(f"{model}: done", flush=True)
    run.finish(report)


if __name__ == "__main__":
    main()
