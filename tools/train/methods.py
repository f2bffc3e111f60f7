"""The training methods the main job compares, as a registry: each method is a few lines.

A method says which c10d backend it needs, how to configure gossipcc before the process group
exists, and how to wrap the model (DDP, DDP + comm hook, or a gossip wrapper). Every method then
trains with the same loop (worker.py): forward, loss, zero_grad, backward, optimizer step.
"""
import os
import sys

import torch
import torch.distributed as dist


class Method:
    """name: registry key; backend: "gossipcc" or "gloo"; configure(gossipcc): called before
    init_process_group; wrap(module) -> the module to train; optimizer(opt) -> the optimizer to
    step (opt itself, or opt wrapped); finish(wrapped): called after
    the last step, inside its timing (e.g. fold the gossip round in flight); average(wrapped):
    collective that sets every replica to the exact average (gossip methods: the model one
    would deploy; the job reports its accuracy too)."""

    def __init__(self, name, description, backend, wrap, configure=None, finish=None, average=None,
                 optimizer=None):
        self.name = name
        self.description = description
        self.backend = backend
        self.wrap = wrap
        self.configure = configure or (lambda gossipcc: None)
        self.finish = finish or (lambda wrapped: None)
        self.average = average
        # optimizer(opt) -> the optimizer the loop steps (post-local SGD: opt wrapped with its
        # model averager); identity for every other method.
        self.optimizer = optimizer or (lambda opt: opt)


REGISTRY = {}


def register(method):
    if method.name in REGISTRY:
        raise ValueError(f"method {method.name!r} registered twice")
    REGISTRY[method.name] = method
    return method


def _ddp(module):
    return torch.nn.parallel.DistributedDataParallel(module)


# Steps of exact all-reduce before PowerSGD compresses (PyTorch's start_powerSGD_iter): same for
# gossipcc's policy and PyTorch's hook so the two are compared like for like.
POWERSGD_START_ITER = 10


def _ddp_one_bucket(module):
    """DDP with all gradients in one bucket. PyTorch's powerSGD_hook on gloo needs it: with
    several buckets the hook's second all-reduce is issued from the callback of the first, on
    gloo's worker thread, so ranks can issue collectives in different orders (seen here: gloo
    aborts with "op.preamble.length <= op.nbytes"). Both PowerSGD variants use it, so they
    compare like for like."""
    saved = dist._DEFAULT_FIRST_BUCKET_BYTES
    dist._DEFAULT_FIRST_BUCKET_BYTES = 1 << 40  # the bucket DDP caps separately after step 1
    try:
        return torch.nn.parallel.DistributedDataParallel(module, bucket_cap_mb=1 << 20)
    finally:
        dist._DEFAULT_FIRST_BUCKET_BYTES = saved


def _torch_powersgd(rank):
    def wrap(module):
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD
        model = _ddp_one_bucket(module)
        state = powerSGD.PowerSGDState(process_group=None, matrix_approximation_rank=rank,
                                       start_powerSGD_iter=POWERSGD_START_ITER)
        model.register_comm_hook(state, powerSGD.powerSGD_hook)
        return model
    return wrap


register(Method("allreduce-gloo", "exact all-reduce: DDP on PyTorch's gloo backend (baseline)",
                "gloo", _ddp))
register(Method("allreduce", "exact all-reduce: DDP on backend gossipcc", "gossipcc", _ddp,
                configure=lambda g: g.configure(allreduce="exact")))


def _packed(gossipcc):
    # Read when the process group is created (docs/pytorch.md); every rank sets it alike.
    os.environ["GOSSIPCC_LOSSLESS_FLOAT32_ALLREDUCE"] = "1"
    gossipcc.configure(allreduce="exact")


register(Method("allreduce-packed", "exact all-reduce: DDP on backend gossipcc, buckets above 512 KiB sent "
                "losslessly packed (GOSSIPCC_LOSSLESS_FLOAT32_ALLREDUCE=1)", "gossipcc", _ddp, configure=_packed))
for _r in (1, 2):
    register(Method(f"powersgd-r{_r}", f"PowerSGD rank {_r}: DDP on gossipcc, policy powersgd:rank={_r}",
                    "gossipcc", _ddp_one_bucket,
                    configure=lambda g, r=_r: g.configure(
                        allreduce=f"powersgd:rank={r},start_iter={POWERSGD_START_ITER}")))
    register(Method(f"torch-powersgd-r{_r}", f"PowerSGD rank {_r}: DDP on gloo with PyTorch's powerSGD_hook",
                    "gloo", _torch_powersgd(_r)))


# The alternatives a user of PyTorch alone would pick, each on backend gloo with PyTorch's own
# code: DDP with the fp16 compression hook (gradients cast to float16, divided by the world size,
# all-reduced in float16, cast back), and post-local SGD (Lin et al., "Don't use large mini-batches,
# use local SGD"): DDP all-reduces the gradients over all ranks for the first
# LOCAL_SGD_START_ITER steps, then only within each host (PyTorch's default for the hook: the
# intra-host group, here LOCAL_WORLD_SIZE consecutive ranks; with one rank per host each rank
# steps on its own gradients, post_local_gradient_allreduce=False) and PeriodicModelAverager
# averages the parameters over all ranks
# every LOCAL_SGD_PERIOD steps (PostLocalSGDOptimizer steps the optimizer, then the averager).
# torch-powersgd-r* above is PyTorch's powerSGD_hook. The workers set both constants from their
# flags (the LM workload's period is DiLoCo's H).
LOCAL_SGD_START_ITER = 10
LOCAL_SGD_PERIOD = 20


def _torch_fp16(module):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    model = _ddp(module)
    model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    return model


def _torch_postlocal(module):
    from torch.distributed.algorithms.ddp_comm_hooks import post_localSGD_hook as post_local
    model = _ddp(module)
    per_host = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    subgroup = None
    if per_host > 1:
        # What dist.new_subgroups(per_host) builds (torch 1.13's refuses without CUDA): one group
        # per host of consecutive ranks, every rank creating every group in the same order.
        groups = [dist.new_group(list(range(h, h + per_host))) for h in range(0, dist.get_world_size(), per_host)]
        subgroup = groups[dist.get_rank() // per_host]
    state = post_local.PostLocalSGDState(process_group=None, subgroup=subgroup,
                                         start_localSGD_iter=LOCAL_SGD_START_ITER,
                                         post_local_gradient_allreduce=per_host > 1)
    model.register_comm_hook(state, post_local.post_localSGD_hook)
    return model


def _postlocal_optimizer(opt):
    from torch.distributed.algorithms.model_averaging import averagers
    from torch.distributed.optim import PostLocalSGDOptimizer
    # warmup_steps = the hook's start: the averager counts optimizer steps from 0, so it first
    # averages after step LOCAL_SGD_START_ITER + 1 (the first local step), then every period.
    averager = averagers.PeriodicModelAverager(period=LOCAL_SGD_PERIOD, warmup_steps=LOCAL_SGD_START_ITER)
    return PostLocalSGDOptimizer(optim=opt, averager=averager)


def _average_parameters(model):
    from torch.distributed.algorithms.model_averaging import utils as averaging
    averaging.average_parameters(iter(list(model.parameters())), None)


register(Method("torch-fp16", "DDP on gloo with PyTorch's fp16_compress_hook (float16 all-reduce)",
                "gloo", _torch_fp16))
register(Method("torch-postlocal", "post-local SGD: DDP on gloo with PyTorch's post_localSGD_hook, then "
                "PeriodicModelAverager (PostLocalSGDOptimizer) every H steps",
                "gloo", _torch_postlocal, optimizer=_postlocal_optimizer, average=_average_parameters))


# Diagnostics (not in "all"): the floors a PowerSGD step stands on, to tell how much of a
# step is the compressor's own work (docs/benchmarks.md, (b)). Each trains with DDP in one bucket
# like the PowerSGD methods, but its comm hook leaves the gradients as they are (every rank
# follows its own gradient), after `exchanges` all-reduces of 16 floats: the step's compute and
# DDP cost with no synchronisation (0), or with the synchronisation of a method that needs that
# many exchanges per step (gossipcc's PowerSGD: 2; PyTorch's powerSGD_hook: 3).
def floor_hook(exchanges):
    """The diagnostics' comm hook: `exchanges` all-reduces of 16 floats, the bucket unchanged."""
    token = torch.zeros(16)  # one per hook, not one per step

    def hook(state, bucket):
        for _ in range(exchanges):
            dist.all_reduce(token)
        future = torch.futures.Future()
        future.set_result(bucket.buffer())
        return future
    return hook


def _floor(exchanges):
    def wrap(module):
        model = _ddp_one_bucket(module)
        model.register_comm_hook(None, floor_hook(exchanges))
        return model
    return wrap


register(Method("diag-compute", "diagnostic: DDP in one bucket, no communication (each rank its own gradient)",
                "gloo", _floor(0)))
register(Method("diag-sync2", "diagnostic: diag-compute plus 2 all-reduces of 16 floats per step through gossipcc",
                "gossipcc", _floor(2), configure=lambda g: g.configure(allreduce="exact")))
register(Method("diag-sync3-gloo", "diagnostic: diag-compute plus 3 all-reduces of 16 floats per step through gloo",
                "gloo", _floor(3)))


def _gossip(algorithm, **kwargs):
    def wrap(module):
        import gossipcc
        return gossipcc.GossipDataParallel(module, algorithm=algorithm, **kwargs)
    return wrap


def _flush(model):
    model.flush()  # OSGP: fold the round still in flight


def _adpsgd(module):
    import gossipcc
    return gossipcc.BilatGossipDataParallel(module)


def _average(model):
    model.average_parameters()


register(Method("sgp", "SGP: push-sum gossip, one peer per step, exponential graph (GossipDataParallel)",
                "gossipcc", _gossip("sgp", graph="exponential", peers_per_step=1),
                average=_average))
register(Method("osgp", "OSGP: overlapped push-sum (1 step stale), one peer, exponential graph",
                "gossipcc", _gossip("osgp", graph="exponential", peers_per_step=1, synch_freq=1),
                finish=_flush, average=_average))
register(Method("dpsgd", "D-PSGD: symmetric gossip, Metropolis weights, ring (GossipDataParallel)",
                "gossipcc", _gossip("dpsgd", graph="ring"), average=_average))
register(Method("adpsgd", "AD-PSGD: asynchronous bilateral exchange (BilatGossipDataParallel)",
                "gossipcc", _adpsgd, finish=lambda model: model.finish(), average=_average))


def leave(method):
    """Ends a rank after its last barrier (worker.py, lm_worker.py). Seen twice in the test suite
    under load, with PyTorch's powerSGD_hook on gloo (the baseline): every record written,
    destroy_process_group() done, and then the rank hung while main()'s objects (DDP, the hook
    state, the group) were torn down, with a gloo thread alive. The results are on disk, so gloo
    ranks leave here without that teardown; gossipcc ranks go on and shut down normally, so their
    clean exit stays exercised."""
    if method.backend == "gloo":
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    dist.destroy_process_group()


def param_probe(module, k=4):
    """k fixed random projections of the module's flattened parameters (the same projection
    vectors on every rank, scaled by 1/sqrt(numel)): ranks holding equal models report equal
    values, so the spread of the values over the ranks says how far apart the ranks' models are,
    without a collective."""
    flat = torch.cat([p.detach().reshape(-1).double() for p in module.parameters()])
    g = torch.Generator().manual_seed(1234)
    return [(flat @ torch.randn(flat.numel(), generator=g, dtype=torch.float64)).item() / flat.numel() ** 0.5
            for _ in range(k)]


def param_spread(ends):
    """The largest spread over the ranks of any param_probe value in the ranks' "end" records:
    0 when every rank ends with the same model; None if a rank did not record one."""
    probes = [e.get("param_probe") for e in ends]
    if None in probes:
        return None
    return max(max(values) - min(values) for values in zip(*probes))


def names(spec):
    """"all" (every method but the diagnostics: the project's and PyTorch's alternatives,
    torch-*), "default", or a comma list -> list of names."""
    if spec in ("all", "default"):
        return [n for n in REGISTRY if not n.startswith("diag-")]
    out = []
    for name in spec.split(","):
        name = name.strip()
        if name not in REGISTRY:
            raise ValueError(f"unknown method {name!r}; known: {', '.join(REGISTRY)}")
        out.append(name)
    return out
