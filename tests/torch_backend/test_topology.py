"""GOSSIPCC_TOPOLOGY on emulated hosts with several ranks each (tools/emulated_cluster.py: a
network namespace per host, ranks launched with torchrun's variables): the backend learns which
ranks share a host from the hosts themselves, runs large all-reduces in two levels under
`hierarchical` and `auto`, and DDP's gradients equal a locally computed average. Needs root
(network namespaces); skips saying why otherwise."""
import json
import os
import sys
import tempfile

import pytest

import emulated_cluster as ec

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "topology_worker.py")


def run(hosts, ranks_per_host, topology, local=False):
    """Runs the worker on hosts x ranks_per_host emulated hosts (local: as processes on this
    host's loopback, all on one host); returns (cluster, records by rank)."""
    if not local:
        try:
            ec.check_namespaces_allowed()
        except ec.NamespacesUnavailable as e:
            pytest.skip(f"no network namespaces here: {e}")
    out = tempfile.mkdtemp(prefix="gossipcc-topology-")
    make = ec.LocalCluster if local else ec.EmulatedCluster
    kwargs = {} if local else {"network": "none"}
    with make(hosts=hosts, ranks_per_host=ranks_per_host, **kwargs) as cluster:
        logs = [open(os.path.join(out, f"log{r}"), "w+") for r in range(cluster.n)]
        try:
            env = {} if topology is None else {"GOSSIPCC_TOPOLOGY": topology}
            cluster.run([[sys.executable, WORKER, out]] * cluster.n, env=env,
                        timeout=300, stdout=logs, stderr=logs)
        except ec.ClusterError as e:
            text = ""
            for r, f in enumerate(logs):
                f.seek(0)
                text += f"--- rank {r}:\n{f.read()[-3000:]}\n"
            raise AssertionError(f"{e}\n{text}")
        finally:
            for f in logs:
                f.close()
        records = {}
        for r in range(cluster.n):
            with open(os.path.join(out, f"rank{r}.json")) as f:
                records[r] = json.load(f)
        return cluster, records


@pytest.mark.parametrize("hosts,ranks_per_host,topology,hierarchical", [
    (2, 2, "hierarchical", True),
    (3, 2, None, True),  # unset: auto, the default
    (2, 1, "auto", False),
    (2, 2, "flat", False),
])
def test_hosts_learned_and_allreduce_exact(hosts, ranks_per_host, topology, hierarchical):
    cluster, records = run(hosts, ranks_per_host, topology)
    want_hosts = [cluster.ranks_of(h) for h in range(hosts)]
    for r, rec in records.items():
        print(f"rank {r}: {rec['topology']['description']}, hierarchical={rec['topology']['hierarchical']}, "
              f"mismatches {rec['mismatches']}, DDP gradient max difference {rec['ddp_max_grad_diff']:.2e}")
        assert rec["topology"]["hosts"] == want_hosts, rec
        assert rec["topology"]["hierarchical"] == hierarchical, rec
        assert rec["mismatches"] == {"sum": 0, "max": 0, "min": 0}, rec
        assert rec["ddp_max_grad_diff"] < 1e-5, rec
        assert rec["warnings"] == [], rec


def test_local_world_size_that_disagrees_with_the_hosts_found_warns():
    """torchrun's variables say 2 hosts of 2 ranks, but every rank runs on this host's loopback:
    the backend groups by the hosts it finds (one host of 4 ranks), and says so."""
    cluster, records = run(2, 2, "auto", local=True)
    for r, rec in records.items():
        assert rec["topology"]["hosts"] == [[0, 1, 2, 3]], rec
        assert rec["topology"]["hierarchical"], rec
        assert rec["mismatches"] == {"sum": 0, "max": 0, "min": 0}, rec
        assert len(rec["warnings"]) == 1 and f"LOCAL_WORLD_SIZE=2 but rank {r} found 4 rank(s)" in rec["warnings"][0], rec
