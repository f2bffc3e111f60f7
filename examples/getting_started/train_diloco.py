"""DiLoCo on gossipcc: each rank takes sync_every local (inner) steps, then the ranks average the
change once with an outer Nesterov step; nothing is sent in between.
Launch: /usr/bin/python3 -m gossipcc.torchrun --nproc-per-node=2 examples/getting_started/train_diloco.py"""
import torch
import torch.distributed as dist
import torch.nn.functional as F

import gossipcc

dist.init_process_group(backend="gossipcc")
rank, world = dist.get_rank(), dist.get_world_size()

torch.manual_seed(0)  # DiLoCo needs the same initial model on every rank
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
inner = torch.optim.AdamW(model.parameters(), lr=5e-3)
outer = torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True)
diloco = gossipcc.DiLoCo(model, inner, outer, sync_every=10)
teacher = torch.nn.Linear(32, 4)
data = torch.Generator().manual_seed(1 + rank)

for step in range(55):  # not a multiple of sync_every: the last 5 steps are synchronised by sync()
    x = torch.randn(64, 32, generator=data)
    y = teacher(x).argmax(dim=1)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    inner.step()
    inner.zero_grad()
    diloco.step()  # counts inner steps; every 10th synchronises
    if rank == 0 and step % 20 == 0:
        print(f"step {step:3d}  loss {loss.item():.4f}", flush=True)

diloco.sync()  # end of training: every rank holds one model, the synchronised one; evaluate or save it
flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
spread = flat.clone()
dist.all_reduce(spread, op=dist.ReduceOp.MAX)
dist.all_reduce(flat, op=dist.ReduceOp.MIN)
if rank == 0:
    print(f"diloco, {world} ranks, final loss {loss.item():.4f}, "
          f"replicas identical after sync: {bool(torch.equal(spread, flat))}", flush=True)
dist.destroy_process_group()
