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
