#!/usr/bin/env python3
"""One rank of the main job's language-model workload (lm.py): trains the byte-level GPT on the
`fortunes` text with one method until a training-time budget or a step cap.

Started by lm_job.py (inside the rank's network namespace, or as a local process); reads
RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT from the environment. Writes one JSON object per line
to --out: "start", one "eval" per evaluation (step 0, every --eval-every steps, the last step),
"end"; or one "skipped" when the installed gossipcc rejects the method's DiLoCo transport.

Clocks and counters as in worker.py: `train_time` counts training steps, batch sampling
included; evaluation and the stop decision pause it, at the same steps for every method
(communication a method runs in the background, such as an overlapped DiLoCo averaging, goes on
during the pause); `tx_bytes` is the rank's NIC counter since training began (emulated cluster
only). Every
rank stops at the same step: at each evaluation the ranks agree (an all-reduce of one float on
a separate gloo group, outside the clock) whether the slowest rank's clock has passed
--time-budget or the step cap is reached.
"""
import argparse
import datetime
import json
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))  # tools/
import lm  # noqa: E402
import methods  # noqa: E402
from emulated_cluster import rank_tx_bytes as tx_counter  # noqa: E402

torch.set_num_threads(1)  # 4 ranks share 2 cores: one compute thread each
torch.set_num_interop_threads(1)


def add_model_args(p):
    """The flags the job passes through to every rank (lm_job.py forwards them by name)."""
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--context", type=int, default=64, help="bytes per training window")
    p.add_argument("--batch", type=int, default=4, help="windows per rank per step")
    p.add_argument("--lr", type=float, default=6e-3, help="AdamW learning rate (every method; DiLoCo's inner)")
    p.add_argument("--warmup", type=int, default=10, help="steps of linear learning-rate warm-up")
    p.add_argument("--time-budget", type=float, default=50.0, help="seconds of training time per method")
    p.add_argument("--max-steps", type=int, default=100000, help="step cap per method")
    p.add_argument("--eval-every", type=int, default=20)
    p.add_argument("--val-windows", type=int, default=64, help="validation windows of --context bytes")
    p.add_argument("--sync-every", type=int, default=20, help="DiLoCo's H (inner steps per outer step); "
                   "torch-postlocal's averaging period")
    p.add_argument("--outer-lr", type=float, default=0.7, help="DiLoCo's outer learning rate (every DiLoCo "
                   "variant, torch-diloco included)")
    p.add_argument("--fragments", type=int, default=4, help="Streaming DiLoCo's fragments")
    p.add_argument("--overlap", type=int, default=1, help="Streaming DiLoCo's tau (inner steps in flight)")
    p.add_argument("--mix", type=float, default=0.5, help="Streaming DiLoCo's alpha")
    p.add_argument("--powersgd-start-iter", type=int, default=methods.POWERSGD_START_ITER)
    p.add_argument("--local-sgd-start-iter", type=int, default=methods.LOCAL_SGD_START_ITER,
                   help="post-local SGD (torch-postlocal): steps of DDP's all-reduce before local steps; "
                        "its averaging period is --sync-every")
    p.add_argument("--data", default=lm.FORTUNES_DIR)
    p.add_argument("--seed", type=int, default=0)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--method", required=True, choices=lm.known())
    add_model_args(p)
    p.add_argument("--init-method", default="env://")
    p.add_argument("--timeout", type=float, default=300, help="seconds for any collective")
    p.add_argument("--out", required=True, help="JSON lines file for this rank")
    p.add_argument("--progress", action="store_true", help="print a line per evaluation (rank 0)")
    args = p.parse_args(argv)
    import faulthandler
    import signal
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the driver asks for stacks on a hang

    out = open(args.out, "w")

    def record(obj):
        out.write(json.dumps(obj) + "\n")
        out.flush()

    method = lm.resolve(args.method)
    reason = lm.unsupported_reason(method)
    if reason is not None:  # every rank alike, before any collective
        record({"type": "skipped", "method": args.method, "reason": reason})
        return

    import torch.distributed as dist
    import gossipcc
    methods.POWERSGD_START_ITER = args.powersgd_start_iter
    methods.LOCAL_SGD_START_ITER, methods.LOCAL_SGD_PERIOD = args.local_sgd_start_iter, args.sync_every
    method.configure(gossipcc)
    dist.init_process_group(method.backend, init_method=args.init_method,
                            timeout=datetime.timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    control = dist.new_group(backend="gloo")  # the stop decision, apart from the method's traffic

    train_text, val_text = lm.load_text(args.data)
    windows = lm.val_windows(val_text, args.context, args.val_windows)
    sampler = lm.Sampler(train_text, args.context, args.batch, rank, args.seed)
    module = lm.make_model(args.d_model, args.layers, args.heads, args.context, args.seed)
    n_params = sum(q.numel() for q in module.parameters())
    diloco = None
    if isinstance(method, lm.DiLoCoMethod):
        model = module
        inner = torch.optim.AdamW(module.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
        outer = torch.optim.SGD(module.parameters(), lr=args.outer_lr, momentum=0.9, nesterov=True)
        try:
            diloco = gossipcc.DiLoCo(module, inner, outer, **method.options(args))
        except ValueError as e:
            # Construction is collective: every rank raises alike. A transport this package
            # rejects (where lm.unsupported_reason could not ask it first) is a skip, not a failure.
            if "outer_sync" not in str(e):
                raise
            record({"type": "skipped", "method": args.method, "reason": str(e)})
            out.close()
            dist.destroy_process_group()
            return
        finish = lambda m: diloco.flush()  # noqa: E731
    elif isinstance(method, lm.TorchDiLoCoMethod):
        model = module
        inner = torch.optim.AdamW(module.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
        outer = torch.optim.SGD(module.parameters(), lr=args.outer_lr, momentum=0.9, nesterov=True)
        diloco = lm.TorchDiLoCo(module, outer, args.sync_every)
        finish = lambda m: None  # noqa: E731 - nothing runs in the background
    else:
        model = method.wrap(module)
        inner = method.optimizer(
            torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0))
        finish = method.finish

    record({"type": "start", "method": args.method, "rank": rank, "world_size": world,
            "backend": method.backend, "params": n_params, "batch": args.batch, "context": args.context,
            "train_bytes": len(train_text), "val_bytes": len(val_text), "val_tokens": windows[1].numel(),
            "diloco": method.options(args) if diloco is not None else None, "lr": args.lr,
            "outer_lr": args.outer_lr if lm.has_outer_lr(method) else None,
            "network": os.environ.get("GOSSIPCC_NETWORK", "local"), "torch": torch.__version__})
    dist.barrier()  # every rank starts its clock together
    tx0 = tx_counter()
    train_time, wall0, loss_sum, loss_n = 0.0, time.perf_counter(), 0.0, 0

    def eval_point(step):
        val_loss = lm.evaluate(module, windows)
        tx = tx_counter()
        record({"type": "eval", "step": step, "train_time": train_time, "wall": time.perf_counter() - wall0,
                "loss": loss_sum / loss_n if loss_n else None, "val_loss": val_loss,
                "tx_bytes": None if tx is None or tx0 is None else tx - tx0})
        if args.progress and rank == 0:
            print(f"  {args.method:20s} step {step:5d}  {train_time:6.1f} s  val loss {val_loss:.3f}", flush=True)

    eval_point(0)
    step = 0
    while True:
        step += 1
        t = time.perf_counter()
        x, y = sampler.next()
        for g in inner.param_groups:
            g["lr"] = args.lr * min(1.0, step / max(1, args.warmup))
        loss = lm.loss_of(model, x, y)
        inner.zero_grad()
        loss.backward()
        inner.step()
        if diloco is not None:
            diloco.step()
        train_time += time.perf_counter() - t
        loss_sum += loss.item()
        loss_n += 1
        if step % args.eval_every == 0 or step >= args.max_steps:
            clock = torch.tensor([train_time], dtype=torch.float64)
            dist.all_reduce(clock, op=dist.ReduceOp.MAX, group=control)
            stop = clock.item() >= args.time_budget or step >= args.max_steps
            if stop:
                t = time.perf_counter()
                finish(model)  # OSGP's round in flight, AD-PSGD's finish, DiLoCo's averaging in flight
                train_time += time.perf_counter() - t
            eval_point(step)
            loss_sum, loss_n = 0.0, 0
            if stop:
                break
    tx = tx_counter()
    end = {"type": "end", "steps": step, "train_time": train_time,
           "tx_bytes": None if tx is None or tx0 is None else tx - tx0,
           "param_probe": methods.param_probe(module)}  # the trained model, before any final averaging
    if method.average is not None:
        method.average(model)  # after the counters: the final averaging is not a training step
        end["averaged_val_loss"] = lm.evaluate(module, windows)
    record(end)
    out.close()
    dist.barrier(group=control)
    methods.leave(method)  # gloo ranks: os._exit(0), without the group's teardown


if __name__ == "__main__":
    main()
