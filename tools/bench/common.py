"""Shared by the benchmarks in tools/bench: the cluster flags every benchmark takes, running a
worker on every rank of an emulated cluster (or local processes) and collecting what each rank
wrote, the timed trial loop of a worker, and small formatting helpers.

A benchmark script is both the driver and the worker: the driver calls run_ranks(), which
starts the same script with `--worker --out <file>` on every rank; each rank writes one JSON
document to its file and run_ranks() returns them by rank.

Cluster flags (add_cluster_arguments, resolve_cluster_arguments): `--hosts H --ranks-per-host G`
(G ranks on each of H emulated hosts, sharing its link as a node's GPUs share its NIC) or
`--ranks N` (N hosts of one rank each), and `--network` (an emulated_cluster preset such as
`100mbit-wan`, a link spec `rate=..,delay=..,jitter=..,loss=..%`, or `local`: processes on
loopback). A worker measures each op's bytes twice (timed()): its own sockets' bytes on its
host's NIC (per rank) and the NIC's whole counter (per host, every rank of the host together).
"""
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

TOOLS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, TOOLS)
import emulated_cluster  # noqa: E402,F401  (re-exported for the benchmarks)
import harness  # noqa: E402
from emulated_cluster import (ClusterError, EmulatedCluster, LocalCluster, NamespacesUnavailable,  # noqa: E402,F401
                              host_tx_bytes, rank_tx_bytes)


def make_cluster(hosts, ranks_per_host, network):
    """The cluster of `hosts` hosts of `ranks_per_host` ranks on `network` (local: processes on loopback)."""
    if network == "local":
        return LocalCluster(hosts=hosts, ranks_per_host=ranks_per_host)
    return EmulatedCluster(hosts=hosts, ranks_per_host=ranks_per_host, network=network)


# ---- the cluster flags ------------------------------------------------------------------------

def add_cluster_arguments(p, hosts=4, ranks_per_host=1, network="1gbit", sweep_hosts=False, sweep_networks=False):
    """--hosts, --ranks-per-host, --ranks and --network (--networks with sweep_networks: a comma
    list). sweep_hosts: --hosts and --ranks take comma lists (one configuration per entry).
    resolve_cluster_arguments() checks them."""
    kind = "comma list of " if sweep_hosts else ""
    p.add_argument("--hosts", default=None,
                   help=f"{kind}emulated hosts, each running --ranks-per-host ranks (default {hosts})")
    p.add_argument("--ranks-per-host", type=int, default=ranks_per_host,
                   help=f"ranks on each host, sharing its link as a node's GPUs share its NIC (default {ranks_per_host})")
    p.add_argument("--ranks", default=None,
                   help=f"{kind}N hosts of one rank each (the same as --hosts N --ranks-per-host 1)")
    presets = ", ".join(emulated_cluster.PRESETS)
    if sweep_networks:
        p.add_argument("--networks", default=network,
                       help=f"comma list of networks, each a preset ({presets}), a link spec "
                            f"rate=..[,delay=..[,jitter=..]][,loss=..%%] (its delay=, jitter= and loss= parts "
                            f"stay with it), or local (default {network})")
    else:
        p.add_argument("--network", default=network,
                       help=f"a preset ({presets}), a link spec rate=..[,delay=..[,jitter=..]][,loss=..%%], "
                            f"or local: processes on loopback (default {network})")
    p.set_defaults(_cluster_defaults=(hosts, sweep_hosts, sweep_networks))


SPEC_TAIL = ("delay=", "jitter=", "loss=")


def split_networks(text):
    """A comma list of networks -> the networks. A link spec's own commas stay in it: a
    delay=, jitter= or loss= part belongs to the link spec before it ("rate=100mbit,delay=25ms,
    1gbit" is two networks), so a spec of a delay alone can only come first or after a preset."""
    out = []
    for part in text.split(","):
        key = part.split("=")[0] + "="
        if out and part.startswith(SPEC_TAIL) and "=" in out[-1] and key not in [k.split("=")[0] + "="
                                                                                 for k in out[-1].split(",")]:
            out[-1] += "," + part
        else:
            out.append(part)
    return out


def _whole(text, flag):
    try:
        value = int(text)
    except (TypeError, ValueError):
        raise ValueError(f"{flag} must be a whole number, got {text!r}") from None
    return value


def resolve_cluster_arguments(args, prog, min_ranks=2):
    """Checks add_cluster_arguments's flags and sets args.hosts (an int, or a list with
    sweep_hosts), args.ranks_per_host, args.ranks (the world size, or a list of them) and
    args.networks (a list, also for --network); exits naming the flag that is wrong."""
    default_hosts, sweep_hosts, sweep_networks = args._cluster_defaults
    del args._cluster_defaults
    try:
        if args.ranks is not None and (args.hosts is not None or args.ranks_per_host != 1):
            raise ValueError("--ranks N means N hosts of one rank each: give it alone, or --hosts with "
                             "--ranks-per-host")
        flag, text = ("--ranks", args.ranks) if args.ranks is not None else ("--hosts", args.hosts)
        if text is None:
            hosts = [default_hosts]
        else:
            parts = str(text).split(",") if sweep_hosts else [text]
            hosts = [_whole(v, flag) for v in parts]
        layouts = [emulated_cluster.hosts_and_ranks(None, h, args.ranks_per_host) for h in hosts]
        small = [h * g for h, g in layouts if h * g < min_ranks]
        if small:
            raise ValueError(f"needs at least {min_ranks} ranks, got {small[0]} ({flag}, --ranks-per-host)")
        networks = split_networks(args.networks) if sweep_networks else [args.network]
        for network in networks:
            if network != "local":
                emulated_cluster.parse_link(network)
    except ValueError as e:
        fail(f"{prog}: {e}")
    args.ranks_per_host = layouts[0][1]
    args.hosts = [h for h, _ in layouts] if sweep_hosts else layouts[0][0]
    args.ranks = [h * args.ranks_per_host for h, _ in layouts] if sweep_hosts else args.hosts * args.ranks_per_host
    args.networks = networks
    if not sweep_networks:
        args.network = networks[0]


def world_text(hosts, ranks_per_host):
    """"4 hosts x 2 ranks" / "4 hosts x 1 rank", for the reports' headings."""
    return f"{hosts} hosts x {ranks_per_host} rank{'s' if ranks_per_host > 1 else ''}"


def args_world(a):
    """world_text() of a results document's args (older documents: --ranks hosts of one rank)."""
    hosts = a.get("hosts")
    if isinstance(hosts, list):
        hosts = ",".join(str(h) for h in hosts)
    return world_text(a["ranks"] if hosts is None else hosts, a.get("ranks_per_host", 1))


def link_bytes_per_second(network):
    """The network's per-host rate in bytes/s, or None (unshaped, loopback)."""
    rate = emulated_cluster.parse_link(network).rate if network != "local" else None
    return emulated_cluster.rate_bits_per_second(rate) / 8 if rate else None


# ---- the worker's timed trials ----------------------------------------------------------------

def tx_counters():
    """(this rank's bytes sent to other hosts, its host's NIC bytes) so far; None where not counted."""
    return rank_tx_bytes(), host_tx_bytes()


def _delta(a, b):
    return None if a is None or b is None else b - a


def timed(op, barrier):
    """Runs op() between two barriers: (seconds of op(), bytes this rank sent, bytes its host's
    NIC sent). The counters are read before the first barrier and after the second: no rank
    starts op() before every rank has read its counters, and none reads them again before every
    rank has finished op(), so the host's count holds all its ranks' bytes of op() (and its last
    queued segments); the barriers add a few hundred bytes. Bytes are None where not counted."""
    c0 = tx_counters()
    barrier()
    t0 = time.perf_counter()
    op()
    dt = time.perf_counter() - t0
    barrier()
    c1 = tx_counters()
    return dt, _delta(c0[0], c1[0]), _delta(c0[1], c1[1])


def run_trials(barrier, methods, trials, iterations, one):
    """The worker's trials (tools/bench/harness.py): per trial, `iterations` iterations in which
    every method runs once as one(method) -> timed()'s triple, in harness.trial_order(methods,
    trial, iteration), with the load probed around the trial. Returns per trial {"times",
    "sent", "host_sent": {method: [per iteration]}, "orders", "order" (the first iteration's),
    "load"}."""
    probe = harness.LoadProbe()
    out = []
    for trial in range(trials):
        barrier()
        probe.start()
        times, sent, host_sent = ({m: [] for m in methods} for _ in range(3))
        orders = []
        for i in range(iterations):
            order = harness.trial_order(methods, trial, i)
            orders.append(order)
            for m in order:
                dt, tx, host_tx = one(m)
                times[m].append(dt)
                if tx is not None:
                    sent[m].append(tx)
                if host_tx is not None:
                    host_sent[m].append(host_tx)
        barrier()
        out.append({"times": times, "sent": sent, "host_sent": host_sent, "orders": orders, "order": orders[0],
                    "load": probe.stop()})
    return out


def mean_over_ranks(runs, method, key):
    """The mean over the ranks of each rank's mean per iteration of runs[r][key][method] (bytes
    per op per rank, or per host: every rank of a host reads the same NIC); None without counters."""
    per_rank = [sum(r[key][method]) / len(r[key][method]) for r in runs if r.get(key, {}).get(method)]
    return sum(per_rank) / len(per_rank) if per_rank else None


def slowest_samples(docs, trial, methods):
    """One trial's samples from every rank's document of run_trials(): per method the median
    over the trial's iterations of the slowest rank's time (s), and the bytes sent per op per
    rank ("sent") and per host ("host_sent"), None without counters."""
    runs = [d["trials"][trial] for d in docs]
    samples = {}
    for m in methods:
        k = len(runs[0]["times"][m])
        samples[m] = {"time": median([max(r["times"][m][i] for r in runs) for i in range(k)]),
                      "sent": mean_over_ranks(runs, m, "sent"), "host_sent": mean_over_ranks(runs, m, "host_sent")}
    return samples


def bytes_text(s, scale=1e-6, digits=2):
    """harness.cell_text of a bytes figure (MB by default), "-" where it was not counted."""
    return harness.cell_text(s, scale, digits) if s else "-"


def run_ranks(cluster, script, args, timeout=600, env=None):
    """Runs `python3 script --worker --out <tmp>/rank<r>.json *args` on every rank of an open
    cluster; returns the ranks' JSON documents. On failure raises ClusterError with the tail
    of every rank's output."""
    tmp = tempfile.mkdtemp(prefix="gossipcc-bench-")
    try:
        outs = [os.path.join(tmp, f"rank{r}.json") for r in range(cluster.n)]
        logs = [open(os.path.join(tmp, f"rank{r}.log"), "w") for r in range(cluster.n)]
        cmds = [[sys.executable, script, "--worker", "--out", outs[r]] + list(args) for r in range(cluster.n)]
        try:
            # The ranks' load probes (harness.LoadProbe) count this process's tree as the benchmark's.
            cluster.run(cmds, env=dict({"OMP_NUM_THREADS": "1", harness.ROOT_PID_ENV: str(os.getpid())}, **(env or {})),
                        timeout=timeout,
                        stdout=logs, stderr=logs)
        except ClusterError as e:
            for f in logs:
                f.close()
            raise ClusterError(f"{e}{emulated_cluster.log_tails([f.name for f in logs])}") from None
        for f in logs:
            f.close()
        docs = []
        for path in outs:
            with open(path) as f:
                docs.append(json.load(f))
        return docs
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def worker_env():
    """(rank, world_size) from the environment the cluster gave this rank. Also lets the driver
    ask a hung rank for its stacks (SIGUSR1)."""
    import faulthandler
    import signal
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def human_bytes(n):
    for unit, size in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} B"


markdown_table = harness.markdown_table


def fail(message):
    print(message, file=sys.stderr)
    sys.exit(2)
