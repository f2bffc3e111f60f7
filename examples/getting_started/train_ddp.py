"""DDP on gossipcc: unmodified DistributedDataParallel code; the all-reduce policy
(GOSSIPCC_ALLREDUCE, e.g. powersgd:rank=1,start_iter=10) chooses how gradients are averaged.
Launch: /usr/bin/python3 -m gossipcc.torchrun --nproc-per-node=2 examples/getting_started/train_ddp.py"""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import gossipcc  # registers the "gossipcc" backend

dist.init_process_group(backend="gossipcc")  # env:// from torchrun's variables
rank, world = dist.get_rank(), dist.get_world_size()

torch.manual_seed(0)  # the same initial model on every rank (DDP also broadcasts rank 0's)
model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
teacher = torch.nn.Linear(32, 4)  # the task: classify by a fixed random linear map
data = torch.Generator().manual_seed(1 + rank)  # each rank its own data

for step in range(60):
    x = torch.randn(64, 32, generator=data)
    y = teacher(x).argmax(dim=1)
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if rank == 0 and step % 20 == 0:
        print(f"step {step:3d}  loss {loss.item():.4f}", flush=True)

# Every rank holds the same model after DDP; check it and report.
flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
spread = flat.clone()
dist.all_reduce(spread, op=dist.ReduceOp.MAX)
dist.all_reduce(flat, op=dist.ReduceOp.MIN)
if rank == 0:
    policy = gossipcc.get_backend_object().allreduce_policy.split(":")[0]  # "exact" or "powersgd"
    print(f"policy {policy}, {world} ranks, final loss {loss.item():.4f}, "
          f"replicas identical: {bool(torch.equal(spread, flat))}", flush=True)
dist.destroy_process_group()
