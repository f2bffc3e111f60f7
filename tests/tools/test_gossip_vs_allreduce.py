"""tools/bench/gossip_vs_allreduce.py's plain TCP exchange, the floor it reports beside the
push-sum round: its peers are the one-peer exponential graph's (algorithms/peer_graph.h), and on
loopback every rank receives exactly what its in-peer sent, phase after phase."""
import threading

import bench_script
import pytest


def load():
    return bench_script.load("gossip_vs_allreduce")


def test_offsets_follow_the_exponential_graph():
    # T = floor(log2(n - 1)) + 1 phases, offsets 2^m.
    m = load()
    assert m.exponential_peer_offsets(1) == []
    assert m.exponential_peer_offsets(2) == [1]
    assert m.exponential_peer_offsets(3) == [1, 2]
    assert m.exponential_peer_offsets(4) == [1, 2]
    assert m.exponential_peer_offsets(5) == [1, 2, 4]
    assert m.exponential_peer_offsets(8) == [1, 2, 4]
    assert m.exponential_peer_offsets(9) == [1, 2, 4, 8]


class ThreadDist:
    """all_gather_object for ranks that are threads of this process."""

    def __init__(self, n):
        self.slots = [None] * n
        self.barrier = threading.Barrier(n)

    def for_rank(self, rank):
        outer = self

        class Dist:
            @staticmethod
            def all_gather_object(out, obj):
                outer.slots[rank] = obj
                outer.barrier.wait()
                out[:] = outer.slots
                outer.barrier.wait()

        return Dist


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_every_rank_receives_its_in_peers_bytes(n, monkeypatch):
    m = load()
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    nbytes = 300_000  # not a multiple of any socket buffer: the receive loop must stitch
    dist = ThreadDist(n)
    errors, received = [], {}

    def rank_body(rank):
        try:
            exchange = m.PlainTcpExchange(dist.for_rank(rank), rank, n, nbytes)
            offsets = m.exponential_peer_offsets(n)
            for step in range(2 * max(len(offsets), 1)):
                payload = bytes([(rank * 7 + step) % 256]) * nbytes
                exchange.exchange(step, memoryview(payload))
                if offsets:
                    source = (rank - offsets[step % len(offsets)]) % n
                    received[(rank, step)] = (bytes(exchange.scratch[:1]), bytes(exchange.scratch[-1:]), source)
            exchange.close()
        except Exception as e:  # noqa: BLE001 (reported below, per rank)
            errors.append(f"rank {rank}: {e!r}")

    threads = [threading.Thread(target=rank_body, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert all(not t.is_alive() for t in threads), "an exchange hung"
    for (rank, step), (first, last, source) in received.items():
        expected = bytes([(source * 7 + step) % 256])
        assert first == expected and last == expected, f"rank {rank}, step {step}: bytes of the wrong rank"
    assert len(received) == (0 if n == 1 else n * 2 * len(m.exponential_peer_offsets(n)))
