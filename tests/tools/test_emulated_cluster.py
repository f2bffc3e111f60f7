"""tools/emulated_cluster.py with 2 ranks: each rank in its own namespace with its own address
and shaped veth, a gossipcc all-reduce between them, tx counters that see the bytes, and
nothing left behind on exit, on a failing rank or on Ctrl-C. Skips (saying why) where network
namespaces are not allowed."""
import os
import signal
import subprocess
import sys
import time

import pytest

import emulated_cluster as ec

TOOLS = os.environ.get("GOSSIPCC_TOOLS", os.path.dirname(ec.__file__))


def namespaces_or_skip():
    try:
        ec.check_namespaces_allowed()
        probe = f"{ec.NAME_PREFIX}{os.getpid()}-probe-r0"
        proc = subprocess.run(["ip", "netns", "add", probe], stderr=subprocess.PIPE, text=True)
        if proc.returncode != 0:
            raise ec.NamespacesUnavailable(f"`ip netns add` refused: {proc.stderr.strip()}")
        subprocess.run(["ip", "netns", "del", probe])
    except ec.NamespacesUnavailable as e:
        pytest.skip(f"network namespaces not allowed here: {e}")


def ours(cluster_name):
    return [ns for ns in ec.list_namespaces() if ns.startswith(cluster_name)]


def test_cleanup_removes_only_dead_runs():
    namespaces_or_skip()
    dead = f"{ec.NAME_PREFIX}999999999-abcd-r0"  # no such pid
    alive = f"{ec.NAME_PREFIX}{os.getpid()}-abcd-r0"
    for ns in (dead, alive):
        subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        removed = ec.cleanup_stale()
        assert dead in removed and alive not in removed
        assert alive in ec.list_namespaces()
    finally:
        for ns in (dead, alive):
            subprocess.run(["ip", "netns", "del", ns], stderr=subprocess.DEVNULL)


def test_log_tails_quotes_the_last_lines_of_each_nonempty_log(tmp_path):
    logs = [tmp_path / "rank0.log", tmp_path / "rank1.log", tmp_path / "rank2.log"]
    logs[0].write_text("one\ntwo\nthree\n")
    logs[1].write_text("")
    logs[2].write_text("boom\n")
    text = ec.log_tails([str(p) for p in logs], lines=2)
    assert text == (f"\n--- rank 0 ({logs[0]}), last lines:\ntwo\nthree"
                    f"\n--- rank 2 ({logs[2]}), last lines:\nboom")


def test_parse_network():
    assert ec.parse_network("1gbit") == ("1gbit", None)
    assert ec.parse_network("none") == (None, None)
    assert ec.parse_network("rate=300mbit,delay=5ms") == ("300mbit", "5ms")
    assert ec.rate_bits_per_second("100mbit") == 1e8
    with pytest.raises(ValueError, match="bad part 'rate=fast'"):
        ec.parse_network("rate=fast")
    with pytest.raises(ValueError, match="expected one of none"):
        ec.parse_network("2gbit")


WORKLOAD = r"""
import os, sys, torch, torch.distributed as dist, gossipcc
rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
assert os.environ["GLOO_SOCKET_IFNAME"] == f"ve{rank}", os.environ["GLOO_SOCKET_IFNAME"]
assert os.environ["MASTER_ADDR"] == "198.18.0.1"
dist.init_process_group("gossipcc", init_method="env://")
t = torch.full((1 << 18,), float(rank + 1))      # 1 MiB
dist.all_reduce(t)
assert t[0].item() == 3.0 and t[-1].item() == 3.0, t
dist.barrier()
dist.destroy_process_group()
"""


def test_two_ranks_allreduce_over_shaped_veths():
    namespaces_or_skip()
    with ec.EmulatedCluster(2, "1gbit") as cluster:
        name = cluster.name
        assert sorted(ours(name)) == sorted([f"{name}-hub", f"{name}-r0", f"{name}-r1"])
        for r in range(2):
            addr = subprocess.run(["ip", "-n", cluster.netns(r), "-4", "addr", "show", f"ve{r}"],
                                  stdout=subprocess.PIPE, text=True, check=True).stdout
            assert f"198.18.0.{r + 1}/15" in addr
            qdisc = subprocess.run(["ip", "netns", "exec", cluster.netns(r), "tc", "qdisc", "show", "dev", f"ve{r}"],
                                   stdout=subprocess.PIPE, text=True, check=True).stdout
            assert "tbf" in qdisc and "1Gbit" in qdisc, qdisc
        # The addresses exist only inside the namespaces.
        host = subprocess.run(["ip", "-4", "addr"], stdout=subprocess.PIPE, text=True).stdout
        assert "198.18.0." not in host
        result = cluster.run([[sys.executable, "-c", WORKLOAD]] * 2, timeout=60)
        # A 2-rank all-reduce of 1 MiB sends at least 1 MiB... each way: (n-1)/n * 2 * size.
        for r, sent in enumerate(result.tx_bytes):
            assert sent >= 1 << 20, f"rank {r} sent {sent} bytes"
    assert ours(name) == []


def test_failing_rank_stops_the_others_and_cleans_up():
    namespaces_or_skip()
    cluster = ec.EmulatedCluster(2, "none")
    with pytest.raises(ec.ClusterError, match="rank 1 exited with status 3"):
        with cluster:
            cluster.run([["sleep", "30"], ["sh", "-c", "exit 3"]], timeout=30)
    assert ours(cluster.name) == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_and_sigterm_remove_everything(sig):
    namespaces_or_skip()
    before = set(ec.list_namespaces())
    proc = subprocess.Popen([sys.executable, os.path.join(TOOLS, "emulated_cluster.py"), "--ranks", "2",
                             "--network", "100mbit", "--", "sleep", "60"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 20
    mine = []
    while time.monotonic() < deadline and len(mine) < 3:
        mine = [ns for ns in set(ec.list_namespaces()) - before if ns.startswith(f"{ec.NAME_PREFIX}{proc.pid}-")]
        time.sleep(0.1)
    assert len(mine) == 3, f"cluster did not come up: {mine}"
    time.sleep(0.5)  # let the ranks start
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 130, err
    assert "interrupted" in err
    left = [ns for ns in ec.list_namespaces() if ns.startswith(f"{ec.NAME_PREFIX}{proc.pid}-")]
    assert left == []


def test_delay_without_netem_says_why():
    namespaces_or_skip()
    cluster = ec.EmulatedCluster(2, "rate=100mbit,delay=1ms")
    try:
        with cluster:
            pass  # a kernel with sch_netem: the delay was added
    except ec.ClusterError as e:
        # Kernels without sch_netem (this machine's): a clear reason.
        assert "no netem qdisc" in str(e), str(e)
    assert ours(cluster.name) == []


def test_a_signal_while_a_rank_starts_still_stops_that_rank(monkeypatch):
    """SIGTERM arriving after a rank's process is forked but before the cluster has recorded it
    (as a loaded machine can time it) must still stop that rank: a rank left running holds the
    cluster's output pipes open, and whoever reads them waits for it."""
    namespaces_or_skip()
    real_popen = subprocess.Popen
    ranks = []

    def popen_then_signal(args, *a, **k):
        proc = real_popen(args, *a, **k)
        if "sleep" in args:  # a rank's command, not one of the cluster's own `ip` calls
            ranks.append(proc)
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs here, before Popen returns
        return proc

    monkeypatch.setattr(ec.subprocess, "Popen", popen_then_signal)
    try:
        with pytest.raises(KeyboardInterrupt):
            with ec.EmulatedCluster(2, "none") as cluster:
                cluster.run([["sleep", "60"]] * 2, timeout=60)
        assert ranks, "no rank was started"
        running = [p.pid for p in ranks if p.poll() is None]
        assert running == [], f"rank processes left running after the interrupt: {running}"
    finally:
        for p in ranks:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
