"""Shared by the benchmarks in tools/bench: run a worker on every rank of an emulated cluster
(or local processes), collect what each rank wrote, and small formatting helpers.

A benchmark script is both the driver and the worker: the driver calls run_ranks(), which
starts the same script with `--worker --out <file>` on every rank; each rank writes one JSON
document to its file and run_ranks() returns them by rank.
"""
import json
import os
import shutil
import statistics
import sys
import tempfile

TOOLS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, TOOLS)
import emulated_cluster  # noqa: E402,F401  (re-exported for the benchmarks)
import harness  # noqa: E402
from emulated_cluster import (ClusterError, EmulatedCluster, LocalCluster, NamespacesUnavailable,  # noqa: E402,F401
                              rank_tx_bytes)


def make_cluster(n, network):
    return LocalCluster(n) if network == "local" else EmulatedCluster(n, network)


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
