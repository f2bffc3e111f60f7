"""gossipcc across hosts launched the way PyTorch users launch a job, side by side with gloo.

Each rank runs on its own emulated host (tools/emulated_cluster.py: a network namespace with an
address of its own and a name, host<r>, that every host resolves), with torch's variables only
(MASTER_ADDR=host0, MASTER_PORT, RANK, WORLD_SIZE) and no GLOO_SOCKET_IFNAME or GOSSIPCC_*
variable, so each backend must choose its listening address itself (ProcessGroupGloo's rule:
this host's name if it resolves to an address of this host). Also: the loopback fallback on a
host whose name does not resolve, torchrun across two hosts, and the deadlines of a failing
init_process_group, each measured. Needs root (network namespaces); skips saying why otherwise.
"""
import json
import os
import subprocess
import sys
import tempfile
import time

import pytest

import emulated_cluster as ec

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "multihost_worker.py")
PY = sys.executable


def cluster_or_skip(n, **kwargs):
    try:
        ec.check_namespaces_allowed()
    except ec.NamespacesUnavailable as e:
        pytest.skip(f"no network namespaces here: {e}")
    return ec.EmulatedCluster(n, "none", **kwargs)


def run_hosts(cluster, mode, backend, timeout_s=30, env=None, run_timeout=240):
    """Runs the worker on every host; returns (records by rank, combined logs)."""
    out = tempfile.mkdtemp(prefix="gossipcc-multihost-")
    logs = [open(os.path.join(out, f"log{r}"), "w+") for r in range(cluster.n)]
    error = None
    try:
        # How many ranks were launched: in "init" mode rank 0 keeps its store up until each has recorded.
        launched = {"MULTIHOST_LAUNCHED": str(cluster.n)}
        env = [dict(e, **launched) for e in env] if isinstance(env, list) else dict(env or {}, **launched)
        cluster.run([[PY, WORKER, mode, backend, out, str(timeout_s)]] * cluster.n, env=env, timeout=run_timeout,
                    stdout=logs, stderr=logs)
    except ec.ClusterError as e:
        error = e
    text = ""
    for r, f in enumerate(logs):
        f.seek(0)
        text += f"--- rank {r}:\n{f.read()[-3000:]}\n"
        f.close()
    records = {}
    for r in range(cluster.n):
        path = os.path.join(out, f"rank{r}.json")
        if os.path.exists(path):
            with open(path) as f:
                records[r] = json.load(f)
    if error is not None and mode != "init":
        raise AssertionError(f"{backend} {mode}: {error}\n{text}")
    return records, text


def test_two_hosts_with_torchs_variables_only():
    """The new user's first run: both backends print the right sum, no extra variable."""
    with cluster_or_skip(2, hostnames=True, interface_env=False) as cluster:
        for backend in ("gloo", "gossipcc"):
            records, logs = run_hosts(cluster, "sum", backend, timeout_s=20)
            for r in range(2):
                assert records[r]["sum"] == [3.0, 3.0, 3.0], f"{backend} rank {r}\n{logs}"
                assert records[r]["host"] == f"host{r}"


def test_four_hosts_train_on_gossipcc_as_on_gloo():
    import gossipcc._C as C
    import torch
    with cluster_or_skip(4, hostnames=True, interface_env=False) as cluster:
        gloo, _ = run_hosts(cluster, "train", "gloo")
        mine, logs = run_hosts(cluster, "train", "gossipcc")
    for r in range(4):
        # Exact DDP: gloo's parameters to rounding, and the same on every rank.
        assert torch.allclose(torch.tensor(mine[r]["ddp"]), torch.tensor(gloo[r]["ddp"]), rtol=1e-5, atol=1e-6), logs
        assert mine[r]["ddp"] == mine[0]["ddp"]
        # PowerSGD policy: replicas stay identical (every rank applies the same averaged update).
        assert mine[r]["ddp_powersgd"] == mine[0]["ddp_powersgd"]
        # A push-sum round on the ring at step 0, uniform weights: x and w each the average of
        # this rank's and its in-peer's.
        in_peers = C.peer_graph_in_peers("ring", 4, r, 0)
        expected = (r + sum(in_peers)) / (1 + len(in_peers))
        assert mine[r]["push_sum"]["x"] == pytest.approx([expected] * 5)
        assert mine[r]["push_sum"]["weight"] == pytest.approx(1.0)


def test_a_host_whose_name_does_not_resolve_falls_back_to_the_loopback_and_warns():
    """One host (2 ranks in one namespace) whose name is in no hosts file: gossipcc listens on
    the loopback, says so once with the variable to set, and the job runs."""
    with cluster_or_skip(1, hostnames=True, interface_env=False) as cluster:
        cluster.write_hosts_file(0, names=False)  # host0 resolves nowhere
        out = tempfile.mkdtemp(prefix="gossipcc-fallback-")
        procs = [cluster.popen(0, [PY, WORKER, "sum", "gossipcc", out, "20"],
                               env={"RANK": str(r), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"},
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
        outputs = [p.communicate(timeout=120)[0] for p in procs]
        assert all(p.returncode == 0 for p in procs), outputs
        for text in outputs:
            assert "does not resolve to an address this host can bind" in text, text
            assert "GLOO_SOCKET_IFNAME" in text and "sum [3.0, 3.0, 3.0]" in text, text


TRAIN_SCRIPT = """
import os, torch, torch.distributed as dist, gossipcc
dist.init_process_group(backend="gossipcc")
t = torch.ones(3) * (dist.get_rank() + 1)
dist.all_reduce(t)
os.write(1, f"{os.uname().nodename} rank {dist.get_rank()} of {dist.get_world_size()} sum {t.tolist()}\\n".encode())
dist.destroy_process_group()
"""


def test_torchrun_across_two_hosts(tmp_path):
    """The documented command line, --nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d
    --rdzv-endpoint=host0:PORT, as gossipcc.torchrun (torchrun itself cannot start on Debian's
    torch: 1.13 on Python 3.11, and 2.x built without libuv; docs/pytorch.md), which takes the
    hyphen spellings on torch 1.13 too."""
    script = tmp_path / "train.py"
    script.write_text(TRAIN_SCRIPT)
    with cluster_or_skip(2, hostnames=True, interface_env=False) as cluster:
        flags = ["--nnodes=2", "--nproc-per-node=2", "--rdzv-backend=c10d", "--rdzv-endpoint=host0:29400",
                 "--rdzv-id=job1"]
        cmd = [PY, "-m", "gossipcc.torchrun"] + flags + [str(script)]
        procs = [cluster.popen(r, cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
        outputs = [p.communicate(timeout=180)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(outputs)
    text = "\n".join(outputs)
    assert text.count("sum [10.0, 10.0, 10.0]") == 4, text  # ranks 0-3: 1 + 2 + 3 + 4
    assert "host0 rank" in text and "host1 rank" in text, text


# Deadlines: every rank fails init_process_group within its timeout plus a small slack.
TIMEOUT_S = 8
SLACK_S = 4  # the peer check (3-4 heartbeat intervals, docs/reliability.md) and process start-up


def report_beside_gloo(case, records, gloo, logs):
    """Every rank failed on both backends; prints both times; returns gossipcc's records."""
    for r in sorted(records):
        assert records[r]["init_error"] and gloo[r]["init_error"], logs
        print(f"\n{case}: rank {r}: gossipcc {records[r]['init_seconds']:.2f} s, "
              f"gloo {gloo[r]['init_seconds']:.2f} s: {records[r]['init_error'][:200]}")
    return records


def expect_init_fails_in_time(records, ranks, case, logs):
    for r in ranks:
        assert r in records, f"{case}: rank {r} wrote nothing (hung or crashed)\n{logs}"
        rec = records[r]
        assert rec["init_error"], f"{case}: rank {r} did not fail\n{logs}"
        assert rec["init_seconds"] < TIMEOUT_S + SLACK_S, \
            f"{case}: rank {r} failed after {rec['init_seconds']:.1f} s (timeout {TIMEOUT_S} s): {rec['init_error']}"
        print(f"\n{case}: rank {r} failed after {rec['init_seconds']:.2f} s: {rec['init_error'][:300]}")


def test_deadline_when_a_rank_never_arrives(capsys):
    """WORLD_SIZE 4 on three hosts: rank 3 never arrives. Torch's env:// store itself makes rank 0
    (its host) wait for every worker before any backend is created, with gloo as with gossipcc,
    so there the bound is gloo's own time; gossipcc's rendezvous gets only what init_process_group
    has left of its timeout, and names the ranks that never published an address."""
    with cluster_or_skip(3, hostnames=True, interface_env=False) as cluster:
        gloo, _ = run_hosts(cluster, "init", "gloo", TIMEOUT_S, env={"WORLD_SIZE": "4"})
        records, logs = run_hosts(cluster, "init", "gossipcc", TIMEOUT_S, env={"WORLD_SIZE": "4"})
    with capsys.disabled():
        report_beside_gloo("a rank never arrives", records, gloo, logs)
    for r in range(3):
        bound = max(TIMEOUT_S, gloo[r]["init_seconds"]) + SLACK_S
        assert records[r]["init_seconds"] < bound, f"rank {r}: {records[r]}"
    # Gossipcc's own error where its rendezvous was the one to give up (torch's store may be first).
    assert any("rendezvous did not complete" in records[r]["init_error"] for r in range(3)), records


def test_deadline_and_message_when_a_peer_advertises_the_loopback(capsys):
    """Rank 1 listens on 127.0.0.1 on a host of its own: rank 0's connection is refused and every
    rank fails within the timeout, the message naming the loopback and the variable to set."""
    with cluster_or_skip(2, hostnames=True, interface_env=False) as cluster:
        env = [{}, {"GOSSIPCC_HOSTNAME": "127.0.0.1"}]
        records, logs = run_hosts(cluster, "init", "gossipcc", TIMEOUT_S, env=env)
    with capsys.disabled():
        expect_init_fails_in_time(records, range(2), "a peer advertises the loopback", logs)
    assert any("loopback" in records[r]["init_error"] and "SOCKET_IFNAME" in records[r]["init_error"]
               for r in range(2)), logs


@pytest.mark.parametrize("case,env,needle", [
    ("interface that does not exist", {"GLOO_SOCKET_IFNAME": "nosuchif0"}, "does not exist on this host"),
    ("address that is not this host's", {"GOSSIPCC_HOSTNAME": "198.18.0.200"}, "none of which is an address"),
])
def test_bad_listening_address_is_named_on_every_rank(case, env, needle, capsys):
    with cluster_or_skip(2, hostnames=True, interface_env=False) as cluster:
        records, logs = run_hosts(cluster, "init", "gossipcc", TIMEOUT_S, env=env)
    with capsys.disabled():
        expect_init_fails_in_time(records, range(2), case, logs)
    for r in range(2):
        assert needle in records[r]["init_error"], logs


def test_unresolvable_master_addr_fails_as_with_gloo(capsys):
    """torch's own store (env://) is what fails, before any backend exists: as with gloo (torch
    2.6 retries the connection past the timeout, 13-18 s with 8 s); measured for the record."""
    with cluster_or_skip(2, hostnames=True, interface_env=False) as cluster:
        gloo, _ = run_hosts(cluster, "init", "gloo", TIMEOUT_S, env={"MASTER_ADDR": "no-such-host"})
        records, logs = run_hosts(cluster, "init", "gossipcc", TIMEOUT_S, env={"MASTER_ADDR": "no-such-host"})
    with capsys.disabled():
        report_beside_gloo("unresolvable MASTER_ADDR", records, gloo, logs)
    for r in range(2):
        # torch's own store fails, before any backend exists; torch 2.6 retries the connection
        # for 10-20 s with an 8 s timeout, for gloo alike: a safety net only, far above that.
        assert "no-such-host" in records[r]["init_error"], records[r]
        assert records[r]["init_seconds"] < 4 * TIMEOUT_S + SLACK_S, records[r]
