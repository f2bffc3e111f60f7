#!/usr/bin/env python3
"""Benchmark (c): one gossip round (push-sum, one peer per round, exponential graph: what SGP
does each step) vs an exact all-reduce of the same tensor, at n = 2, 4, 8 ranks, each rank its
own host with a 1 Gbit/s link by default; compared with one message time, bytes / rate.

    tools/bench/run.sh gossip_vs_allreduce [--hosts 2,4,8 [--ranks-per-host 1] | --ranks 2,4,8] [--network 1gbit]
                                           [--bytes 16777216] [--iters 1] [--graph exponential:peers=1]
                                           [--trials 5] [--max-load 0.5] [--allow-load] [--results-dir DIR]

--hosts is a comma list: one configuration per entry, of that many hosts of --ranks-per-host
ranks each (n = hosts x ranks per host).

Per n, in the same processes and on the same tensor: gossipcc's push_sum_round on the process
group, all-reduce through backend gossipcc and through gloo, and the round's exchange done
with plain TCP sockets (the same graph and peers, a connection per edge and direction, nothing
else: what this machine's network stack gives a round with no library at all). On
tools/bench/harness.py: per n one run of the ranks, an untimed warm-up of every op, then
--trials trials of --iters iterations; in each iteration the ops run in rotating order
(iteration i of trial t starts at op t + i), each preceded by an untimed barrier. A trial's sample
is the median over its iterations of the slowest rank's time; a cell is the median over the
trials with its min-max, and every ratio the median of the per-trial ratios. Bytes: NIC tx
counters per op (until after the next barrier), per rank (its own sockets) and per host (its
NIC: every rank of the host together). A push-sum round must send every rank's
share to its peer and receive one: its floor is one message time, flat in n; a ring all-reduce's
is 2(n-1)/n message times. On hosts of several ranks (--ranks-per-host G > 1) a fifth op, the
round over the hosts (GOSSIPCC_TOPOLOGY's default there): exact means inside each host, push-sum
between hosts with each rank carrying 1/G of the tensor, so each host's NIC carries one share per
out-peer instead of G.
"""
import argparse
import json
import os
import socket
import struct
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import harness  # noqa: E402

OPS = ("push-sum round", "all-reduce gossipcc", "all-reduce gloo", "plain TCP exchange")
# On hosts of several ranks also the round over the hosts (the default topology there: exact
# means inside each host, push-sum between hosts, each rank carrying 1/G; docs/gossip.md).
OVER_HOSTS = "push-sum round over hosts"


def ops_for(ranks_per_host, network):
    """The ops of a run: the round over hosts where hosts hold several ranks and are hosts of
    their own (emulated: a network namespace each; "local" runs every rank on this one)."""
    return OPS + ((OVER_HOSTS,) if ranks_per_host > 1 and network != "local" else ())


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


OPS_IN_TABLE_ORDER = ("push-sum round", "plain TCP exchange", "all-reduce gossipcc", "all-reduce gloo", OVER_HOSTS)


def cell_name(n):
    return f"n={n}"


def trial_samples(docs, trial, n):
    """One trial's samples from its ranks' documents (common.slowest_samples): per op the median
    over the trial's iterations of the slowest rank's time (s) and the tx bytes per op per rank
    and per host, averaged over the ranks (None where counters were unavailable)."""
    return {cell_name(n): common.slowest_samples(docs, trial, docs[0].get("ops", OPS))}


def record(run, docs, n, nbytes, bps, hosts=None, ranks_per_host=1):
    """One world size's documents into the harness run: its cell (n, its hosts x ranks per host,
    bytes, one message time nbytes / bps and the ring all-reduce's link bound 2(n-1)/n of it,
    None unshaped) and a trial per trial (rank 0's load probe)."""
    run.cell(cell_name(n), n=n, hosts=n // ranks_per_host if hosts is None else hosts, ranks_per_host=ranks_per_host,
             bytes=nbytes, message_time=nbytes / bps if bps else None,
             ring_bound=2 * (n - 1) / n * nbytes / bps if bps else None)
    for trial in range(len(docs[0]["trials"])):
        r = docs[0]["trials"][trial]
        run.add_trial(trial_samples(docs, trial, n), r["load"], r["order"], group=cell_name(n))


HEADER = ["n", "hosts x ranks", "push-sum round (ms)", "round / message time", "plain TCP exchange (ms)", "plain TCP / message time",
          "round / plain TCP", "all-reduce gossipcc (ms)", "all-reduce gloo (ms)", "gossipcc all-reduce / round",
          "gloo all-reduce / round", "ring bound / round", "sent/rank ÷ size: round", "all-reduce gossipcc",
          "all-reduce gloo", "plain TCP", "sent/host ÷ size: round", "all-reduce gossipcc", "all-reduce gloo",
          "plain TCP"]


OVER_HOSTS_HEADER = ["push-sum over hosts (ms)", "round / over hosts", "sent/host ÷ size: over hosts"]


def table_row(doc, cell, over_hosts=False):
    """The table's cells for one world size: times (median of the trials, min-max), each time over
    one message time, and the ratios between ops (medians of the per-trial ratios); with
    `over_hosts`, the round over the hosts' time, the flat round over it, and its bytes per host."""
    info, s, trials = doc["cells"][cell], doc["summary"]["cells"][cell]["methods"], doc["trials"]
    msg = info["message_time"]

    def ms(op):
        return harness.cell_text(s[op]["time"], 1e3, 1)

    def per_msg(op):
        return harness.cell_text(s[op]["time"], 1 / msg, 2) if msg else "-"

    def ratio(a, b):
        return harness.cell_text(harness.ratio_stats(trials, cell, a, b, "time"), 1, 2)

    g = "push-sum round"
    row = [info["n"], f"{info.get('hosts', info['n'])} x {info.get('ranks_per_host', 1)}", ms(g), per_msg(g), ms("plain TCP exchange"), per_msg("plain TCP exchange"),
           ratio(g, "plain TCP exchange"), ms("all-reduce gossipcc"), ms("all-reduce gloo"),
           ratio("all-reduce gossipcc", g), ratio("all-reduce gloo", g),
           f"{info['ring_bound'] / s[g]['time']['median']:.2f}" if msg else "-"]
    for key in ("sent", "host_sent"):
        row += [f"{s[op][key]['median'] / info['bytes']:.3f}" if s[op].get(key) is not None else "-" for op in OPS]
    if over_hosts:
        h = OVER_HOSTS
        present = h in s
        row += [ms(h) if present else "-", ratio(g, h) if present else "-",
                f"{s[h]['host_sent']['median'] / info['bytes']:.3f}" if present and s[h].get("host_sent") else "-"]
    return row


def report(doc):
    a = doc["args"]
    msg = next(iter(doc["cells"].values()))["message_time"] if doc["cells"] else None
    head = (f"gossip round (push_sum_round, graph {a['graph']}) vs exact all-reduce, {common.human_bytes(a['bytes'])} "
            f"float32 per rank, network {a['network']}, {a.get('ranks_per_host', 1)} rank(s) per host"
            + (f", one message time {1e3 * msg:.1f} ms" if msg else "")
            + f", {a['iters']} iteration(s) per trial")
    over_hosts = any(OVER_HOSTS in doc["summary"]["cells"][c]["methods"] for c in doc["cells"])
    rows = [table_row(doc, c, over_hosts) for c in doc["cells"]]
    header = HEADER + (OVER_HOSTS_HEADER if over_hosts else [])
    return "\n\n".join([harness.preamble(doc), head, harness.markdown_table(header, rows), harness.trials_table(doc)])


def plot(doc, path, goal=1.10):
    """Each op's median time against n (min-max as error bars), in message times where the link
    is shaped (ms otherwise), with the round's goal and the ring's link bound."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    infos = list(doc["cells"].items())
    shaped = all(info["message_time"] for _, info in infos)
    ns = [info["n"] for _, info in infos]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for op, style in zip(OPS_IN_TABLE_ORDER, ("o-", "^:", "s--", "d--", "v-")):
        if any(op not in doc["summary"]["cells"][c]["methods"] for c, _ in infos):
            continue
        unit = [info["message_time"] if shaped else 1e-3 for _, info in infos]
        st = [doc["summary"]["cells"][c]["methods"][op]["time"] for c, _ in infos]
        med = [s["median"] / u for s, u in zip(st, unit)]
        err = [[m - s["min"] / u for m, s, u in zip(med, st, unit)],
               [s["max"] / u - m for m, s, u in zip(med, st, unit)]]
        ax.errorbar(ns, med, yerr=err, fmt=style, capsize=2, label=op)
    if shaped:
        ax.plot(ns, [info["ring_bound"] / info["message_time"] for _, info in infos], ":", color="gray",
                label="ring all-reduce link bound 2(n-1)/n")
        ax.axhline(goal, color="red", linewidth=1, label=f"goal for the round: {goal:.2f} message times")
        ax.axhline(1.0, color="gray", linewidth=1)
    ax.set(xticks=ns, xlabel="ranks (n)", ylabel="time per op / one message time (bytes / rate)" if shaped
           else "time per op (ms)")
    ax.legend(fontsize=8)
    a = doc["args"]
    ax.set_title(f"{common.human_bytes(a['bytes'])} float32 per rank, network {a['network']}, graph {a['graph']}, "
                 f"median of {a['trials']} trials", fontsize=9)
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
    # Flat (every rank its own node), as this benchmark's reference assumes; the default (auto)
    # gossips over the hosts on hosts of several ranks (docs/gossip.md, "Push-sum over hosts").
    os.environ["GOSSIPCC_TOPOLOGY"] = "flat"
    gcc = dist.new_group(backend="gossipcc")
    del os.environ["GOSSIPCC_TOPOLOGY"]
    backend = gossipcc.get_backend_object(gcc)
    ops = ops_for(args.ranks_per_host, args.network)
    over_hosts = None
    if OVER_HOSTS in ops:
        over_hosts = gossipcc.get_backend_object(dist.new_group(backend="gossipcc"))  # the default: auto
        if not over_hosts.topology()["hierarchical"]:
            raise AssertionError(f"rank {rank}: the default topology is not two-level on these hosts: "
                                 f"{over_hosts.topology()['description']}")
    x = torch.empty(args.bytes // 4, dtype=torch.float32)
    w = torch.ones(1, dtype=torch.float64)
    plain = PlainTcpExchange(dist, rank, args.bytes, _C.peer_graph_info(args.graph, n)["period"],
                             lambda step: _C.peer_graph_out_peers(args.graph, n, rank, step),
                             lambda step: _C.peer_graph_in_peers(args.graph, n, rank, step))
    steps = {"push-sum round": 0, "plain TCP exchange": 0, OVER_HOSTS: 0}

    def run(op):
        if op == "push-sum round":
            backend.push_sum_round([x], w, steps[op], args.graph).wait()
            steps[op] += 1
        elif op == OVER_HOSTS:
            over_hosts.push_sum_round([x], w, steps[op], args.graph).wait()
            steps[op] += 1
        elif op == "all-reduce gossipcc":
            dist.all_reduce(x, group=gcc)
        elif op == "all-reduce gloo":
            dist.all_reduce(x, group=gloo)
        else:
            plain.exchange(steps[op], memoryview(x.numpy()).cast("B"))
            steps[op] += 1

    def one(op):
        x.fill_(rank + 1)
        w.fill_(1.0)
        measured = common.timed(lambda: run(op), dist.barrier)
        if op.startswith("all-reduce") and x[0].item() != n * (n + 1) / 2:
            raise AssertionError(f"{op}: got {x[0].item()}, expected {n * (n + 1) / 2}")
        return measured

    for op in ops:  # warm-up, not timed
        one(op)
    trials = common.run_trials(dist.barrier, ops, args.trials, args.iters, one)
    step = steps["push-sum round"]
    # One more round, checked against its exact result computed here (and for conservation).
    x.fill_(rank + 1)
    w.fill_(1.0)
    backend.push_sum_round([x], w, step, args.graph).wait()
    check_push_sum_round(x, w, args.graph, n, rank, step)
    check = torch.tensor([x[0].item(), w.item()], dtype=torch.float64)
    dist.all_reduce(check, group=gloo)
    if abs(check[0].item() - n * (n + 1) / 2) > 1e-3 or abs(check[1].item() - n) > 1e-9:
        raise AssertionError(f"push-sum round did not conserve mass: sum x {check[0].item()}, sum w {check[1].item()}")
    if over_hosts is not None:  # one round over the hosts, against push-sum over the host means
        x.fill_(rank + 1)
        w.fill_(1.0)
        over_hosts.push_sum_round([x], w, steps[OVER_HOSTS], args.graph).wait()
        hosts = over_hosts.topology()["hosts"]
        host = next(h for h, ranks in enumerate(hosts) if rank in ranks)
        means = [sum(r + 1.0 for r in ranks) / len(ranks) for ranks in hosts]
        ex, ew = push_sum_expected(args.graph, len(hosts), host, steps[OVER_HOSTS], means, [1.0] * len(hosts))
        bad = ((x.double() - ex).abs() > 1e-6 * max(1.0, abs(ex))).nonzero()
        if len(bad) or abs(w.item() - ew) > 1e-12:
            raise AssertionError(f"push-sum round over hosts on rank {rank} (host {host} of {len(hosts)}, step "
                                 f"{steps[OVER_HOSTS]}): x[0] = {x[0].item()}, w = {w.item()}; expected x = {ex}, "
                                 f"w = {ew} from push-sum over the hosts' means")
    dist.barrier()
    plain.close()
    dist.destroy_process_group()
    with open(args.out, "w") as f:
        json.dump({"trials": trials, "ops": list(ops)}, f)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    common.add_cluster_arguments(p, hosts="2,4,8", network="1gbit", sweep_hosts=True)
    p.add_argument("--bytes", type=int, default=16 << 20, help="tensor size")
    p.add_argument("--iters", type=int, default=1, help="iterations per trial")
    p.add_argument("--graph", default="exponential:peers=1")
    p.add_argument("--plot", metavar="PNG", help="also write a plot (time per op in message times against n) here")
    harness.add_arguments(p)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    if args.iters < 1:
        common.fail(f"gossip_vs_allreduce: --iters must be at least 1, got {args.iters}")
    common.resolve_cluster_arguments(args, "gossip_vs_allreduce")
    bps = common.link_bytes_per_second(args.network)
    methods = [op for op in OPS_IN_TABLE_ORDER if op in ops_for(args.ranks_per_host, args.network)]
    run = harness.Run("gossip_vs_allreduce", args, methods, "push-sum round", "time")
    for hosts, n in zip(args.hosts, args.ranks):
        try:
            with common.make_cluster(hosts, args.ranks_per_host, args.network) as cluster:
                docs = common.run_ranks(cluster, os.path.abspath(__file__),
                                        ["--bytes", str(args.bytes), "--iters", str(args.iters), "--graph", args.graph,
                                         "--trials", str(args.trials), "--ranks-per-host", str(args.ranks_per_host),
                                         "--network", args.network],
                                        timeout=1800)
        except common.NamespacesUnavailable as e:
            common.fail(f"gossip_vs_allreduce: emulated network not available: {e}")
        record(run, docs, n, args.bytes, bps, hosts, args.ranks_per_host)
        s = harness.summarize(run.trials, [cell_name(n)], run.methods, run.baseline, "time")[cell_name(n)]["methods"]
        print(f"  n = {n}: round {1e3 * s['push-sum round']['time']['median']:.1f} ms, plain TCP exchange "
              f"{1e3 * s['plain TCP exchange']['time']['median']:.1f} ms, all-reduce gossipcc "
              f"{1e3 * s['all-reduce gossipcc']['time']['median']:.1f} ms, gloo "
              f"{1e3 * s['all-reduce gloo']['time']['median']:.1f} ms (medians of {args.trials} trials)", flush=True)
    doc = run.finish(report)
    if args.plot:
        plot(doc, args.plot)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
