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

    real = gossipcc.get_backend_object
    gossipcc.get_backend_object = broken_lookup
    try:
        DDP(torch.nn.Linear(4, 4))
        outcome = "built"
    except RuntimeError as e:
        outcome = str(e)
    finally:
        gossipcc.get_backend_object = real
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
