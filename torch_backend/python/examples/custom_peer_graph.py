"""Gossip over a peer graph of your own: the "edges:" spec (docs/gossip.md, user edge lists).

    PYTHONPATH=bazel-bin/torch_backend /usr/bin/python3 torch_backend/python/examples/custom_peer_graph.py

Starts 4 local ranks itself (file:// rendezvous); under torchrun
(`/usr/bin/python3 -m gossipcc.torchrun --nproc-per-node=4 custom_peer_graph.py`) it uses env://.

A spec "edges:a>b,c>d,...;e>f,..." lists directed edges src>dst; ';' separates phases and
step k uses phase k mod (number of phases). Any string accepted by `graph=` works the same way
in GossipDataParallel (SGP, OSGP; D-PSGD needs every phase undirected), the DDP gossip hook and
the process group's gossip collectives. Rank 0 prints:

1. how a bad edge list is refused (on every rank, when the wrapper is constructed);
2. push-sum on GRAPH without an optimizer: every rank's de-biased value x / w and weight w
   after each round, from x = rank + 1, w = 1 (rank 0 has two out-peers in phase 1, so the
   weights move away from 1 and the de-biasing matters); the values approach the mean 2.5;
3. training with SGP on GRAPH and with D-PSGD on the undirected SYMMETRIC list: first and last
   loss and the accuracy of the exactly averaged model.
"""
import datetime
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.nn.functional as F

import gossipcc

WORLD_SIZE = 4
# Phase 0: a directed ring. Phase 1: rank 0 sends to 2 and 3, the others to a neighbour.
GRAPH = "edges:0>1,1>2,2>3,3>0;0>2,0>3,1>0,2>1,3>1"
# Undirected (every edge both ways): a path 0-1-2-3 with a chord 0-2, for D-PSGD.
SYMMETRIC = "edges:0>1,1>0,1>2,2>1,2>3,3>2,0>2,2>0"
# Rank 3 has no edge: refused.
BAD = "edges:0>1,1>2,2>0"
ROUNDS = 6

FEATURES, CLASSES = 20, 4
TEACHER = torch.randn(FEATURES, CLASSES, generator=torch.Generator().manual_seed(7))


def show_refusal(rank):
    try:
        gossipcc.GossipDataParallel(torch.nn.Linear(2, 2), graph=BAD)
    except ValueError as e:
        if rank == 0:
            print(f"refused {BAD!r}: {e}")
    else:
        raise AssertionError(f"{BAD!r} was accepted")


def mixing(rank):
    """Push-sum rounds only: each training-mode forward of the wrapper runs one round."""
    net = torch.nn.Linear(1, 1, bias=False).double()
    with torch.no_grad():
        net.weight.fill_(rank + 1.0)
    model = gossipcc.GossipDataParallel(net, graph=GRAPH, broadcast_init=False)  # keep x = rank + 1
    for k in range(ROUNDS):
        model(torch.zeros(1, 1, dtype=torch.float64))  # the round; no optimizer step
        values = [torch.zeros(2, dtype=torch.float64) for _ in range(WORLD_SIZE)]
        dist.all_gather(values, torch.tensor([net.weight.item(), model.ps_weight], dtype=torch.float64))
        if rank == 0:
            z = " ".join(f"{v[0].item():.17g}" for v in values)
            w = " ".join(f"{v[1].item():.17g}" for v in values)
            print(f"round {k}: z {z} w {w}")


def batches(rank, steps, batch_size=32):
    g = torch.Generator().manual_seed(1 + rank)
    for _ in range(steps):
        x = torch.randn(batch_size, FEATURES, generator=g)
        yield x, (x @ TEACHER).argmax(1)


def train(rank, algorithm, graph, steps=40):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(FEATURES, 64), torch.nn.ReLU(), torch.nn.Linear(64, CLASSES))
    model = gossipcc.GossipDataParallel(net, algorithm=algorithm, graph=graph)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for x, y in batches(rank, steps):
        loss = F.cross_entropy(model(x), y)  # this step's round with this step's phase first
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    model.average_parameters()  # exact consensus, bitwise equal on every rank
    g = torch.Generator().manual_seed(12345)
    x = torch.randn(2000, FEATURES, generator=g)
    with torch.no_grad():
        acc = (net(x).argmax(1) == (x @ TEACHER).argmax(1)).float().mean().item()
    if rank == 0:
        print(f"train {algorithm} {losses[0]:.4f} {sum(losses[-5:]) / 5:.4f} {acc:.3f}")


def run(rank, world_size, init_method):
    if world_size != WORLD_SIZE:
        raise SystemExit(f"custom_peer_graph.py: the edge lists are written for {WORLD_SIZE} ranks, got {world_size}")
    dist.init_process_group("gossipcc", init_method=init_method, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=120))
    show_refusal(rank)
    mixing(rank)
    train(rank, "sgp", GRAPH)
    train(rank, "dpsgd", SYMMETRIC)
    sys.stdout.flush()
    dist.barrier()
    dist.destroy_process_group()


def _spawned(rank, init_method):
    torch.set_num_threads(1)
    run(rank, WORLD_SIZE, init_method)


def main():
    if "RANK" in os.environ:  # under torchrun
        run(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), "env://")
        return
    with tempfile.TemporaryDirectory() as tmp:
        torch.multiprocessing.spawn(_spawned, args=("file://" + os.path.join(tmp, "init"),), nprocs=WORLD_SIZE)


if __name__ == "__main__":
    main()
