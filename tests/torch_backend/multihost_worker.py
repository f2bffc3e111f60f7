"""One rank of a multi-host test (test_multihost.py), launched the way PyTorch users launch a job:
torch's variables only (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE), no interface variable.

    multihost_worker.py MODE BACKEND OUT_DIR [TIMEOUT_S]

MODE:
  sum      init_process_group(BACKEND, env://), all-reduce a tensor, print and record the sum.
  train    DDP (exact) for a few steps; on gossipcc also the PowerSGD policy (a second group
           with GOSSIPCC_ALLREDUCE=powersgd) and a push-sum round; records the results.
  init     init_process_group only, expected to fail: records the error and how long it took.
Writes OUT_DIR/rank<r>.json.
"""
import datetime
import json
import os
import sys
import time


def main():
    mode, backend, out_dir = sys.argv[1], sys.argv[2], sys.argv[3]
    timeout_s = float(sys.argv[4]) if len(sys.argv) > 4 else 30.0
    rank = int(os.environ["RANK"])
    # Debian's torch 2.x lacks libuv, which its TCPStore asks for by default (import gossipcc
    # sets this itself; the gloo control run does not import gossipcc). Any torch accepts 0.
    os.environ.setdefault("USE_LIBUV", "0")
    record = {"rank": rank, "host": os.uname().nodename}
    import torch
    import torch.distributed as dist
    if backend == "gossipcc":
        import gossipcc
    start = time.monotonic()
    try:
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    except Exception as e:  # noqa: BLE001 - recorded for the test
        record.update(init_error=f"{type(e).__name__}: {e}", init_seconds=time.monotonic() - start)
        write(out_dir, rank, record)
        if mode == "init" and rank == 0:
            # Rank 0 hosts env://'s store, which torch's TCPStore keeps serving after a failed
            # init for as long as this process lives. Were it to exit now, a rank still in its
            # store calls (a loaded machine: seen at two tests per core, "The client socket has
            # timed out ... trying to connect to (host0, 29500)") would fail on the store instead
            # of meeting its own problem, which is what these cases check.
            wait_for_records(out_dir, int(os.environ.get("MULTIHOST_LAUNCHED", "1")), timeout_s + 60)
        return 0 if mode == "init" else 1
    record["init_seconds"] = time.monotonic() - start
    if mode == "init":
        record["init_error"] = None
        write(out_dir, rank, record)
        dist.destroy_process_group()
        return 0
    world = dist.get_world_size()
    t = torch.ones(3) * (rank + 1)
    dist.all_reduce(t)
    record["sum"] = t.tolist()
    print(f"{record['host']} {backend} rank {rank} of {world}: sum {t.tolist()}", flush=True)
    if mode == "train":
        from torch.nn.parallel import DistributedDataParallel as DDP

        def train(process_group):
            torch.manual_seed(0)
            model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)),
                        process_group=process_group)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for step in range(6):
                g = torch.Generator().manual_seed(100 * step + rank)
                x = torch.randn(8, 16, generator=g)
                opt.zero_grad()
                torch.nn.functional.mse_loss(model(x), x[:, :4]).backward()
                opt.step()
            return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist()

        record["ddp"] = train(None)
        if backend == "gossipcc":
            gossipcc.configure(allreduce="powersgd:rank=1,start_iter=2,min_compression_rate=0", new_groups_only=True)
            powersgd_group = dist.new_group(backend="gossipcc")
            gossipcc.configure(allreduce=None, new_groups_only=True)
            record["ddp_powersgd"] = train(powersgd_group)
            backend_object = gossipcc.get_backend_object()
            x = torch.full((5,), float(rank))
            weight = torch.ones(1, dtype=torch.float64)
            backend_object.push_sum_round([x], weight, 0, "ring", None).wait()
            record["push_sum"] = {"x": x.tolist(), "weight": weight.item()}
    dist.barrier()
    dist.destroy_process_group()
    write(out_dir, rank, record)
    return 0


def wait_for_records(out_dir, launched, limit_s):
    """Until rank<r>.json exists for every r < launched; a safety net far above a run's time."""
    deadline = time.monotonic() + limit_s
    while True:
        missing = [r for r in range(launched) if not os.path.exists(os.path.join(out_dir, f"rank{r}.json"))]
        if not missing:
            return
        if time.monotonic() > deadline:
            print(f"rank 0: ranks {missing} recorded nothing within {limit_s:.0f} s; leaving", file=sys.stderr)
            return
        time.sleep(0.05)


def write(out_dir, rank, record):
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(record, f)


if __name__ == "__main__":
    sys.exit(main())
