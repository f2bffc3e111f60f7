"""Trains one small classifier with each of gossipcc's training algorithms (docs/algorithms.md).

    PYTHONPATH=bazel-bin/torch_backend /usr/bin/python3 torch_backend/python/examples/train_algorithms.py \
        --world-size 4 --steps 60 --methods sgp,osgp,dpsgd,adpsgd,easgd,uneven,allreduce,powersgd,powersgd_hook,gossip_hook,diloco,streaming_diloco,local

Standalone it starts --world-size local ranks itself (file:// rendezvous); under torchrun
(`/usr/bin/python3 -m gossipcc.torchrun --nproc-per-node=4 train_algorithms.py`) it uses env://.
Each rank trains on its own shard of a synthetic task (labels from a fixed linear teacher);
rank 0 prints, per method, the first and last training loss, the accuracy of the final
(exactly averaged) model on held-out data, and how far apart the ranks' models were at the
end of training, before any final averaging (`spread`: the largest difference of a parameter
from rank 0's; "local", which never communicates, shows how far apart they drift alone). Each
`train_<method>` function is the whole recipe for that method; `--help` lists the methods.
"""
import argparse
import datetime
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.nn.functional as F

import gossipcc

FEATURES, CLASSES = 20, 4
TEACHER = torch.randn(FEATURES, CLASSES, generator=torch.Generator().manual_seed(7))


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 64), torch.nn.ReLU(), torch.nn.Linear(64, CLASSES))


def batches(rank, steps, batch_size=32):
    """This rank's shard: `steps` batches of its own data."""
    g = torch.Generator().manual_seed(1 + rank)
    for _ in range(steps):
        x = torch.randn(batch_size, FEATURES, generator=g)
        yield x, (x @ TEACHER).argmax(1)


def sgd(model):
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def spread(module):
    """Collective: the largest difference of any parameter from rank 0's, over the ranks."""
    flat = torch.cat([p.detach().reshape(-1) for p in module.parameters()])
    first = flat.clone()
    dist.broadcast(first, 0)
    apart = (flat - first).abs().max().reshape(1)
    dist.all_reduce(apart, op=dist.ReduceOp.MAX)
    return apart.item()


def train_local(rank, steps):
    """No communication: each rank trains alone on its own data (the baseline for spread)."""
    model = make_model()
    opt = sgd(model)
    losses = []
    for x, y in batches(rank, steps):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return model, losses, spread(model)


def train_gossip(algorithm, rank, steps, **options):
    """SGP / OSGP / D-PSGD: wrap, train as usual, average exactly at the end."""
    model = gossipcc.GossipDataParallel(make_model(), algorithm=algorithm, **options)
    opt = sgd(model)
    losses = []
    for x, y in batches(rank, steps):
        loss = F.cross_entropy(model(x), y)  # the forward runs this step's gossip round first
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    apart = spread(model.module)
    model.average_parameters()
    return model.module, losses, apart


def train_adpsgd(rank, steps):
    """AD-PSGD: odd ranks exchange with a passive (even) peer every step, no global step."""
    model = gossipcc.BilatGossipDataParallel(make_model(), process_group=dist.new_group())
    opt = sgd(model)
    losses = []
    for x, y in batches(rank, steps):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    model.finish()
    apart = spread(model.module)
    model.average_parameters()
    return model.module, losses, apart


def train_easgd(rank, steps, tau=4, alpha=0.3):
    """Elastic averaging: local steps, every tau steps pulled towards the shared center."""
    model = make_model()
    ea = gossipcc.AllReduceEA(model, tau=tau, alpha=alpha)
    opt = sgd(model)
    losses = []
    for x, y in batches(rank, steps):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        ea.step()
        losses.append(loss.item())
    apart = spread(model)
    ea.load_center_into_model()  # the consensus model
    return model, losses, apart


def train_uneven(rank, steps):
    """All-reduce SGD where rank r has steps - 5 r batches; ends bitwise equal."""
    model = make_model()
    allreduce_sgd = gossipcc.AllReduceSGD(model)
    opt = sgd(model)
    losses = []
    for x, y in batches(rank, max(1, steps - 5 * rank)):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        allreduce_sgd.sum_and_normalize_gradients()
        opt.step()
        losses.append(loss.item())
    allreduce_sgd.finish()
    return model, losses, spread(model)


def train_diloco(rank, steps, **options):
    """DiLoCo / Streaming DiLoCo: inner steps on this rank's data, an outer Nesterov step on the
    averaged change every sync_every steps; sync() at the end gives every rank one model."""
    model = make_model()  # every rank starts from the same parameters (checked by DiLoCo)
    inner = sgd(model)
    outer = torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True)
    diloco = gossipcc.DiLoCo(model, inner, outer, **options)
    losses = []
    for x, y in batches(rank, steps):
        loss = F.cross_entropy(model(x), y)
        inner.zero_grad()
        loss.backward()
        inner.step()
        diloco.step()  # synchronises the fragments whose turn it is
        losses.append(loss.item())
    apart = spread(model)
    diloco.sync()  # the last outer step: every rank holds theta_global, bitwise the same
    return model, losses, apart


def train_ddp(rank, steps, policy):
    """Plain DDP; the gradient all-reduce policy ("exact" or "powersgd:...") belongs to the group.
    (A script with one method sets it before init_process_group: gossipcc.configure(allreduce=...)
    or GOSSIPCC_ALLREDUCE; here each method gets a group of its own.)"""
    gossipcc.configure(allreduce=policy, new_groups_only=True)
    group = dist.new_group(backend="gossipcc")
    gossipcc.configure(allreduce=None, new_groups_only=True)
    model = torch.nn.parallel.DistributedDataParallel(make_model(), process_group=group)
    opt = sgd(model)
    losses = []
    for x, y in batches(rank, steps):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return model.module, losses, spread(model.module)


def train_ddp_hook(rank, steps, hook):
    """DDP with one of gossipcc's comm hooks: native PowerSGD, or D-PSGD gossip (no all-reduce)."""
    import gossipcc.hooks
    model = torch.nn.parallel.DistributedDataParallel(make_model())
    if hook == "powersgd":
        state = gossipcc.hooks.PowerSGDState(process_group=None, matrix_approximation_rank=2,
                                             start_powerSGD_iter=10, module=model.module)
        model.register_comm_hook(state, gossipcc.hooks.powerSGD_hook)
    else:
        model.register_comm_hook(gossipcc.hooks.GossipHookState(graph="ring"), gossipcc.hooks.gossip_hook)
    opt = sgd(model)
    losses = []
    for x, y in batches(rank, steps):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    apart = spread(model.module)
    if hook == "gossip":  # replicas are close, not equal: evaluate their exact average
        with torch.no_grad():
            for p in model.module.parameters():
                dist.all_reduce(p)
                p.div_(dist.get_world_size())
    return model.module, losses, apart


METHODS = {  # name: (recipe, what it is)
    "sgp": (lambda rank, steps: train_gossip("sgp", rank, steps),
            "GossipDataParallel(algorithm='sgp'): push-sum gossip, one peer per step"),
    "osgp": (lambda rank, steps: train_gossip("osgp", rank, steps, synch_freq=1),
             "GossipDataParallel(algorithm='osgp', synch_freq=1): overlapped push-sum"),
    "dpsgd": (lambda rank, steps: train_gossip("dpsgd", rank, steps, graph="ring"),
              "GossipDataParallel(algorithm='dpsgd', graph='ring'): symmetric gossip"),
    "adpsgd": (train_adpsgd, "BilatGossipDataParallel: asynchronous pairwise gossip (AD-PSGD)"),
    "easgd": (train_easgd, "AllReduceEA(tau=4, alpha=0.3): elastic averaging"),
    "uneven": (train_uneven, "AllReduceSGD: all-reduce SGD, ranks with different step counts"),
    "allreduce": (lambda rank, steps: train_ddp(rank, steps, "exact"),
                  "DDP on a gossipcc group, exact all-reduce"),
    "powersgd": (lambda rank, steps: train_ddp(rank, steps, "powersgd:rank=2,start_iter=10"),
                 "DDP on a gossipcc group with allreduce='powersgd:rank=2,start_iter=10'"),
    "powersgd_hook": (lambda rank, steps: train_ddp_hook(rank, steps, "powersgd"),
                      "DDP with gossipcc.hooks.powerSGD_hook"),
    "gossip_hook": (lambda rank, steps: train_ddp_hook(rank, steps, "gossip"),
                    "DDP with gossipcc.hooks.gossip_hook (D-PSGD on a ring)"),
    "diloco": (lambda rank, steps: train_diloco(rank, steps, sync_every=10),
               "DiLoCo(sync_every=10): outer Nesterov step every 10 inner steps, sync() at the end"),
    "streaming_diloco": (lambda rank, steps: train_diloco(rank, steps, sync_every=10, fragments=2, overlap=2,
                                                          mix=0.5),
                         "DiLoCo(sync_every=10, fragments=2, overlap=2, mix=0.5): Streaming DiLoCo"),
    "local": (train_local, "no communication, each rank alone (the baseline for the spread column)"),
}


def accuracy(model):
    g = torch.Generator().manual_seed(12345)
    x = torch.randn(2000, FEATURES, generator=g)
    with torch.no_grad():
        return (model(x).argmax(1) == (x @ TEACHER).argmax(1)).float().mean().item()


def run(rank, world_size, init_method, methods, steps):
    dist.init_process_group("gossipcc", init_method=init_method, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=120))
    rows = []
    for name in methods:
        model, losses, apart = METHODS[name][0](rank, steps)
        acc = accuracy(model)
        rows.append((name, losses[0], sum(losses[-5:]) / len(losses[-5:]), acc, apart))
    if rank == 0:
        print(f"{'method':<16} {'first loss':>10} {'last loss':>10} {'accuracy':>9} {'spread':>9}")
        for name, first, last, acc, apart in rows:
            print(f"{name:<16} {first:>10.4f} {last:>10.4f} {acc:>9.3f} {apart:>9.4f}")
        sys.stdout.flush()
    dist.barrier()
    dist.destroy_process_group()


def _spawned(rank, world_size, init_method, methods, steps):
    torch.set_num_threads(1)
    run(rank, world_size, init_method, methods, steps)


def main():
    width = max(map(len, METHODS))
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="methods:\n" + "\n".join(f"  {name:<{width}}  {what}" for name, (_, what) in METHODS.items()))
    parser.add_argument("--world-size", type=int, default=4, help="local ranks to start (default 4)")
    parser.add_argument("--steps", type=int, default=60, help="training steps per rank (default 60)")
    parser.add_argument("--methods", default=",".join(METHODS),
                        help="comma-separated methods to run, from the list below (default: all)")
    args = parser.parse_args()
    methods = [m for m in args.methods.split(",") if m]
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        parser.error(f"unknown methods {unknown}; choose from {', '.join(METHODS)}")
    if "RANK" in os.environ:  # under torchrun
        run(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), "env://", methods, args.steps)
        return
    with tempfile.TemporaryDirectory() as tmp:
        torch.multiprocessing.spawn(_spawned, args=(args.world_size, "file://" + os.path.join(tmp, "init"),
                                                    methods, args.steps), nprocs=args.world_size)


if __name__ == "__main__":
    main()
