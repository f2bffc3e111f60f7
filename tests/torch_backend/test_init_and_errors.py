"""Registration, every init method (env://, tcp://, file://, torchrun), the allreduce policy
option, and bad input: each error names what was wrong and no rank hangs."""
import datetime
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.distributed as dist

from emulated_cluster import free_port  # a port no outgoing connection takes meanwhile
from launcher import init_method, run_ranks


def test_import_registers_once():
    import importlib
    import gossipcc
    importlib.reload(gossipcc)  # a second registration must not raise
    assert dist.Backend("gossipcc") == "gossipcc"


def allreduce_worker(rank, world_size, method):
    import gossipcc  # noqa: F401
    if method == "env":
        dist.init_process_group("gossipcc", rank=rank, world_size=world_size)
    elif method == "tcp":
        dist.init_process_group("gossipcc", init_method="tcp://127.0.0.1:" + os.environ["TEST_PORT"], rank=rank,
                                world_size=world_size)
    else:
        dist.init_process_group("gossipcc", init_method=init_method(), rank=rank, world_size=world_size)
    t = torch.full((10,), float(rank))
    dist.all_reduce(t)
    dist.destroy_process_group()
    return t[0].item()


@pytest.mark.parametrize("method", ["env", "tcp", "file"])
def test_init_methods(method):
    port = str(free_port())
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "TEST_PORT": port}
    assert run_ranks(allreduce_worker, 2, method, env=env) == [1.0, 1.0]


@pytest.mark.parametrize("launcher", ["gossipcc.torchrun", "torch.distributed.run"])
def test_torchrun(tmp_path, launcher):
    if launcher == "torch.distributed.run":
        # Plain torchrun where this torch's launcher can work at all (docs/pytorch.md).
        if int(torch.__version__.split(".")[0]) < 2 and sys.version_info >= (3, 11):
            pytest.skip("torch 1.13's launcher fails on Python >= 3.11 before starting a worker; "
                        "python -m gossipcc.torchrun fixes that")
        from gossipcc import _torch_patches
        if _torch_patches.torch_lacks_libuv():
            pytest.skip("this torch is built without libuv and its torchrun's static rendezvous asks "
                        "for libuv whatever USE_LIBUV says; python -m gossipcc.torchrun fixes that")
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import os, torch, torch.distributed as dist, gossipcc
        dist.init_process_group(backend="gossipcc")
        t = torch.ones(3) * (dist.get_rank() + 1)
        dist.all_reduce(t)
        assert dist.get_backend() == "gossipcc", dist.get_backend()
        # One write per line: the ranks share torchrun's stdout pipe (writes under PIPE_BUF
        # bytes are atomic; print() writes its pieces separately and they interleaved).
        os.write(1, f"rank {dist.get_rank()} of {dist.get_world_size()} sum {t.tolist()}\\n".encode())
        dist.destroy_process_group()
    """))
    # gossipcc.torchrun is torchrun with a fix for torch 1.13 on Python 3.11 (Debian bookworm).
    out = subprocess.run([sys.executable, "-m", launcher, "--nproc_per_node=2",
                          "--master_port", str(free_port()), str(script)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("sum [3.0, 3.0, 3.0]") == 2, out.stdout


def test_policy_strings():
    import gossipcc
    # Any case, normalised to lower case; keys too (PyTorch's long names included).
    assert gossipcc._C.parse_allreduce_policy("POWERSGD:Rank=2,START_powerSGD_ITER=10") == \
        gossipcc._C.parse_allreduce_policy("powersgd:rank=2,start_iter=10")
    assert gossipcc._C.parse_allreduce_policy(" Exact ") == "exact"
    with pytest.raises(gossipcc.InvalidArgumentError, match='unknown key "rnak"; valid keys: rank '):
        gossipcc._C.parse_allreduce_policy("PowerSGD:rnak=2")
    assert gossipcc._C.parse_allreduce_policy("exact") == "exact"
    assert gossipcc._C.parse_allreduce_policy(" powersgd ").startswith("powersgd:rank=1,start_iter=1000")
    assert gossipcc._C.parse_allreduce_policy("powersgd:rank=2,start_iter=10").startswith(
        "powersgd:rank=2,start_iter=10")
    with pytest.raises(gossipcc.InvalidArgumentError, match="rank"):  # lists the valid keys
        gossipcc._C.parse_allreduce_policy("powersgd:rnak=2")
    with pytest.raises(gossipcc.InvalidArgumentError, match="valid policies"):
        gossipcc._C.parse_allreduce_policy("fancy")
    with pytest.raises(gossipcc.InvalidArgumentError, match="exact.*takes no options"):
        gossipcc._C.parse_allreduce_policy("exact:rank=2")
    with pytest.raises(gossipcc.InvalidArgumentError):
        gossipcc.configure(allreduce="nope")


def bad_policy_worker(rank, world_size):
    import gossipcc  # noqa: F401
    try:
        dist.init_process_group("gossipcc", init_method=init_method(), rank=rank, world_size=world_size)
    except Exception as e:  # noqa: BLE001
        return str(e)
    return "initialised"


def test_invalid_policy_env_rejected_at_init():
    results = run_ranks(bad_policy_worker, 2, env={"GOSSIPCC_ALLREDUCE": "powersgd-ish"})
    for msg in results:
        assert "unknown policy \"powersgd-ish\"" in msg and "valid policies" in msg, msg


@pytest.mark.parametrize("name,value", [("GOSSIPCC_VERIFY_COLLECTIVES", "yes"),
                                        ("GOSSIPCC_P2P_CONNECTION_PER_DIRECTION", "2"),
                                        ("GOSSIPCC_P2P_SEGMENT_BYTES", "1k"),
                                        ("GOSSIPCC_HEARTBEAT_INTERVAL_MS", "1.5s"),
                                        ("GOSSIPCC_HEARTBEAT_INTERVAL_MS", "-"),
                                        ("GOSSIPCC_CUDA_DEVICE", "cuda:0"),
                                        ("GOSSIPCC_COLLECTIVE_LANES", "two")])
def test_invalid_option_env_rejected_at_init(name, value):
    results = run_ranks(bad_policy_worker, 2, env={name: value})
    for msg in results:
        assert name in msg and f"'{value}'" in msg, msg


def options_off_worker(rank, world_size):
    import gossipcc  # noqa: F401
    dist.init_process_group("gossipcc", init_method=init_method(), rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=20))
    t = torch.full((1000,), float(rank + 1))
    dist.all_reduce(t)
    assert t.eq(3.0).all()
    # Ranks disagree on the dtype (equal width: the same bytes move either way), above the
    # eager line: only the cross-rank check can tell, so this shows whether it ran.
    mixed = torch.ones(1 << 16, dtype=torch.int32 if rank == 0 else torch.float32)
    try:
        dist.all_reduce(mixed)
        checked = "unchecked"
    except RuntimeError as e:
        assert "ranks disagree on the dtype" in str(e), str(e)
        checked = "checked"
    peer = 1 - rank
    got = torch.empty(300000)
    reqs = [dist.isend(torch.full((300000,), float(rank)), dst=peer), dist.irecv(got, src=peer)]
    for r in reqs:
        r.wait()
    assert got.eq(float(peer)).all()
    dist.destroy_process_group()
    return checked


def mixed_connection_worker(rank, world_size):
    os.environ["GOSSIPCC_P2P_CONNECTION_PER_DIRECTION"] = str(rank)  # read at init: ranks disagree
    return bad_policy_worker(rank, world_size)


def test_connection_per_direction_variable_reaches_every_rank():
    # Proves the variable is applied: ranks that set it differently fail at init, both naming it.
    results = run_ranks(mixed_connection_worker, 2)
    for r, msg in enumerate(results):
        assert f"rank {r} of 2: GOSSIPCC_P2P_CONNECTION_PER_DIRECTION differs across ranks: rank 0: '0', " \
               "rank 1: '1'" in msg, msg


def mixed_lanes_worker(rank, world_size):
    os.environ["GOSSIPCC_COLLECTIVE_LANES"] = str(rank + 1)  # read at init: ranks disagree
    return bad_policy_worker(rank, world_size)


def test_collective_lanes_variable_reaches_every_rank():
    # The variable, not CommunicatorOptions::collective_lanes, is what the user set: named.
    results = run_ranks(mixed_lanes_worker, 2)
    for msg in results:
        assert "GOSSIPCC_COLLECTIVE_LANES differs across ranks: rank 0: '1', rank 1: '2'" in msg, msg
        assert "CommunicatorOptions" not in msg, msg
    for value in ("0", "99"):
        for msg in run_ranks(bad_policy_worker, 2, env={"GOSSIPCC_COLLECTIVE_LANES": value}):
            assert f"GOSSIPCC_COLLECTIVE_LANES='{value}': out of range: collective_lanes must be in [1, 8], " \
                   f"got {value}" in msg, msg


def test_cuda_device_variable_reaches_the_communicator():
    # Without a usable GPU (here, or in a build without CUDA) NCCL cannot be created at init:
    # every rank fails naming the device, which shows the variable was applied.
    import torch
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: NCCL init would succeed (covered by the CUDA tests)")
    for device in ("0", "5"):
        for msg in run_ranks(bad_policy_worker, 2, env={"GOSSIPCC_CUDA_DEVICE": device}):
            assert f"GOSSIPCC_CUDA_DEVICE='{device}': " in msg, msg
            assert f"no such CUDA device cuda:{device}: 0 visible" in msg or \
                f"cuda:{device} cannot be used: this gossipcc was built without CUDA" in msg, msg
    # A number that is no device: refused before anything connects.
    for msg in run_ranks(bad_policy_worker, 2, env={"GOSSIPCC_CUDA_DEVICE": "-2"}):
        assert "GOSSIPCC_CUDA_DEVICE='-2': out of range: cuda_device must be a CUDA device ordinal" in msg, msg


def test_checks_and_connection_per_direction_can_be_turned_off():
    env = {"GOSSIPCC_VERIFY_COLLECTIVES": "0", "GOSSIPCC_P2P_CONNECTION_PER_DIRECTION": "0"}
    assert run_ranks(options_off_worker, 2, env=env) == ["unchecked", "unchecked"]
    assert run_ranks(options_off_worker, 2) == ["checked", "checked"]


def packed_worker(rank, world_size):
    """The default group packs (GOSSIPCC_LOSSLESS_FLOAT32_ALLREDUCE=1 from the launcher), a
    second group does not: a ring-sized all-reduce must give both the same bits."""
    import gossipcc
    dist.init_process_group("gossipcc", init_method=init_method(), rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=20))
    del os.environ["GOSSIPCC_LOSSLESS_FLOAT32_ALLREDUCE"]
    plain = dist.new_group(backend="gossipcc")
    g = torch.Generator().manual_seed(rank)
    data = torch.randn(1 << 20, generator=g) * (torch.arange(1 << 20) % 3 != 0)  # a third zeros
    packed_result, plain_result = data.clone(), data.clone()
    dist.all_reduce(packed_result)
    dist.all_reduce(plain_result, group=plain)
    assert torch.equal(packed_result.view(torch.int32), plain_result.view(torch.int32))
    assert not torch.equal(packed_result, data)
    # The default group did pack (else the comparison compared the plain ring with itself):
    # 2 of its 3 chunks each way, in fewer bytes; the other group packed nothing.
    packed_traffic = gossipcc.get_backend_object().traffic()
    plain_traffic = gossipcc.get_backend_object(plain).traffic()
    raw = packed_traffic["packed_allreduce_raw_bytes"]
    assert abs(raw - 2 * 2 / 3 * data.numel() * 4) <= 16, packed_traffic
    assert 0 < packed_traffic["packed_allreduce_wire_bytes"] < 0.9 * raw, packed_traffic
    assert plain_traffic["packed_allreduce_raw_bytes"] == plain_traffic["packed_allreduce_wire_bytes"] == 0
    dist.destroy_process_group()
    return "same bits"


def packed_on_rank_0_worker(rank, world_size):
    import gossipcc  # noqa: F401
    if rank == 0:
        os.environ["GOSSIPCC_LOSSLESS_FLOAT32_ALLREDUCE"] = "1"
    try:
        dist.init_process_group("gossipcc", init_method=init_method(), rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=20))
    except Exception as e:  # noqa: BLE001
        return str(e)
    return "created"


def test_lossless_packing_keeps_the_bits_and_every_rank_must_agree():
    assert run_ranks(packed_worker, 3, env={"GOSSIPCC_LOSSLESS_FLOAT32_ALLREDUCE": "1"}) == ["same bits"] * 3
    for msg in run_ranks(packed_on_rank_0_worker, 2):
        assert "GOSSIPCC_LOSSLESS_FLOAT32_ALLREDUCE differs across ranks: rank 0: '1', rank 1: '0' (unset); " \
               "every rank must use the same value" in msg, msg
    for msg in run_ranks(bad_policy_worker, 2, env={"GOSSIPCC_LOSSLESS_FLOAT32_ALLREDUCE": "yes"}):
        assert "GOSSIPCC_LOSSLESS_FLOAT32_ALLREDUCE must be 0 or 1, got 'yes'" in msg, msg


def errors_worker(rank, world_size):
    import gossipcc  # noqa: F401
    dist.init_process_group("gossipcc", init_method=init_method(), rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=20))
    seen = {}

    def expect(name, fn, *fragments):
        try:
            fn()
        except Exception as e:  # noqa: BLE001
            msg = str(e)
            missing = [f for f in fragments if f not in msg]
            assert not missing, f"{name}: message lacks {missing}: {msg}"
            seen[name] = msg
            return
        raise AssertionError(f"{name}: no error raised")

    # Element counts differ across ranks: every rank gets a MismatchError naming them.
    expect("size mismatch", lambda: dist.all_reduce(torch.ones(5 + rank)), "5", "6")
    # dtypes differ across ranks.
    expect("dtype mismatch", lambda: dist.all_reduce(torch.ones(4, dtype=torch.float32 if rank else torch.float64)),
           "float32", "float64")
    # The group is still usable after a mismatch.
    t = torch.ones(3)
    dist.all_reduce(t)
    assert t.tolist() == [2.0, 2.0, 2.0]
    # Local argument errors are raised synchronously and name the operation.
    # (Collectives take non-contiguous tensors, point-to-point refuses them, as torch's Gloo backend.)
    expect("non-contiguous", lambda: dist.send(torch.ones(4, 4).t(), dst=(rank + 1) % world_size), "send",
           "not contiguous")
    expect("bitwise op on floats", lambda: dist.all_reduce(torch.ones(2), op=dist.ReduceOp.BAND),
           "reduce op band", "float32")
    expect("bad root", lambda: dist.broadcast(torch.ones(2), src=5), "5")
    expect("wrong allgather list", lambda: dist.all_gather([torch.ones(2)], torch.ones(2)), "world size")
    expect("wrong split sizes", lambda: dist.all_to_all_single(torch.empty(4), torch.ones(4), [1, 1], [3, 3]),
           "split sizes")
    # A receive whose sender sends a different size fails with both sizes named, no hang.
    if rank == 0:
        expect("p2p size", lambda: dist.recv(torch.empty(3), src=1, tag=4), "expected 3", "sent 4")
    else:
        dist.send(torch.ones(4), dst=0, tag=4)
    # Receive from any source: the sender's rank is reported.
    if rank == 0:
        got = torch.empty(2)
        assert dist.recv(got, tag=6) == 1 and got.tolist() == [7.0, 7.0]
    else:
        dist.send(torch.full((2,), 7.0), dst=0, tag=6)
    dist.barrier()
    dist.destroy_process_group()
    return sorted(seen)


def test_bad_input_errors_are_clear():
    results = run_ranks(errors_worker, 2)
    assert len(results[0]) == 8 and len(results[1]) == 7, results


def timeout_worker(rank, world_size):
    import gossipcc  # noqa: F401
    import time
    dist.init_process_group("gossipcc", init_method=init_method(), rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=3))
    if rank == 1:
        time.sleep(6)  # never joins the all-reduce in time
        return "slept"
    start = time.time()
    try:
        dist.all_reduce(torch.ones(4))
    except Exception as e:  # noqa: BLE001
        return f"{time.time() - start:.1f}s: {e}"
    return "no error"


def test_collective_times_out_with_clear_error():
    results = run_ranks(timeout_worker, 2)
    assert "timed out" in results[0].lower() or "timeout" in results[0].lower(), results[0]
    assert float(results[0].split("s:")[0]) < 10, results[0]
    # The peer check ran: rank 1 is alive (asleep), so it says the peers are alive.
    assert "peer check on rank 0" in results[0] and "heartbeat is advancing" in results[0], results[0]


def test_heartbeat_interval_from_environment():
    # Negative: no heartbeat, so a timeout is reported without the peer check.
    results = run_ranks(timeout_worker, 2, env={"GOSSIPCC_HEARTBEAT_INTERVAL_MS": "-1"})
    assert "timed out" in results[0].lower() or "timeout" in results[0].lower(), results[0]
    assert "peer check" not in results[0], results[0]
    # A set interval: the check waits 3 of them (3 x 700 ms) on top of the 3 s timeout.
    results = run_ranks(timeout_worker, 2, env={"GOSSIPCC_HEARTBEAT_INTERVAL_MS": "700"})
    assert "peer check" in results[0], results[0]
    assert 5.0 <= float(results[0].split("s:")[0]) < 10, results[0]


# With order_nested_collectives on (gossipcc/ddp.py sets it for PyTorch's PowerSGD hooks), a
# collective first waits for the completion callbacks of earlier collectives. Its deadline is
# still the group's timeout from the c10d call, whatever it waits for: the ordering wait, or,
# once that took part of the timeout, its own signature check and data (the communicator counts
# from the call: CallOptions::issued). Rank 0's earlier all-reduce has a future callback that
# sleeps; rank 1 never issues the later all-reduce, and stays up (a store key, not a sleep)
# until rank 0 has failed. The peer check every 100 ms adds 0.3-0.4 s to a failure on the wire.
ORDERING_TIMEOUT_S = 3.0


def ordering_deadline_worker(rank, world_size, callback_s, peer_joins=False):
    import time
    import gossipcc
    dist.init_process_group("gossipcc", init_method=init_method(), rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=ORDERING_TIMEOUT_S))
    sync = dist.FileStore(os.environ["GOSSIPCC_TEST_INIT_FILE"] + ".sync", world_size)
    if rank == 1:
        # Only once rank 0 has attached its callback: were `earlier` complete before, `then`
        # would run the callback at once on rank 0's main thread, not on the group's executor.
        sync.wait(["attached"], datetime.timedelta(seconds=60))
    earlier = dist.all_reduce(torch.ones(4), async_op=True)
    if rank == 1:
        earlier.wait()
        # With peer_joins, rank 1 issues the later all-reduce (of 10s) as well; else never.
        later = dist.all_reduce(torch.full((4,), 10.0), async_op=True) if peer_joins else None
        sync.wait(["failed"], datetime.timedelta(seconds=60))
        if later is not None:
            try:
                later.wait()
            except Exception:  # noqa: BLE001 - rank 0 never sends its signature: a timeout
                pass
        return "stayed"
    # Not waited for: its completion (and so the callback) runs on the group's executor.
    earlier.get_future().then(lambda fut: time.sleep(callback_s))
    sync.set("attached", "1")
    backend = gossipcc.get_backend_object(dist.group.WORLD)
    backend.order_nested_collectives = True
    start = time.monotonic()
    try:
        dist.all_reduce(torch.ones(4))
        outcome = "no error"
    except Exception as e:  # noqa: BLE001 - the message is checked
        outcome = f"{type(e).__name__}: {e}"
    took = time.monotonic() - start
    after = None
    if peer_joins:
        # This rank's next collective (no ordering wait: the callback still sleeps). Had the
        # timed-out one been skipped here, it would pair with rank 1's later all-reduce and
        # return 1 + 10; it must fail instead (the timeout left the communicator unusable).
        backend.order_nested_collectives = False
        nxt = torch.ones(4)
        try:
            dist.all_reduce(nxt)
            after = f"no error: {nxt.tolist()}"
        except Exception as e:  # noqa: BLE001 - the message is checked
            after = f"{type(e).__name__}: {e}"
    sync.set("failed", "1")
    return (took, outcome, after) if peer_joins else (took, outcome)


def _check_within_one_timeout(case, took, outcome):
    timeout = ORDERING_TIMEOUT_S
    assert "no error" != outcome, f"{case}: the all-reduce without rank 1 succeeded"
    assert took >= 0.9 * timeout, f"{case}: failed {took:.2f} s after the call, before the timeout ({timeout} s)"
    # About one timeout (the old bound was the ordering wait plus a whole timeout): 1.6x.
    assert took < 1.6 * timeout, (f"{case}: failed {took:.2f} s after the call, over 1.6x the {timeout} s timeout: "
                                  f"{outcome}")


def test_ordering_wait_past_the_timeout_fails_within_it():
    # The callback outlasts the timeout: the ordering wait itself times out. Rank 1 issues the
    # same all-reduce: rank 0's must still reach its communicator, which fails it at once and
    # is then unusable, so rank 0's next all-reduce fails rather than pairs with rank 1's.
    results = run_ranks(ordering_deadline_worker, 2, 2 * ORDERING_TIMEOUT_S, True,
                        env={"GOSSIPCC_HEARTBEAT_INTERVAL_MS": "100"})
    took, outcome, after = results[0]
    assert "completion callbacks of earlier collectives" in outcome, outcome
    assert "timeout" in outcome.lower(), outcome
    _check_within_one_timeout("callback past the timeout", took, outcome)
    assert not after.startswith("no error"), (
        f"callback past the timeout: the next all-reduce on rank 0 succeeded ({after}): the timed-out one was "
        f"skipped on rank 0 only, so the next paired with rank 1's copy of it")
    assert "earlier failure" in after, f"callback past the timeout: the next all-reduce on rank 0: {after}"
    print(f"\ncallback past the timeout: failed {took:.2f} s after the call (timeout {ORDERING_TIMEOUT_S} s): {outcome}"
          f"\nthe next all-reduce: {after}")


def test_ordering_wait_then_missing_peer_fails_within_one_timeout_of_the_call():
    # The callback takes 0.8 of the timeout; the collective then waits for rank 1's signature,
    # which never comes, and must fail at the call's deadline: about 3 s after the call, where
    # it used to take the ordering wait plus a whole timeout (about 5.8 s).
    results = run_ranks(ordering_deadline_worker, 2, 0.8 * ORDERING_TIMEOUT_S,
                        env={"GOSSIPCC_HEARTBEAT_INTERVAL_MS": "100"})
    took, outcome = results[0]
    assert "timed out" in outcome.lower(), outcome
    assert "exchanging signatures" in outcome and "no header from rank 1" in outcome, outcome
    _check_within_one_timeout("ordering wait, then a missing peer", took, outcome)
    print(f"\nordering wait, then a missing peer: failed {took:.2f} s after the call (timeout {ORDERING_TIMEOUT_S} s): "
          f"{outcome}")


def settings_worker(rank, world_size, env_by_rank, configure_by_rank=None):
    """init_process_group with this rank's variables (and gossipcc.configure), then a DDP step:
    the error's text, or "trained"."""
    os.environ.update(env_by_rank[rank])
    import gossipcc
    if configure_by_rank and configure_by_rank[rank] is not None:
        gossipcc.configure(allreduce=configure_by_rank[rank])
    try:
        dist.init_process_group("gossipcc", init_method=init_method(), rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=30))
    except Exception as e:  # noqa: BLE001
        return "init: " + str(e)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
    try:
        model(torch.ones(2, 4)).sum().backward()
    except Exception as e:  # noqa: BLE001
        return "step: " + str(e)
    finally:
        dist.destroy_process_group()
    return "trained"


def test_policy_that_differs_fails_init_on_every_rank_naming_it():
    results = run_ranks(settings_worker, 2, [{}, {"GOSSIPCC_ALLREDUCE": "PowerSGD:rank=2"}])
    for r, msg in enumerate(results):
        assert msg.startswith("init: ") and f"rank {r} of 2: GOSSIPCC_ALLREDUCE differs across ranks: " \
            "rank 0: 'exact' (unset), rank 1: 'powersgd:rank=2'; every rank must use the same value" in msg, msg
    # Set in different places: each rank's says where.
    results = run_ranks(settings_worker, 2, [{"GOSSIPCC_ALLREDUCE": "exact"}, {}], [None, "powersgd:rank=2"])
    for msg in results:
        assert "GOSSIPCC_ALLREDUCE / gossipcc.configure(allreduce=...) differs across ranks: rank 0: 'exact' " \
               "(GOSSIPCC_ALLREDUCE), rank 1: 'powersgd:rank=2' (gossipcc.configure(allreduce=...))" in msg, msg
    # The same policy spelt differently is the same policy.
    same = [{"GOSSIPCC_ALLREDUCE": "powersgd:rank=1,start_iter=1000"}, {"GOSSIPCC_ALLREDUCE": "POWERSGD"}]
    assert run_ranks(settings_worker, 2, same) == ["trained", "trained"]


def test_verify_collectives_must_agree():
    # Off on one rank only, that rank skips the signature exchange its peer waits for.
    results = run_ranks(settings_worker, 2, [{"GOSSIPCC_VERIFY_COLLECTIVES": "0"}, {}])
    for msg in results:
        assert "GOSSIPCC_VERIFY_COLLECTIVES differs across ranks: rank 0: '0', rank 1: '1' (unset)" in msg, msg


def test_invalid_setting_on_one_rank_fails_every_rank_at_once():
    # Rank 0 learns it from rank 1's record in the store, naming the variable (it used to wait
    # out the timeout and report that rank 1 never arrived).
    results = run_ranks(settings_worker, 2, [{}, {"GOSSIPCC_COLLECTIVE_LANES": "99"}])
    assert "GOSSIPCC_COLLECTIVE_LANES='99': out of range" in results[1], results[1]
    assert "rank 0 of 2: the settings of another rank are invalid, so this group cannot be created: rank 1: " \
           "GOSSIPCC_COLLECTIVE_LANES='99': out of range: collective_lanes must be in [1, 8], got 99" in results[0], \
        results[0]


def configure_after_init_worker(rank, world_size):
    import gossipcc
    dist.init_process_group("gossipcc", init_method=init_method(), rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=30))
    try:
        gossipcc.configure(allreduce="powersgd:rank=2")
        raised = "no error"
    except RuntimeError as e:
        raised = str(e)
    assert gossipcc.allreduce_policy() == "exact"  # the refused call changed nothing
    # Meant for groups created afterwards: said so, and only those get it.
    gossipcc.configure(allreduce="powersgd:rank=2", new_groups_only=True)
    group = dist.new_group(backend="gossipcc")
    policies = (gossipcc.get_backend_object().allreduce_policy, gossipcc.get_backend_object(group).allreduce_policy)
    gossipcc.configure(allreduce=None, new_groups_only=True)
    dist.destroy_process_group()
    gossipcc.configure(allreduce=None)  # no group left: allowed
    return raised, policies


def test_configure_after_init_raises():
    for raised, (default_policy, new_policy) in run_ranks(configure_after_init_worker, 2):
        assert "gossipcc.configure(allreduce='powersgd:rank=2') after init_process_group" in raised, raised
        assert "keeps the policy it was created with ('exact')" in raised and "new_groups_only=True" in raised, raised
        assert default_policy == "exact" and new_policy.startswith("powersgd:rank=2,"), (default_policy, new_policy)
