#!/usr/bin/env python3
"""One rank of the main job: trains an MLP on scikit-learn's digits with one method.

Started by train.py (inside the rank's network namespace, or as a local process); reads
RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT from the environment (init_method env://, or
--init-method). Writes one JSON object per line to --out: "start", one "eval" per evaluation
(every --eval-every steps and after the last), and "end".

Clocks: `train_time` counts only training steps (evaluation pauses it, on every rank at the
same steps), so methods are compared on the time their steps take. `tx_bytes` is the rank's
NIC counter (/sys/class/net/$GOSSIPCC_NETNS_IFACE/statistics/tx_bytes) since training began,
when running in the emulated cluster; null otherwise.
"""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tools/
import methods  # noqa: E402
from emulated_cluster import rank_tx_bytes as tx_counter  # noqa: E402

torch.set_num_threads(1)  # 4 ranks share 2 cores: one compute thread each
torch.set_num_interop_threads(1)


def load_digits(seed=0, test_fraction=0.2):
    """scikit-learn's digits (8x8 images, 10 classes, 1797 samples; shipped by python3-sklearn),
    scaled to [0, 1], split into train/test with a fixed seed (the same on every rank)."""
    from sklearn.datasets import load_digits as sk_load
    data = sk_load()
    x = torch.tensor(data.data, dtype=torch.float32) / 16.0
    y = torch.tensor(data.target, dtype=torch.int64)
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(len(y), generator=g)
    n_test = int(len(y) * test_fraction)
    test, train = perm[:n_test], perm[n_test:]
    return x[train], y[train], x[test], y[test]


def make_model(hidden, seed):
    torch.manual_seed(seed)  # same initial model on every rank (DDP/wrappers broadcast anyway)
    return torch.nn.Sequential(
        torch.nn.Linear(64, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, 10))


class Shard:
    """This rank's disjoint part of the training set, reshuffled every epoch."""

    def __init__(self, x, y, rank, world_size, batch, seed):
        idx = torch.arange(rank, len(y), world_size)
        self.x, self.y, self.batch = x[idx], y[idx], batch
        self.gen = torch.Generator().manual_seed(seed * 1000 + rank)
        self.order, self.pos = None, len(idx)

    def next(self):
        if self.pos + self.batch > len(self.y):
            self.order, self.pos = torch.randperm(len(self.y), generator=self.gen), 0
        sel = self.order[self.pos:self.pos + self.batch]
        self.pos += self.batch
        return self.x[sel], self.y[sel]


def evaluate(model, x, y):
    was_training = model.training
    model.eval()
    with torch.no_grad():
        out = model(x)
        loss = torch.nn.functional.cross_entropy(out, y).item()
        acc = (out.argmax(1) == y).float().mean().item()
    model.train(was_training)
    return loss, acc


class Progress:
    """Rank 0's one-line progress display (rewritten in place on a terminal)."""

    def __init__(self, method, steps, enabled):
        self.method, self.steps, self.enabled = method, steps, enabled
        self.tty = enabled and sys.stdout.isatty()
        self.quarter = -1  # not a terminal: a line per quarter of the run

    def show(self, step, train_time, loss, acc, final=False):
        if not self.enabled:
            return
        width = 20
        done = int(width * step / self.steps)
        line = (f"  {self.method:16s} [{'#' * done}{'.' * (width - done)}] step {step:4d}/{self.steps}"
                f"  {train_time:6.1f} s  loss {loss:.3f}  test acc {100 * acc:5.1f}%")
        if self.tty:
            sys.stdout.write("\r" + line + ("\n" if final else ""))
        elif final or 4 * step // self.steps > self.quarter:
            self.quarter = 4 * step // self.steps
            sys.stdout.write(line + "\n")
        sys.stdout.flush()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--method", required=True, choices=sorted(methods.REGISTRY))
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=8, help="per rank")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--eval-every", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--init-method", default="env://")
    p.add_argument("--powersgd-start-iter", type=int, default=methods.POWERSGD_START_ITER,
                   help="exact all-reduce steps before PowerSGD compresses (both PowerSGD variants)")
    p.add_argument("--local-sgd-start-iter", type=int, default=methods.LOCAL_SGD_START_ITER,
                   help="post-local SGD (torch-postlocal): steps of DDP's all-reduce before local steps")
    p.add_argument("--sync-every", type=int, default=methods.LOCAL_SGD_PERIOD,
                   help="post-local SGD (torch-postlocal): steps between two model averagings")
    p.add_argument("--timeout", type=float, default=120, help="seconds for any collective")
    p.add_argument("--out", required=True, help="JSON lines file for this rank")
    p.add_argument("--progress", action="store_true", help="show a progress line (rank 0)")
    args = p.parse_args(argv)
    import faulthandler
    import signal
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the driver asks for stacks on a hang

    import datetime
    import torch.distributed as dist
    import gossipcc
    methods.POWERSGD_START_ITER = args.powersgd_start_iter
    methods.LOCAL_SGD_START_ITER, methods.LOCAL_SGD_PERIOD = args.local_sgd_start_iter, args.sync_every
    method = methods.REGISTRY[args.method]
    method.configure(gossipcc)
    dist.init_process_group(method.backend, init_method=args.init_method,
                            timeout=datetime.timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()

    x_train, y_train, x_test, y_test = load_digits(args.seed)
    shard = Shard(x_train, y_train, rank, world, args.batch, args.seed)
    module = make_model(args.hidden, args.seed)
    n_params = sum(p.numel() for p in module.parameters())
    model = method.wrap(module)
    opt = method.optimizer(torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum))
    progress = Progress(args.method, args.steps, args.progress and rank == 0)

    with open(args.out, "w") as out:
        def record(obj):
            out.write(json.dumps(obj) + "\n")
            out.flush()

        record({"type": "start", "method": args.method, "rank": rank, "world_size": world,
                "backend": method.backend, "params": n_params, "batch": args.batch,
                "network": os.environ.get("GOSSIPCC_NETWORK", "local"), "torch": torch.__version__})
        dist.barrier()  # every rank starts its clock together
        tx0 = tx_counter()
        train_time, wall0, loss_sum, loss_n = 0.0, time.perf_counter(), 0.0, 0

        def eval_point(step):
            test_loss, test_acc = evaluate(module, x_test, y_test)
            tx = tx_counter()
            record({"type": "eval", "step": step, "train_time": train_time,
                    "wall": time.perf_counter() - wall0, "loss": loss_sum / max(1, loss_n),
                    "test_loss": test_loss, "test_acc": test_acc,
                    "tx_bytes": None if tx is None or tx0 is None else tx - tx0})
            progress.show(step, train_time, loss_sum / max(1, loss_n), test_acc, final=step == args.steps)

        eval_point(0)
        for step in range(1, args.steps + 1):
            xb, yb = shard.next()
            t = time.perf_counter()
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step == args.steps:
                method.finish(model)
            train_time += time.perf_counter() - t
            loss_sum += loss.item()
            loss_n += 1
            if step % args.eval_every == 0 or step == args.steps:
                eval_point(step)
                loss_sum, loss_n = 0.0, 0
        tx = tx_counter()
        end = {"type": "end", "steps": args.steps, "train_time": train_time,
               "tx_bytes": None if tx is None or tx0 is None else tx - tx0,
               "param_probe": methods.param_probe(module)}  # the trained model, before any final averaging
        if method.average is not None:
            method.average(model)  # after the counters: the final averaging is not a training step
            end["averaged_test_loss"], end["averaged_test_acc"] = evaluate(module, x_test, y_test)
        record(end)
    dist.barrier()
    methods.leave(method)  # gloo ranks: os._exit(0), without the group's teardown


if __name__ == "__main__":
    main()
