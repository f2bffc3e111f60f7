"""Gossip on gossipcc: SGP (push-sum), each rank exchanging with one peer per step instead of an
all-reduce; the replicas agree only approximately until average_parameters().
Launch: /usr/bin/python3 -m gossipcc.torchrun --nproc-per-node=2 examples/getting_started/train_gossip.py"""
import torch
import torch.distributed as dist
import torch.nn.functional as F

import gossipcc

dist.init_process_group(backend="gossipcc")
rank, world = dist.get_rank(), dist.get_world_size()

torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
model = gossipcc.GossipDataParallel(net, algorithm="sgp")  # or "osgp", "dpsgd" (docs/algorithms.md)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
teacher = torch.nn.Linear(32, 4)
data = torch.Generator().manual_seed(1 + rank)

for step in range(60):
    x = torch.randn(64, 32, generator=data)
    y = teacher(x).argmax(dim=1)
    loss = F.cross_entropy(model(x), y)  # a training-mode forward runs this step's gossip first
    opt.zero_grad()
    loss.backward()
    opt.step()
    if rank == 0 and step % 20 == 0:
        print(f"step {step:3d}  loss {loss.item():.4f}", flush=True)

model.average_parameters()  # the exact average on every rank: evaluate and save this one
flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
spread = flat.clone()
dist.all_reduce(spread, op=dist.ReduceOp.MAX)
dist.all_reduce(flat, op=dist.ReduceOp.MIN)
if rank == 0:
    print(f"sgp, {world} ranks, final loss {loss.item():.4f}, "
          f"replicas identical after average_parameters: {bool(torch.equal(spread, flat))}", flush=True)
dist.destroy_process_group()
