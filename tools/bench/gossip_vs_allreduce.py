#!/usr/bin/env python3
"""Benchmark (c): one gossip round (push-sum, one peer per round, exponential graph: what SGP
does each step) vs an exact all-reduce of the same tensor, at n = 2, 4, 8 ranks, each rank its
own host with a 1 Gbit/s link; compared with one message time, bytes / rate.

    tools/bench/run.sh gossip_vs_allreduce [--sizes-n 2,4,8] [--network 1gbit] [--bytes 16777216]

Per n, in the same processes and on the same tensor: gossipcc's push_sum_round on the process
group, all-reduce through backend gossipcc and through gloo, and the round's exchange done
with plain TCP sockets (the same graph and peers, a connection per edge and direction, nothing
else: what this machine's network stack gives a round with no library at all), alternating iteration by
iteration, each op preceded by an untimed barrier; a cell is the median over --iters of the
slowest rank's time. Bytes: NIC tx counters per rank per op (until after the next barrier).
A push-sum round must send every rank's share to its peer and receive one: its floor is one
message time, flat in n; a ring all-reduce's is 2(n-1)/n message times.
"""
import argparse
import json
import os
import socket
import struct
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

OPS = ("push-sum round", "all-reduce gossipcc", "all-reduce gloo", "plain TCP exchange")


class PlainTcpExchange:
    """The push-sum round's traffic with nothing but the kernel's TCP. `out_peers(step)` and
    `in_peers(step)` are this rank's peers at a step of the graph's `period` (the round's own
    graph: gossipcc._C.peer_graph_out_peers / in_peers). One connection per (step in the
    period, out-peer), made before timing; exchange(step, payload) sends payload to every
    out-peer of that step while receiving as many bytes from every in-peer."""

    def __init__(self, dist, rank, nbytes, period, out_peers, in_peers):
        self.rank, self.period = rank, period
        probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        probe.connect((os.environ["MASTER_ADDR"], 9))  # no packet sent: picks this host's address
        address = probe.getsockname()[0]
        probe.close()
        listener = socket.socket()
        listener.bind((address, 0))
        listener.listen(64)
        addresses = [None] * dist.get_world_size()
        dist.all_gather_object(addresses, (address, listener.getsockname()[1]))
        self.outs = [{p: None for p in out_peers(s)} for s in range(period)]
        self.ins = [{p: None for p in in_peers(s)} for s in range(period)]
        # One receive buffer per in-peer slot of a step (not per step and peer): at 64 MB and
        # n = 8 that is 64 MB per rank instead of period x 64 MB.
        self.scratch = [bytearray(nbytes) for _ in range(max((len(ins) for ins in self.ins), default=0))]
        self.slot_of = [{p: slot for slot, p in enumerate(ins)} for ins in self.ins]  # step -> peer -> slot

        def accept_all():
            for _ in range(sum(len(ins) for ins in self.ins)):
                conn, _ = listener.accept()
                step, source = struct.unpack("!ii", conn.recv(8, socket.MSG_WAITALL))
                self.ins[step][source] = conn

        acceptor = threading.Thread(target=accept_all)
        acceptor.start()
        for step, outs in enumerate(self.outs):
            for peer in outs:
                s = socket.create_connection(addresses[peer])
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                s.sendall(struct.pack("!ii", step, rank))
                outs[peer] = s
        acceptor.join()
        listener.close()

    def exchange(self, step, payload):
        step %= self.period
        errors = []

        def send(sock):
            try:
                sock.sendall(payload)
            except OSError as e:
                errors.append(e)

        def receive(slot, source, sock):
            view, got = memoryview(self.scratch[slot]), 0
            while got < len(view):
                k = sock.recv_into(view[got:])
                if k == 0:
                    errors.append(ConnectionError(f"rank {self.rank}: rank {source} closed the plain TCP exchange "
                                                  f"after {got} bytes"))
                    return
                got += k

        threads = [threading.Thread(target=send, args=(sock,)) for sock in self.outs[step].values()]
        threads += [threading.Thread(target=receive, args=(self.slot_of[step][source], source, sock))
                    for source, sock in self.ins[step].items()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]

    def received(self, step, source):
        """What `source` sent at `step`, until the next exchange."""
        return self.scratch[self.slot_of[step % self.period][source]]

    def close(self):
        for socks in self.outs + self.ins:
            for s in socks.values():
                s.close()


OPS_IN_TABLE_ORDER = ("push-sum round", "plain TCP exchange", "all-reduce gossipcc", "all-reduce gloo")


def summarize(docs, n, nbytes, bps):
    """One world size's figures from its ranks' documents: per op, the median over iterations
    of the slowest rank's time (s) and the tx bytes per op averaged over ranks ("tx", None
    where counters were unavailable); the message time nbytes / bps and the ring all-reduce's
    link bound 2(n-1)/n of it (None unshaped)."""
    iters = len(docs[0]["times"][OPS[0]])
    result = {"n": n, "bytes": nbytes,
              "message_time": nbytes / bps if bps else None,
              "ring_bound": 2 * (n - 1) / n * nbytes / bps if bps else None, "tx": {}}
    for op in OPS:
        result[op] = common.median([max(d["times"][op][j] for d in docs) for j in range(iters)])
        result["tx"][op] = (sum(d["tx_per_op"][op] for d in docs) / len(docs)) if docs[0]["tx_per_op"][op] else None
    return result


def table_row(r, msg):
    """The table's cells for one summarize() result, load average excluded."""
    g, t, a, b = (r[op] for op in OPS_IN_TABLE_ORDER)
    row = [r["n"], f"{1e3 * g:.1f}", f"{g / msg:.2f}" if msg else "-"]
    row += [f"{1e3 * t:.1f}", f"{t / msg:.2f}" if msg else "-", f"{g / t:.2f}"]
    row += [f"{1e3 * a:.1f}", f"{1e3 * b:.1f}", f"{a / g:.2f}", f"{b / g:.2f}"]
    row += [f"{r['ring_bound'] / g:.2f}" if msg else "-"]
    row += [f"{r['tx'][op] / r['bytes']:.3f}" if r["tx"][op] is not None else "-" for op in OPS]
    return row


def plot(results, path, title, goal=1.10):
    """results: summarize() per world size. Each op's time against n, in message times where
    the link is shaped (ms otherwise), with the round's goal and the ring's link bound."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    shaped = all(r["message_time"] for r in results)
    unit = (lambda r: r["message_time"]) if shaped else (lambda r: 1e-3)
    ns = [r["n"] for r in results]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for op, style in zip(OPS_IN_TABLE_ORDER, ("o-", "^:", "s--", "d--")):
        ax.plot(ns, [r[op] / unit(r) for r in results], style, label=op)
    if shaped:
        ax.plot(ns, [r["ring_bound"] / r["message_time"] for r in results], ":", color="gray",
                label="ring all-reduce link bound 2(n-1)/n")
        ax.axhline(goal, color="red", linewidth=1, label=f"goal for the round: {goal:.2f} message times")
        ax.axhline(1.0, color="gray", linewidth=1)
    ax.set(xticks=ns, xlabel="ranks (n)", ylabel="time per op / one message time (bytes / rate)" if shaped
           else "time per op (ms)")
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def push_sum_expected(graph, n, rank, step, values, weights):
    """(x, w) that `rank` holds after one push-sum round at `step` of `graph` from every rank j's
    (values[j], weights[j]): the uniform shares 1/(|out_j| + 1) that rank j keeps and sends to
    each of its out-peers, summed here from the peer schedule."""
    from gossipcc import _C
    period = _C.peer_graph_info(graph, n)["period"]
    x = w = 0.0
    for j in range(n):
        out = list(_C.peer_graph_out_peers(graph, n, j, step % period))
        if j == rank or rank in out:
            share = 1.0 / (len(out) + 1)
            x += share * values[j]
            w += share * weights[j]
    return x, w


def check_push_sum_round(x, w, graph, n, rank, step):
    """AssertionError unless `rank`'s (x, w) after a round at `step` from x = rank + 1, w = 1 on
    every rank is the round's exact result (push_sum_expected), every element of x."""
    ex, ew = push_sum_expected(graph, n, rank, step, [j + 1.0 for j in range(n)], [1.0] * n)
    bad = ((x.double() - ex).abs() > 1e-6 * max(1.0, abs(ex))).nonzero()
    if len(bad) or abs(w.item() - ew) > 1e-12:
        where = f"x[{bad[0].item()}] = {x[bad[0]].item()}" if len(bad) else f"x = {x[0].item()}"
        raise AssertionError(f"push-sum round on rank {rank} of {n} (graph {graph}, step {step}): {where}, "
                             f"w = {w.item()}; expected x = {ex}, w = {ew} from the peer schedule")


def worker(args):
    import datetime
    import torch
    import torch.distributed as dist
    import gossipcc
    from gossipcc import _C
    torch.set_num_threads(1)
    rank, n = common.worker_env()
    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=300))
    gloo = dist.new_group(backend="gloo")
    gcc = dist.new_group(backend="gossipcc")
    backend = gossipcc.get_backend_object(gcc)
    x = torch.empty(args.bytes // 4, dtype=torch.float32)
    w = torch.ones(1, dtype=torch.float64)
    plain = PlainTcpExchange(dist, rank, args.bytes, _C.peer_graph_info(args.graph, n)["period"],
                             lambda step: _C.peer_graph_out_peers(args.graph, n, rank, step),
                             lambda step: _C.peer_graph_in_peers(args.graph, n, rank, step))
    plain_step = 0
    times = {op: [] for op in OPS}
    sent = {op: 0 for op in OPS}
    step = 0
    for i in range(-1, args.iters):  # -1: warm-up
        order = OPS if i % 2 == 0 else OPS[::-1]
        for op in order:
            x.fill_(rank + 1)
            w.fill_(1.0)
            dist.barrier()
            c0 = common.rank_tx_bytes()
            t0 = time.perf_counter()
            if op == "push-sum round":
                backend.push_sum_round([x], w, step, args.graph).wait()
                step += 1
            elif op == "all-reduce gossipcc":
                dist.all_reduce(x, group=gcc)
            elif op == "all-reduce gloo":
                dist.all_reduce(x, group=gloo)
            else:
                plain.exchange(plain_step, memoryview(x.numpy()).cast("B"))
                plain_step += 1
            dt = time.perf_counter() - t0
            dist.barrier()
            c1 = common.rank_tx_bytes()
            if op.startswith("all-reduce") and x[0].item() != n * (n + 1) / 2:
                raise AssertionError(f"{op}: got {x[0].item()}, expected {n * (n + 1) / 2}")
            if i >= 0:
                times[op].append(dt)
                if c0 is not None:
                    sent[op] += c1 - c0
    # One more round, checked against its exact result computed here (and for conservation).
    x.fill_(rank + 1)
    w.fill_(1.0)
    backend.push_sum_round([x], w, step, args.graph).wait()
    check_push_sum_round(x, w, args.graph, n, rank, step)
    check = torch.tensor([x[0].item(), w.item()], dtype=torch.float64)
    dist.all_reduce(check, group=gloo)
    if abs(check[0].item() - n * (n + 1) / 2) > 1e-3 or abs(check[1].item() - n) > 1e-9:
        raise AssertionError(f"push-sum round did not conserve mass: sum x {check[0].item()}, sum w {check[1].item()}")
    dist.barrier()
    plain.close()
    dist.destroy_process_group()
    with open(args.out, "w") as f:
        json.dump({"times": times, "tx_per_op": {op: sent[op] / args.iters for op in OPS}}, f)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--sizes-n", default="2,4,8", help="world sizes")
    p.add_argument("--network", default="1gbit")
    p.add_argument("--bytes", type=int, default=16 << 20, help="tensor size")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--graph", default="exponential:peers=1")
    p.add_argument("--plot", metavar="PNG", help="also write a plot (time per op in message times against n) here")
    args = p.parse_args()
    if args.worker:
        return worker(args)
    import emulated_cluster
    rate, _ = emulated_cluster.parse_network(args.network) if args.network != "local" else (None, None)
    bps = emulated_cluster.rate_bits_per_second(rate) / 8 if rate else None
    msg = args.bytes / bps if bps else None
    print(f"gossip round (push_sum_round, graph {args.graph}) vs exact all-reduce, {common.human_bytes(args.bytes)} "
          f"float32, network {args.network}" + (f", one message time {1e3 * msg:.1f} ms" if msg else ""))
    rows, results = [], []
    for n in [int(v) for v in args.sizes_n.split(",")]:
        load0 = common.load_average()
        try:
            with common.make_cluster(n, args.network) as cluster:
                docs = common.run_ranks(cluster, os.path.abspath(__file__),
                                        ["--bytes", str(args.bytes), "--iters", str(args.iters), "--graph", args.graph],
                                        timeout=900)
        except common.NamespacesUnavailable as e:
            common.fail(f"gossip_vs_allreduce: emulated network not available: {e}")
        result = summarize(docs, n, args.bytes, bps)
        results.append(result)
        rows.append(table_row(result, msg) + [f"{load0} -> {common.load_average()}"])
        g, t, a, b = (result[op] for op in OPS_IN_TABLE_ORDER)
        print(f"  n = {n}: round {1e3 * g:.1f} ms, plain TCP exchange {1e3 * t:.1f} ms, "
              f"all-reduce gossipcc {1e3 * a:.1f} ms, gloo {1e3 * b:.1f} ms", flush=True)
    print()
    print(common.markdown_table(
        ["n", "push-sum round (ms)", "round / message time", "plain TCP exchange (ms)", "plain TCP / message time",
         "round / plain TCP", "all-reduce gossipcc (ms)", "all-reduce gloo (ms)",
         "gossipcc all-reduce / round", "gloo all-reduce / round", "ring bound / round",
         "sent/rank ÷ size: round", "all-reduce gossipcc", "all-reduce gloo", "plain TCP", "load average"], rows))
    if args.plot:
        plot(results, args.plot, f"{common.human_bytes(args.bytes)} float32 per rank, network {args.network}, "
             f"graph {args.graph}")
        print(f"\nplot: {args.plot}")


if __name__ == "__main__":
    main()
