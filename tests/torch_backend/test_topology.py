"""GOSSIPCC_TOPOLOGY on emulated hosts with several ranks each (tools/emulated_cluster.py: a
network namespace per host, ranks launched with torchrun's variables): the backend learns which
ranks share a host from the hosts themselves, runs large all-reduces in two levels under
`hierarchical` and `auto` (the default), DDP's gradients equal a locally computed average, and
push-sum rounds run over the hosts (exact means inside each) where the topology is two-level,
equal to push-sum computed here from its definition, and so do D-PSGD rounds, synchronous
bilateral exchanges (round-robin matching over the hosts), PowerSGD (against
PowerSGD over one rank per host fed the host means) and the quantized all-reduce
(quantized only across hosts: the bits of the quantized all-reduce over the host sums). Needs root (network namespaces); skips
saying why otherwise."""
import json
import os
import sys
import tempfile

import pytest
import torch

import emulated_cluster as ec
import quantized_reference as quantized
from topology_worker import PUSH_SUM_ROUNDS, QUANTIZED_COUNT, push_sum_input, value

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
    # Push-sum: over the hosts (each host's value the mean of its ranks) where the topology is
    # two-level, over the ranks where it is flat; computed here from the definition.
    nodes = want_hosts if hierarchical else [[r] for r in range(cluster.n)]
    want_x, want_w = push_sum_reference([torch.stack([push_sum_input(r) for r in ranks]).double().mean(0)
                                         for ranks in nodes], PUSH_SUM_ROUNDS)
    want_sym = symmetric_reference([torch.stack([push_sum_input(r) for r in ranks]).double().mean(0)
                                    for ranks in nodes], PUSH_SUM_ROUNDS)
    want_bil = bilateral_reference([torch.stack([push_sum_input(r) for r in ranks]).double().mean(0)
                                    for ranks in nodes], PUSH_SUM_ROUNDS)
    # The quantized all-reduce over the same nodes, each node's input its ranks' sum (integers:
    # exact in float32 in any order).
    want_q = quantized.reference([sum(value(r, QUANTIZED_COUNT) for r in ranks) for ranks in nodes], 8, 256, False)
    for r, rec in records.items():
        print(f"rank {r}: {rec['topology']['description']}, hierarchical={rec['topology']['hierarchical']}, "
              f"mismatches {rec['mismatches']}, DDP gradient max difference {rec['ddp_max_grad_diff']:.2e}")
        assert rec["topology"]["hosts"] == want_hosts, rec
        assert rec["topology"]["hierarchical"] == hierarchical, rec
        assert rec["mismatches"] == {"sum": 0, "max": 0, "min": 0}, rec
        assert rec["ddp_max_grad_diff"] < 1e-5, rec
        assert rec["warnings"] == [], rec
        node = next(i for i, ranks in enumerate(nodes) if r in ranks)
        got = torch.tensor(rec["push_sum"]["x"], dtype=torch.float64)
        assert abs(rec["push_sum"]["w"] - want_w[node]) < 1e-12, (r, rec["push_sum"]["w"], want_w[node])
        assert torch.allclose(got, want_x[node], atol=1e-5), (r, float((got - want_x[node]).abs().max()))
        got_sym = torch.tensor(rec["symmetric"], dtype=torch.float64)
        assert torch.allclose(got_sym, want_sym[node], atol=1e-5), (r, float((got_sym - want_sym[node]).abs().max()))
        got_bil = torch.tensor(rec["bilateral"], dtype=torch.float64)
        assert torch.allclose(got_bil, want_bil[node], atol=1e-5), (r, float((got_bil - want_bil[node]).abs().max()))
        for call, (got_p, want_p) in enumerate(zip(rec["powersgd"], records[0]["powersgd_reference"])):
            got_p, want_p = torch.tensor(got_p), torch.tensor(want_p)
            assert torch.allclose(got_p, want_p, rtol=1e-5, atol=1e-5), (r, call, float((got_p - want_p).abs().max()))
            assert got_p.tolist() == records[0]["powersgd"][call], (r, call, "differs from rank 0's bits")
        got_q = torch.tensor(rec["quantized"], dtype=torch.float32)
        assert torch.equal(got_q, want_q), (r, int((got_q != want_q).sum()))


def push_sum_reference(x, rounds):
    """Push-sum from step 0 on the one-peer exponential graph over len(x) nodes: node j keeps
    1 / (|out| + 1) of (x_j, w_j) and sends as much to each out-peer."""
    import gossipcc  # the graph's out-peers, as the collectives use them
    n = len(x)
    w = [1.0] * n
    for step in range(rounds):
        nx, nw = [torch.zeros_like(x[0]) for _ in range(n)], [0.0] * n
        for j in range(n):
            out = gossipcc._C.peer_graph_out_peers("exponential", n, j, step) if n > 1 else []
            share = 1.0 / (len(out) + 1)
            for t in list(out) + [j]:
                nx[t] += share * x[j]
                nw[t] += share * w[j]
        x, w = nx, nw
    return x, w


def bilateral_reference(x, rounds):
    """The synchronous bilateral exchange from step 0 on the round-robin ("circle") matching over
    len(x) nodes: with m = n rounded up to even, at step k node m - 1 meets k mod (m - 1) and the
    others pair as (k + d, k - d) mod (m - 1); a node paired with the virtual node m - 1 (n odd)
    idles; partners average."""
    n = len(x)
    m = n + n % 2
    for step in range(rounds):
        k = step % (m - 1) if m > 1 else 0
        partner = [m - 1 if j == k else k if j == m - 1 else (2 * k - j) % (m - 1) for j in range(n)] if m > 1 else [-1]
        x = [(x[j] + x[partner[j]]) / 2 if 0 <= partner[j] < n else x[j] for j in range(n)]
    return x


def symmetric_reference(x, rounds):
    """D-PSGD from step 0 on the ring over len(x) nodes: Metropolis-Hastings weights
    1 / (1 + max(d_i, d_j)) to each neighbour j, the rest kept."""
    import gossipcc
    n = len(x)
    for step in range(rounds):
        peers = [list(gossipcc._C.peer_graph_out_peers("ring", n, j, step)) if n > 1 else [] for j in range(n)]
        nx = [v.clone() for v in x]
        for j in range(n):
            for t in peers[j]:
                nx[j] += (x[t] - x[j]) / (1 + max(len(peers[j]), len(peers[t])))
        x = nx
    return x


def test_local_world_size_that_disagrees_with_the_hosts_found_warns():
    """torchrun's variables say 2 hosts of 2 ranks, but every rank runs on this host's loopback:
    the backend groups by the hosts it finds (one host of 4 ranks), and says so."""
    cluster, records = run(2, 2, "auto", local=True)
    for r, rec in records.items():
        assert rec["topology"]["hosts"] == [[0, 1, 2, 3]], rec
        assert not rec["topology"]["hierarchical"], rec  # one host: no NIC to spare
        assert rec["mismatches"] == {"sum": 0, "max": 0, "min": 0}, rec
        assert len(rec["warnings"]) == 1 and f"LOCAL_WORLD_SIZE=2 but rank {r} found 4 rank(s)" in rec["warnings"][0], rec
