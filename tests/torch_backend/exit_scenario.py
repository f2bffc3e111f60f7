"""Exit safety: many runs of DDP with PyTorch's powerSGD_hook on backend gossipcc, each rank a
process that ends through normal interpreter exit; every rank must exit with code 0.

    exit_scenario.py RUNS WORLD_SIZE LANES TMPDIR

The hook issues collectives from future callbacks and waits on them there, so gossipcc's
threads are completing operations and running Python callbacks up to the last step. Even runs
call destroy_process_group() before exiting, odd runs leave the group to interpreter exit
(DDP still holds it). Either way no gossipcc thread may touch Python once the interpreter
finalises: a thread that takes the GIL then is killed mid-C++ and the process aborts
("terminate called without an active exception").

To make a run cheap, this process imports torch once and forks the ranks of each run; a forked
rank returns to the top level of this script and ends like any script, through finalisation.
Prints one line per run that failed and a summary; exits 1 if any rank of any run did not exit 0.
"""
import datetime
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import gossipcc  # noqa: F401  (registers the backend; starts no thread)

RUN_DEADLINE_S = 300  # safety net per run, far above the ~1 s a run takes


def rank_main(rank, world_size, init, destroy):
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
    torch.set_num_threads(1)
    dist.init_process_group("gossipcc", init_method=init, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=30))
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)),
                bucket_cap_mb=0.001)
    model.register_comm_hook(powersgd.PowerSGDState(None, matrix_approximation_rank=2, start_powerSGD_iter=2),
                             powersgd.powerSGD_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(5):
        x = torch.randn(8, 20, generator=torch.Generator().manual_seed(10 * step + rank))
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
    if destroy:
        dist.destroy_process_group()


def run_all(runs, world_size, lanes, tmpdir):
    """Parent: forks each run's ranks and checks their exit. Returns the rank's work to do in a
    child (rank, init, destroy), or None in the parent once every run is done."""
    os.environ["GOSSIPCC_COLLECTIVE_LANES"] = str(lanes)
    failures, times = [], []
    for run in range(runs):
        init = f"file://{tmpdir}/init_lanes{lanes}_run{run}"
        destroy = run % 2 == 0
        start = time.monotonic()
        pids = {}
        for rank in range(world_size):
            pid = os.fork()
            if pid == 0:
                return rank, init, destroy
            pids[pid] = rank
        codes = {}
        while pids:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                if time.monotonic() - start > RUN_DEADLINE_S:
                    for p, r in pids.items():
                        os.kill(p, signal.SIGKILL)
                        codes[r] = f"killed after the {RUN_DEADLINE_S} s safety net (hung)"
                    for p in list(pids):
                        os.waitpid(p, 0)
                    break
                time.sleep(0.01)
                continue
            rank = pids.pop(pid)
            if os.WIFSIGNALED(status):
                codes[rank] = f"killed by signal {signal.Signals(os.WTERMSIG(status)).name}"
            else:
                codes[rank] = os.WEXITSTATUS(status)
        times.append(time.monotonic() - start)
        bad = {r: c for r, c in sorted(codes.items()) if c != 0}
        if bad:
            failures.append(run)
            print(f"lanes {lanes} run {run} ({'destroy' if destroy else 'no destroy'}): {bad}", flush=True)
    print(f"lanes {lanes}: {runs} runs x {world_size} ranks, {len(failures)} failed; "
          f"run time median {sorted(times)[len(times) // 2]:.2f} s, max {max(times):.2f} s", flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    child = run_all(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
    if child is not None:
        rank, init, destroy = child
        rank_main(rank, int(sys.argv[2]), init, destroy)
        # Falls off the end: normal interpreter exit (atexit handlers, finalisation).
