"""tools/bench/gossip_vs_allreduce.py's plain TCP exchange, the floor it reports beside the
push-sum round: over loopback, with ranks as threads and the project's own peer graphs, every
rank receives exactly what each of its in-peers sent, step after step."""
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


def doc(round_times, plain, gossipcc, gloo, tx=(1000.0, 1500.0, 1500.0, 1000.0)):
    ops = ("push-sum round", "all-reduce gossipcc", "all-reduce gloo", "plain TCP exchange")
    return {"times": dict(zip(ops, (round_times, gossipcc, gloo, plain))), "tx_per_op": dict(zip(ops, tx))}


# Two ranks, three iterations. Slowest rank per iteration, round: 2, 5, 3 -> median 3 (rank 1's
# 5 is iteration 2's slowest, not an outlier dropped); plain TCP 2, 2, 2; all-reduces 4 and 6.
DOCS = [doc([2.0, 1.0, 3.0], [2.0] * 3, [4.0] * 3, [6.0] * 3),
        doc([1.0, 5.0, 2.0], [1.0] * 3, [3.0] * 3, [5.0] * 3, tx=(3000.0, 2500.0, 1500.0, 1000.0))]


def test_summary_takes_the_slowest_rank_per_iteration_then_the_median():
    m = bench_script.load("gossip_vs_allreduce")
    r = m.summarize(DOCS, n=4, nbytes=1000, bps=500.0)
    assert (r["push-sum round"], r["plain TCP exchange"], r["all-reduce gossipcc"], r["all-reduce gloo"]) == \
        (3.0, 2.0, 4.0, 6.0)
    assert r["message_time"] == 2.0  # 1000 bytes at 500 B/s
    assert r["ring_bound"] == 3.0  # 2(n-1)/n = 1.5 message times at n = 4
    assert r["tx"]["push-sum round"] == 2000.0  # averaged over the ranks
    row = m.table_row(r, r["message_time"])
    # n, round ms, round / message time, plain ms, plain / message time, round / plain, ...
    assert row[:6] == [4, "3000.0", "1.50", "2000.0", "1.00", "1.50"]
    # all-reduce ms, gossipcc / round, gloo / round, ring bound / round, bytes per op ÷ size
    assert row[6:] == ["4000.0", "6000.0", "1.33", "2.00", "1.00", "2.000", "2.000", "1.500", "1.000"]


def test_unshaped_summary_has_no_message_time():
    m = bench_script.load("gossip_vs_allreduce")
    r = m.summarize(DOCS, n=2, nbytes=1000, bps=None)
    assert r["message_time"] is None and r["ring_bound"] is None
    assert m.table_row(r, None)[2] == "-"


@pytest.mark.parametrize("bps", [500.0, None])
def test_plot_writes_a_png(tmp_path, bps):
    m = bench_script.load("gossip_vs_allreduce")
    results = [m.summarize(DOCS, n, 1000, bps) for n in (2, 4, 8)]
    path = tmp_path / "round.png"
    m.plot(results, str(path), "test")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
