"""tools/bench/gossip_vs_allreduce.py's plain TCP exchange, the floor it reports beside the
push-sum round: over loopback, with ranks as threads and the project's own peer graphs, every
rank receives exactly what each of its in-peers sent, step after step. The push-sum round's
correctness check (its exact result on every rank from the peer schedule): on the real benchmark
over 3 local processes (2 trials), and refusing a no-op round, results on the wrong rank and an
unmixed weight. The table's figures (the slowest rank per iteration, the median over a trial, then
the median and min-max over trials, ratios within each trial) and the plot, on made-up timings."""
import threading

import bench_script
import pytest
from gossipcc import _C


class ThreadDist:
    """all_gather_object and get_world_size for ranks that are threads of this process."""

    def __init__(self, n):
        self.slots = [None] * n
        self.barrier = threading.Barrier(n)

    def for_rank(self, rank):
        outer = self

        class Dist:
            @staticmethod
            def get_world_size():
                return len(outer.slots)

            @staticmethod
            def all_gather_object(out, obj):
                outer.slots[rank] = obj
                outer.barrier.wait()
                out[:] = outer.slots
                outer.barrier.wait()

        return Dist


def byte_of(rank, step):
    return bytes([(rank * 7 + step) % 256])


@pytest.mark.parametrize("graph", ["exponential:peers=1", "exponential:peers=2"])
@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_every_rank_receives_each_in_peers_bytes(graph, n, monkeypatch):
    m = bench_script.load("gossip_vs_allreduce")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    nbytes = 300_000  # not a multiple of any socket buffer: the receive loop must stitch
    period = _C.peer_graph_info(graph, n)["period"]
    dist = ThreadDist(n)
    errors, checked = [], []

    def rank_body(rank):
        try:
            exchange = m.PlainTcpExchange(dist.for_rank(rank), rank, nbytes, period,
                                          lambda step: _C.peer_graph_out_peers(graph, n, rank, step),
                                          lambda step: _C.peer_graph_in_peers(graph, n, rank, step))
            for step in range(2 * period):
                exchange.exchange(step, memoryview(byte_of(rank, step) * nbytes))
                for source in _C.peer_graph_in_peers(graph, n, rank, step % period):
                    got = exchange.received(step, source)
                    if got[:1] != byte_of(source, step) or got[-1:] != byte_of(source, step):
                        errors.append(f"rank {rank}, step {step}: not rank {source}'s bytes")
                    checked.append((rank, step, source))
            exchange.close()
        except Exception as e:  # noqa: BLE001 (reported below, per rank)
            errors.append(f"rank {rank}: {e!r}")

    threads = [threading.Thread(target=rank_body, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(not t.is_alive() for t in threads), "an exchange hung"
    assert not errors, errors
    edges = sum(len(_C.peer_graph_in_peers(graph, n, r, s % period)) for r in range(n) for s in range(2 * period))
    assert len(checked) == edges


LOAD = {"loadavg_before": [0.5, 0.5, 0.5], "loadavg_after": [0.6, 0.5, 0.5], "wall_s": 9.0, "busy_cores": 1.0,
        "own_cores": 1.0, "other_cores": 0.0}
OPS = ("push-sum round", "all-reduce gossipcc", "all-reduce gloo", "plain TCP exchange")


def trial(round_times, plain, gossipcc, gloo, tx=(1000.0, 1500.0, 1500.0, 1000.0)):
    """One rank's trial: its times per iteration, and bytes per iteration: its own (tx) and its
    host's NIC's (twice tx, as on a host of two ranks)."""
    return {"times": dict(zip(OPS, (round_times, gossipcc, gloo, plain))),
            "sent": {op: [b] * len(round_times) for op, b in zip(OPS, tx)},
            "host_sent": {op: [2 * b] * len(round_times) for op, b in zip(OPS, tx)},
            "order": list(OPS), "load": LOAD}


# Two ranks, two trials of three iterations. Trial 1, slowest rank per iteration, round: 2, 5,
# 3 -> median 3 (rank 1's 5 is iteration 2's slowest, not an outlier dropped); plain TCP 2, 2,
# 2; all-reduces 4 and 6. Trial 2: the round 4, plain TCP 2, all-reduces 6 and 6.
DOCS = [{"trials": [trial([2.0, 1.0, 3.0], [2.0] * 3, [4.0] * 3, [6.0] * 3),
                    trial([4.0] * 3, [2.0] * 3, [6.0] * 3, [6.0] * 3)]},
        {"trials": [trial([1.0, 5.0, 2.0], [1.0] * 3, [3.0] * 3, [5.0] * 3, tx=(3000.0, 2500.0, 1500.0, 1000.0)),
                    trial([1.0] * 3, [1.0] * 3, [1.0] * 3, [1.0] * 3, tx=(3000.0, 2500.0, 1500.0, 1000.0))]}]


def recorded(ns=(4,), nbytes=1000, bps=500.0, docs=DOCS):
    m = bench_script.load("gossip_vs_allreduce")
    run = bench_script.harness().Run("gossip_vs_allreduce", bench_script.harness_args(trials=2),
                                     m.OPS_IN_TABLE_ORDER, "push-sum round", "time")
    for n in ns:
        m.record(run, docs, n, nbytes, bps, n // 2, 2)
    d = run.document()
    d["args"].update(graph="exponential:peers=1", bytes=nbytes, network="1gbit", iters=3)
    return m, d


def test_summary_takes_the_slowest_rank_per_iteration_then_the_median_then_over_trials():
    m, d = recorded()
    s = d["summary"]["cells"]["n=4"]["methods"]
    assert [t["samples"]["n=4"]["push-sum round"]["time"] for t in d["trials"]] == [3.0, 4.0]
    assert s["push-sum round"]["time"] == {"median": 3.5, "min": 3.0, "max": 4.0, "n": 2}
    assert d["cells"]["n=4"]["message_time"] == 2.0  # 1000 bytes at 500 B/s
    assert d["cells"]["n=4"]["ring_bound"] == 3.0  # 2(n-1)/n = 1.5 message times at n = 4
    assert s["push-sum round"]["sent"]["median"] == 2000.0  # averaged over the ranks
    assert s["push-sum round"]["host_sent"]["median"] == 4000.0  # the host's NIC, averaged over its ranks
    row = m.table_row(d, "n=4")
    # n, hosts x ranks, round ms, round / message time, plain ms, plain / message time, round /
    # plain (per trial: 1.5, 2)
    assert row[:7] == [4, "2 x 2", "3500.0 (3000.0-4000.0)", "1.75 (1.50-2.00)", "2000.0 (2000.0-2000.0)",
                       "1.00 (1.00-1.00)", "1.75 (1.50-2.00)"]
    # all-reduce ms; gossipcc / round per trial 4/3, 6/4 -> 1.42; gloo / round 2, 1.5 -> 1.75;
    # ring bound / round (of the medians); bytes per op ÷ size, per rank then per host
    assert row[7:] == ["5000.0 (4000.0-6000.0)", "6000.0 (6000.0-6000.0)", "1.42 (1.33-1.50)", "1.75 (1.50-2.00)",
                       "0.86", "2.000", "2.000", "1.500", "1.000", "4.000", "4.000", "3.000", "2.000"]


def test_unshaped_summary_has_no_message_time():
    m, d = recorded(ns=(2,), bps=None)
    assert d["cells"]["n=2"]["message_time"] is None and d["cells"]["n=2"]["ring_bound"] is None
    assert m.table_row(d, "n=2")[3] == "-"


@pytest.mark.parametrize("bps", [500.0, None])
def test_plot_writes_a_png(tmp_path, bps):
    m, d = recorded(ns=(2, 4, 8), bps=bps)
    path = tmp_path / "round.png"
    m.plot(d, str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| 8 |" in m.report(d)


def test_round_check_runs_the_benchmark_on_local_ranks(tmp_path):
    """The benchmark itself on 3 local processes (no emulated network), tiny tensor, 2 trials: its
    worker checks the push-sum round's result on every rank against push_sum_expected."""
    import os
    import subprocess
    import sys
    script = os.path.join(bench_script.TOOLS, "bench", "gossip_vs_allreduce.py")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([bench_script.TOOLS] + sys.path))
    out = subprocess.run([sys.executable, script, "--network", "local", "--ranks", "3", "--bytes", "4096",
                          "--iters", "1", "--trials", "2", "--allow-load", "--results-dir", str(tmp_path)],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "n = 3: round" in out.stdout and "(medians of 2 trials)" in out.stdout
    assert "| 3 |" in out.stdout


def test_round_over_hosts_runs_on_emulated_hosts_of_two_ranks(tmp_path):
    """On 2 emulated hosts of 2 ranks (network namespaces, unshaped) the benchmark adds the round
    over the hosts, which its worker checks against push-sum over the hosts' means, and reports
    its time and bytes per host. Needs root (namespaces); skips saying why otherwise."""
    import os
    import subprocess
    import sys
    import emulated_cluster
    try:
        emulated_cluster.check_namespaces_allowed()
    except emulated_cluster.NamespacesUnavailable as e:
        pytest.skip(f"no network namespaces here: {e}")
    script = os.path.join(bench_script.TOOLS, "bench", "gossip_vs_allreduce.py")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([bench_script.TOOLS] + sys.path))
    out = subprocess.run([sys.executable, script, "--network", "none", "--hosts", "2", "--ranks-per-host", "2",
                          "--bytes", "65536", "--iters", "1", "--trials", "1", "--allow-load",
                          "--results-dir", str(tmp_path)], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "| push-sum over hosts (ms) | round / over hosts | sent/host ÷ size: over hosts |" in out.stdout, out.stdout
    assert "| 4 | 2 x 2 |" in out.stdout, out.stdout


@pytest.mark.parametrize("graph", ["exponential:peers=1", "edges:0>1,1>2,2>3,3>0,0>2"])
def test_push_sum_expected_is_the_round_by_hand(graph):
    m = bench_script.load("gossip_vs_allreduce")
    values, weights = [1.0, 2.0, 3.0, 4.0], [1.0, 1.0, 1.0, 1.0]
    got = [m.push_sum_expected(graph, 4, r, 1, values, weights) for r in range(4)]
    if graph.startswith("exponential"):  # step 1: rank r sends half to r + 2
        assert got == [(2.0, 1.0), (3.0, 1.0), (2.0, 1.0), (3.0, 1.0)]
    else:  # rank 0 keeps and sends a third to 1 and 2; the others keep and send half
        expected = [(1 / 3 + 2.0, 1 / 3 + 0.5), (1 / 3 + 1.0, 1 / 3 + 0.5), (1 / 3 + 1.0 + 1.5, 1 / 3 + 1.0),
                    (1.5 + 2.0, 1.0)]
        assert got == [pytest.approx(e, abs=1e-12) for e in expected]


def test_round_check_refuses_wrong_results():
    """A round that did nothing, one whose results conserve the sums but sit on the wrong ranks,
    one that mixed x but not w, and one wrong element: each raises, naming the rank."""
    import torch
    m = bench_script.load("gossip_vs_allreduce")
    graph, n, step = "edges:0>1,1>2,2>3,3>0,0>2", 4, 0
    right = [m.push_sum_expected(graph, n, r, step, [1.0, 2.0, 3.0, 4.0], [1.0] * n) for r in range(n)]

    def check(rank, x, w, size=64):
        m.check_push_sum_round(torch.full((size,), x, dtype=torch.float32), torch.tensor([w], dtype=torch.float64),
                               graph, n, rank, step)

    for r in range(n):
        check(r, *right[r])  # the right results pass
    with pytest.raises(AssertionError, match="on rank 1 of 4"):
        check(1, 2.0, 1.0)  # no-op: x = rank + 1, w = 1
    with pytest.raises(AssertionError, match="on rank 0 of 4"):
        check(0, *right[3])  # sums conserved, wrong rank
    with pytest.raises(AssertionError, match="on rank 2 of 4"):
        check(2, right[2][0], 1.0)  # x mixed, w not
    x = torch.full((64,), right[3][0], dtype=torch.float32)
    x[17] += 0.5
    with pytest.raises(AssertionError, match=r"on rank 3 of 4 .*x\[17\]"):
        m.check_push_sum_round(x, torch.tensor([right[3][1]], dtype=torch.float64), graph, n, 3, step)
