"""One rank of test_topology.py: env:// init on backend gossipcc (GOSSIPCC_TOPOLOGY from the
environment), the topology the backend learned, a large all-reduce of every reduce op against
the reference, one DDP step against a model whose gradients are averaged by hand, and push-sum
rounds (GossipDataParallel's), D-PSGD rounds, a quantized all-reduce, PowerSGD (the DDP hook's
and DiLoCo's call) beside PowerSGD on a flat group of one rank per node fed the node means. Writes rank<r>.json into the output directory."""
import json
import os
import sys
import warnings

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import gossipcc


def value(rank, n):
    # Small integers: exact in float32 whatever the order of the additions.
    i = torch.arange(n, dtype=torch.int64)
    return ((rank * 131 + i * 7) % 23 - 11).to(torch.float32)


PUSH_SUM_ROUNDS = 3
QUANTIZED_COUNT = 5000
POWERSGD_SHAPES = {"w1": (24, 32), "w2": (40, 12), "b": (16,)}


def powersgd_input(rank, call):
    """Small integers (exact host means of 2 ranks), one tensor per key."""
    out = []
    for k, (key, shape) in enumerate(POWERSGD_SHAPES.items()):
        n = torch.tensor(shape).prod().item()
        i = torch.arange(n, dtype=torch.int64)
        out.append(((i * (7 + 2 * rank + k) + 13 * call + 5 * rank) % 17 - 8).to(torch.float32).reshape(shape))
    return out


def powersgd_calls(backend, inputs):
    """Two calls of powersgd_allreduce (rank 2, the first exact), in place on copies of inputs."""
    state = gossipcc._C.PowerSGD("rank=2,start_iter=1")
    outs = []
    for grads in inputs:
        grads = [g.clone() for g in grads]
        backend.powersgd_allreduce(grads, None, state, list(POWERSGD_SHAPES)).wait()
        outs.append(torch.cat([g.flatten() for g in grads]).tolist())
    return outs


def push_sum_input(rank):
    return torch.sin(torch.arange(1001, dtype=torch.float64) * 0.37 + 1.3 * rank).to(torch.float32) * (rank + 1)


def main(out):
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist.init_process_group("gossipcc")
    record = {"rank": rank, "topology": gossipcc.get_backend_object().topology(),
              "warnings": [str(w.message) for w in caught if "LOCAL_WORLD_SIZE" in str(w.message)]}
    n = 300001  # past the direct all-reduce's 512 KiB: the ring, or the two levels
    results = {}
    for op, name in [(dist.ReduceOp.SUM, "sum"), (dist.ReduceOp.MAX, "max"), (dist.ReduceOp.MIN, "min")]:
        t = value(rank, n)
        dist.all_reduce(t, op=op)
        everyone = torch.stack([value(r, n) for r in range(world)])
        want = {"sum": everyone.sum(0), "max": everyone.max(0).values, "min": everyone.min(0).values}[name]
        results[name] = int((t != want).sum())
    record["mismatches"] = results

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))
    reference = [p.detach().clone() for p in net.parameters()]
    model = DDP(net)
    x = torch.randn(8, 256, generator=torch.Generator().manual_seed(rank))
    model(x).square().mean().backward()
    # The average of every rank's gradient, computed here from every rank's input.
    ref_net = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))
    grads = [torch.zeros_like(p) for p in reference]
    for r in range(world):
        with torch.no_grad():
            for p, q in zip(ref_net.parameters(), reference):
                p.copy_(q)
        ref_net.zero_grad()
        ref_net(torch.randn(8, 256, generator=torch.Generator().manual_seed(r))).square().mean().backward()
        for g, p in zip(grads, ref_net.parameters()):
            g += p.grad / world
    record["ddp_max_grad_diff"] = max(float((p.grad - g).abs().max()) for p, g in zip(model.parameters(), grads))

    x = push_sum_input(rank)
    w = torch.ones(1, dtype=torch.float64)
    backend = gossipcc.get_backend_object()
    for step in range(PUSH_SUM_ROUNDS):
        backend.push_sum_round([x], w, step, "exponential").wait()
    record["push_sum"] = {"x": x.tolist(), "w": float(w)}
    x = push_sum_input(rank)
    for step in range(PUSH_SUM_ROUNDS):
        backend.symmetric_gossip_round([x], step, "ring").wait()
    record["symmetric"] = x.tolist()
    x = push_sum_input(rank)
    for step in range(PUSH_SUM_ROUNDS):
        backend.bilateral_exchange([x], step, "round_robin").wait()
    record["bilateral"] = x.tolist()
    q = value(rank, QUANTIZED_COUNT)
    backend.quantized_allreduce([q], bits=8, average=False).wait()
    record["quantized"] = q.tolist()
    record["powersgd"] = powersgd_calls(backend, [powersgd_input(rank, call) for call in range(2)])
    # The reference: the first rank of each node (host where the topology is two-level, rank
    # otherwise) runs PowerSGD on a flat group of those ranks, fed its node's mean.
    nodes = record["topology"]["hosts"] if record["topology"]["hierarchical"] else [[r] for r in range(world)]
    firsts = [ranks[0] for ranks in nodes]
    topology = os.environ.get("GOSSIPCC_TOPOLOGY")
    os.environ["GOSSIPCC_TOPOLOGY"] = "flat"
    reference_group = dist.new_group(ranks=firsts, backend="gossipcc")
    if topology is None:
        del os.environ["GOSSIPCC_TOPOLOGY"]
    else:
        os.environ["GOSSIPCC_TOPOLOGY"] = topology
    mine = next(ranks for ranks in nodes if rank in ranks)
    if rank in firsts:
        means = [[sum(powersgd_input(r, call)[k] for r in mine) / len(mine) for k in range(len(POWERSGD_SHAPES))]
                 for call in range(2)]
        record["powersgd_reference"] = powersgd_calls(gossipcc.get_backend_object(reference_group), means)
    dist.destroy_process_group()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(record, f)


if __name__ == "__main__":
    main(sys.argv[1])
