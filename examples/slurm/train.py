"""A small DDP job on backend "gossipcc", launched one process per Slurm task (train.sbatch).

Plain env:// rendezvous, exactly as under torchrun: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
and LOCAL_RANK come from the environment (train.sbatch derives them from Slurm's variables; a
task started by srun without them falls back to SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID).
Trains a small MLP on synthetic regression data (each rank its own shard) for --steps steps,
then writes <result dir>/rank<RANK>.json: rank, world size, local rank, host, steps, the final
loss (this rank's last batch, and the mean over ranks), and a SHA-256 of the parameters'
bytes. DDP averages the gradients and every rank starts from rank 0's parameters, so every
rank's checksum must be the same.

    RESULT_DIR=... /usr/bin/python3 train.py [--steps 30] [--result-dir DIR]
"""
import argparse
import datetime
import hashlib
import json
import math
import os
import socket
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import gossipcc  # noqa: F401  registers backend "gossipcc" (from bazel-bin/torch_backend on PYTHONPATH)


def env_int(name, slurm_name):
    value = os.environ.get(name, os.environ.get(slurm_name))
    if value is None:
        raise SystemExit(f"train.py: neither {name} nor {slurm_name} is set: launch it with train.sbatch or srun")
    return int(value)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--timeout", type=float, default=120, help="init_process_group timeout, seconds")
    parser.add_argument("--result-dir", default=os.environ.get("RESULT_DIR", "."))
    args = parser.parse_args()

    rank = env_int("RANK", "SLURM_PROCID")
    world_size = env_int("WORLD_SIZE", "SLURM_NTASKS")
    local_rank = env_int("LOCAL_RANK", "SLURM_LOCALID")
    os.environ.setdefault("RANK", str(rank))
    os.environ.setdefault("WORLD_SIZE", str(world_size))
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))

    start = time.monotonic()
    dist.init_process_group(backend="gossipcc", init_method="env://",
                            timeout=datetime.timedelta(seconds=args.timeout))
    assert dist.get_rank() == rank and dist.get_world_size() == world_size

    # Different seeds per rank on purpose: DDP must make the parameters equal (it broadcasts
    # rank 0's at construction) and keep them equal (averaged gradients).
    torch.manual_seed(1000 + rank)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    true_w = torch.linspace(-1, 1, 16).unsqueeze(1)  # the same target function on every rank

    loss = torch.tensor(float("nan"))
    for _ in range(args.steps):
        x = torch.randn(args.batch, 16)
        y = x @ true_w + 0.01 * torch.randn(args.batch, 1)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    mean_loss = loss.detach().clone()
    dist.all_reduce(mean_loss)
    mean_loss /= world_size
    digest = hashlib.sha256()
    for p in model.module.parameters():
        digest.update(p.detach().contiguous().numpy().tobytes())
    result = {
        "rank": rank,
        "world_size": world_size,
        "local_rank": local_rank,
        "host": socket.gethostname(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "master": f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}",
        "backend": dist.get_backend(),
        "steps": args.steps,
        "final_loss": float(loss),
        "mean_final_loss": float(mean_loss),
        "param_sha256": digest.hexdigest(),
        "seconds": round(time.monotonic() - start, 3),
    }
    dist.barrier()
    dist.destroy_process_group()

    os.makedirs(args.result_dir, exist_ok=True)
    path = os.path.join(args.result_dir, f"rank{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(result, f, indent=1)
    os.replace(path + ".tmp", path)
    print(f"rank {rank}/{world_size} on {result['host']}: loss {result['final_loss']:.4f} "
          f"(mean {result['mean_final_loss']:.4f}), params sha256 {result['param_sha256'][:16]}, "
          f"{result['seconds']} s", flush=True)
    if not math.isfinite(result["final_loss"]):
        raise SystemExit(f"rank {rank}: the loss is not finite")


if __name__ == "__main__":
    main()
