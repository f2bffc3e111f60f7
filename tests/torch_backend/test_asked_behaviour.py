"""What the user asked for is done, or refused or reported: the allreduce policy on a DDP model
whose backend lookup fails or whose group is not gossipcc, monitored_barrier's wait_all_ranks
and timeout (side by side with gloo's), per-call timeouts of the options structs, and a list of
several interfaces in GOSSIPCC_SOCKET_IFNAME / GLOO_SOCKET_IFNAME."""
import datetime
import time
import warnings

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from launcher import init_method, run_ranks


def policy_on_gloo_group_worker(rank, world_size):
    import gossipcc  # noqa: F401  (patches DDP)
    dist.init_process_group("gloo", init_method=init_method(), rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=30))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        DDP(torch.nn.Linear(4, 4))
        DDP(torch.nn.Linear(4, 4))  # once per process
    dist.destroy_process_group()
    return [str(w.message) for w in caught if "allreduce policy" in str(w.message)]


def test_powersgd_policy_with_ddp_on_a_gloo_group_warns_once():
    for messages in run_ranks(policy_on_gloo_group_worker, 2, env={"GOSSIPCC_ALLREDUCE": "powersgd:rank=1"}):
        assert len(messages) == 1, messages
        assert "'powersgd:rank=1," in messages[0] and "(from GOSSIPCC_ALLREDUCE)" in messages[0], messages
        assert "uses the 'gloo' backend" in messages[0], messages
    # With no policy asked for there is nothing to say.
    assert run_ranks(policy_on_gloo_group_worker, 2, env={"GOSSIPCC_ALLREDUCE": "exact"}) == [[], []]


def failed_lookup_worker(rank, world_size):
    import gossipcc
    dist.init_process_group("gossipcc", init_method=init_method(), rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=30))

    def broken_lookup(group=None):
        raise RuntimeError("no backend for this device")

    # The policy's lookup (gossipcc/ddp.py) goes through gossipcc.backend.
    real = gossipcc.backend.get_backend_object
    gossipcc.backend.get_backend_object = broken_lookup
    try:
        DDP(torch.nn.Linear(4, 4))
        outcome = "built"
    except RuntimeError as e:
        outcome = str(e)
    finally:
        gossipcc.backend.get_backend_object = real
    dist.destroy_process_group()
    return outcome


def test_failed_backend_lookup_under_powersgd_policy_is_an_error():
    for msg in run_ranks(failed_lookup_worker, 2, env={"GOSSIPCC_ALLREDUCE": "powersgd:rank=1"}):
        assert "allreduce policy 'powersgd:rank=1," in msg and "(from GOSSIPCC_ALLREDUCE)" in msg, msg
        assert "no backend for this device" in msg, msg
    # Under "exact" the lookup does not matter.
    assert run_ranks(failed_lookup_worker, 2, env={"GOSSIPCC_ALLREDUCE": "exact"}) == ["built"] * 2


def interface_list_worker(rank, world_size):
    import gossipcc  # noqa: F401
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist.init_process_group("gossipcc", init_method=init_method(), rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=30))
        dist.new_group(backend="gossipcc")  # a second group: the warning is once per process
        t = torch.ones(3)
        dist.all_reduce(t)  # the group works over the first interface
    dist.destroy_process_group()
    return t.tolist(), [str(w.message) for w in caught if "interfaces" in str(w.message)]


@pytest.mark.parametrize("variable", ["GOSSIPCC_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"])
def test_interface_list_warns_naming_the_interfaces_not_used(variable):
    for total, messages in run_ranks(interface_list_worker, 2, env={variable: "lo,lo"}):
        assert total == [2.0] * 3
        assert len(messages) == 1, messages
        assert f"{variable}='lo,lo' names 2 interfaces" in messages[0], messages
        assert "listens on the first only ('lo') and does not use 'lo'" in messages[0], messages
    for _, messages in run_ranks(interface_list_worker, 2, env={variable: "lo"}):
        assert messages == []


MONITORED_TIMEOUT = datetime.timedelta(seconds=2)


def monitored_barrier_worker(rank, world_size, backend, absent, wait_all_ranks):
    import gossipcc  # noqa: F401
    # The arrived ranks' wait for rank 0's release is bounded by the group's timeout.
    dist.init_process_group(backend, init_method=init_method(), rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=6))
    # torch's dist.monitored_barrier() accepts the gloo backend only; the process group's own
    # method is the same call on either backend.
    pg = dist.distributed_c10d._get_default_group()
    pg.monitored_barrier(MONITORED_TIMEOUT, wait_all_ranks)  # every rank: passes
    outcome = "passed"
    if rank in absent:
        time.sleep(2 * MONITORED_TIMEOUT.total_seconds())  # not at the barrier (gone afterwards is as good)
        outcome = "absent"
    else:
        try:
            pg.monitored_barrier(MONITORED_TIMEOUT, wait_all_ranks)
        except RuntimeError as e:
            outcome = str(e)
    return outcome


@pytest.mark.parametrize("wait_all_ranks", [True, False])
def test_monitored_barrier_names_the_missing_ranks_as_gloo_does(wait_all_ranks):
    expected = ("[Rank 0]: Ranks 1, 3 failed to pass monitoredBarrier in 2000 ms" if wait_all_ranks
                else "[Rank 0]: Rank 1 failed to pass monitoredBarrier in 2000 ms")
    for backend in ("gloo", "gossipcc"):
        outcomes = run_ranks(monitored_barrier_worker, 4, backend, (1, 3), wait_all_ranks, timeout=90)
        assert expected in outcomes[0], (backend, outcomes[0])
        assert outcomes[1] == outcomes[3] == "absent"
        # Rank 2 arrived: rank 0 never releases it, and it says so.
        assert "Rank 2 successfully reached monitoredBarrier" in outcomes[2], (backend, outcomes[2])


def per_call_timeout_worker(rank, world_size):
    import gossipcc  # noqa: F401
    dist.init_process_group("gossipcc", init_method=init_method(), rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=30))
    pg = dist.distributed_c10d._get_default_group()
    t = torch.ones(3)
    same = dist.AllreduceOptions()
    same.timeout = datetime.timedelta(seconds=30)  # the group's: accepted
    pg.allreduce([t], same).wait()
    outcomes = [t.tolist()]
    for make, call in ((dist.AllreduceOptions, lambda o: pg.allreduce([t], o)),
                       (dist.BroadcastOptions, lambda o: pg.broadcast([t], o)),
                       (dist.BarrierOptions, lambda o: pg.barrier(o))):
        opts = make()
        opts.timeout = datetime.timedelta(seconds=1)
        try:
            call(opts).wait()
            outcomes.append("ran")
        except ValueError as e:
            outcomes.append(str(e))
    # work.wait(timeout) gives up waiting at its timeout; the receive itself keeps going.
    buf = torch.zeros(2)
    if rank == 0:
        work = dist.irecv(buf, src=1, tag=5)
        try:
            work.wait(datetime.timedelta(seconds=1))
            outcomes.append("received")
        except RuntimeError as e:
            outcomes.append(str(e))
        dist.barrier()
        work.wait()
    else:
        dist.barrier()  # sent only after rank 0's timed wait gave up
        dist.send(torch.ones(2), dst=0, tag=5)
        outcomes.append("sent")
    outcomes.append(buf.tolist())
    dist.barrier()
    dist.destroy_process_group()
    return outcomes


def test_per_call_timeout_other_than_the_groups_is_refused_naming_it():
    for rank, outcomes in enumerate(run_ranks(per_call_timeout_worker, 2)):
        assert outcomes[0] == [2.0] * 3
        for op, options, msg in zip(("allreduce", "broadcast", "barrier"),
                                    ("AllreduceOptions", "BroadcastOptions", "BarrierOptions"), outcomes[1:4]):
            assert f"gossipcc {op} on rank {rank}: {options}.timeout = 1000 ms" in msg, msg
            assert "the process group's timeout (30000 ms" in msg, msg
        if rank == 0:
            assert "wait timed out after 1000 ms" in outcomes[4], outcomes[4]
            assert outcomes[5] == [1.0, 1.0]
        else:
            assert outcomes[4:] == ["sent", [0.0, 0.0]]
