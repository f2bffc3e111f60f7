"""Bad input through torch.distributed with backend="gossipcc", beyond test_init_and_errors.py:
mixed devices, invalid peers, NaN/Inf, several threads, the backend object after
destroy_process_group and after shutdown. Each case asserts the error (or the documented
behaviour) and that a valid collective succeeds afterwards."""
import datetime
import math
import threading

import torch
import torch.distributed as dist

from launcher import init_method, run_ranks


def expect_error(name, fn, *fragments):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the error under test
        msg = str(e)
        missing = [f for f in fragments if f not in msg]
        assert not missing, f"{name}: message lacks {missing}: {msg}"
        return msg
    raise AssertionError(f"{name}: no error raised")


def still_works(world_size):
    t = torch.ones(3)
    dist.all_reduce(t)
    assert t.tolist() == [float(world_size)] * 3


def bad_input_worker(rank, world_size):
    import gossipcc
    dist.init_process_group("gossipcc", init_method=init_method(), rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=20))
    seen = []
    # Mixed devices: an output on another device than the input.
    seen.append(expect_error("mixed devices",
                             lambda: dist.all_gather([torch.empty(2, device="meta") for _ in range(world_size)],
                                                     torch.ones(2)),
                             "allgather", "meta", "cpu"))
    still_works(world_size)
    # Invalid peer ranks for point-to-point.
    seen.append(expect_error("send to rank 7", lambda: dist.send(torch.ones(2), dst=7), "7", "out of range"))
    seen.append(expect_error("recv from rank -3", lambda: dist.recv(torch.ones(2), src=-3), "-3"))
    still_works(world_size)
    # NaN/Inf: documented IEEE behaviour, the same on every rank; min/max propagate NaN.
    t = torch.tensor([math.nan if rank == 1 else 1.0, math.inf if rank == 0 else -math.inf, 2.0])
    s, mx = t.clone(), t.clone()
    dist.all_reduce(s)
    dist.all_reduce(mx, op=dist.ReduceOp.MAX)
    assert math.isnan(s[0]) and math.isnan(s[1]) and s[2] == 2.0 * world_size, s
    assert math.isnan(mx[0]) and mx[1] == math.inf, mx
    still_works(world_size)
    # Several Python threads, each exchanging with its own tag: data intact.
    peer = 1 - rank
    errors = []

    def exchange(tag):
        try:
            for i in range(10):
                out = torch.full((50,), float(rank * 1000 + tag * 100 + i))
                got = torch.empty(50)
                reqs = [dist.isend(out, peer, tag=tag), dist.irecv(got, peer, tag=tag)]
                for r in reqs:
                    r.wait()
                assert got[0].item() == peer * 1000 + tag * 100 + i, (tag, i, got[0].item())
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    threads = [threading.Thread(target=exchange, args=(tag,)) for tag in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    still_works(world_size)
    # destroy_process_group shuts the backend down even where something still holds it (DDP
    # does): every later call fails with a clear error, no hang or crash; shutdown is idempotent.
    backend = gossipcc.get_backend_object()
    dist.barrier()
    dist.destroy_process_group()
    seen.append(expect_error("after destroy_process_group", lambda: backend.allreduce([torch.ones(2)]).wait(),
                             "shut down"))
    backend.shutdown()
    seen.append(expect_error("after shutdown", lambda: backend.allreduce([torch.ones(2)]).wait(), "shut down"))
    return len(seen)


def test_bad_input_cases():
    assert run_ranks(bad_input_worker, 2) == [5, 5]


def ring_disagreement_worker(rank, world_size):
    # All-reduces above 512 KiB run gossipcc's ring, which sends its first segments to a
    # neighbour whose signature matches before the whole check is in (docs/comm.md, "The
    # ring"). On 3 ranks with rank 2 odd, ranks 0 and 1 agree and speculate; every rank must
    # still raise, leave its tensor alone, and run the next ring all-reduce correctly.
    import gossipcc  # noqa: F401
    dist.init_process_group("gossipcc", init_method=init_method(), rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=20))
    n = (512 << 10) // 4 + 5  # float32 elements: just past the direct line
    odd = world_size - 1
    t = torch.ones(n + 1 if rank == odd else n)
    msg = expect_error("ring count", lambda: dist.all_reduce(t), "ranks disagree on the element count",
                       f"rank {odd}: {n + 1}", "rank 0: " + str(n), "no buffer was modified")
    assert t.eq(1.0).all(), "a rank's tensor was modified by a failed all-reduce"
    mixed = torch.ones(n, dtype=torch.int32 if rank == odd else torch.float32)
    expect_error("ring dtype", lambda: dist.all_reduce(mixed), "ranks disagree on the dtype", f"rank {odd}: int32")
    assert mixed.eq(1).all()
    good = torch.full((n,), float(rank + 1))
    dist.all_reduce(good)
    assert good.eq(world_size * (world_size + 1) / 2).all()
    dist.destroy_process_group()
    return msg.split(":")[0]


def test_ring_disagreements_fail_every_rank_and_leave_tensors_alone():
    results = run_ranks(ring_disagreement_worker, 3)
    assert all(r.startswith("allreduce #") for r in results), results
