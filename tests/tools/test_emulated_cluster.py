"""tools/emulated_cluster.py. With 2 hosts of one rank: each rank in its own namespace with its
own address and shaped veth, a gossipcc all-reduce between them, tx counters that see the bytes,
and nothing left behind on exit, on a failing rank or on Ctrl-C. With hosts of several ranks:
the ranks of a host share its link (a plain TCP transfer's rate), get torchrun's variables, talk
to each other unshaped and off the NIC, and leave nothing behind (namespaces, cgroups, processes)
after exit, Ctrl-C, SIGTERM and a killed rank. Skips (saying why) where network namespaces are
not allowed."""
import json
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
        # Limited to these two names: a global cleanup would also take the namespaces of runs
        # that concurrent tests killed on purpose and are still inspecting.
        # (wan_link_test's `cleanup` command may take `dead` first: its absence is what counts.)
        removed = ec.cleanup_stale(among=(dead, alive))
        assert set(removed) <= {dead} and dead not in ec.list_namespaces()
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
        assert (cluster.hosts, cluster.ranks_per_host, cluster.n) == (2, 1, 2)
        assert sorted(ours(name)) == sorted([f"{name}-hub", f"{name}-h0", f"{name}-h1"])
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


# --- hosts of several ranks ------------------------------------------------------------------

# A plain TCP transfer between ranks, every role in one script (chosen by RANK): a sender
# connects to its receiver, says it is ready (a file), waits for the other senders of the
# phase, then sends for SECONDS, and records its own and its host's counters (read from inside
# the rank) from then until the receiver has acknowledged the end of the stream; a receiver
# samples (time, bytes so far) until the stream ends. Times
# are CLOCK_MONOTONIC, the same clock in every process of the machine.
TRANSFER = r"""
import json, os, socket, sys, time
rank = int(os.environ["RANK"])
out, plan, seconds = sys.argv[1], json.loads(sys.argv[2]), float(sys.argv[3])
sys.path.insert(0, sys.argv[4])
from emulated_cluster import host_tx_bytes, rank_tx_bytes
role = plan.get(str(rank))
if role is None:
    sys.exit(0)
if role[0] == "recv":
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", role[1]))
    s.listen(1)
    open(os.path.join(out, f"listening{rank}"), "w").close()
    c, _ = s.accept()
    total, samples = 0, [(time.monotonic(), 0)]
    while True:
        b = c.recv(1 << 20)
        if not b:
            break
        total += len(b)
        samples.append((time.monotonic(), total))
    c.sendall(b"k")
    json.dump(samples, open(os.path.join(out, f"recv{rank}.json"), "w"))
else:
    _, address, port, receiver = role
    while not os.path.exists(os.path.join(out, f"listening{receiver}")):
        time.sleep(0.01)
    c = socket.create_connection((address, port))
    open(os.path.join(out, f"ready{rank}"), "w").close()
    senders = [r for r, v in plan.items() if v[0] == "send"]
    while not all(os.path.exists(os.path.join(out, f"ready{r}")) for r in senders):
        time.sleep(0.005)
    counters = [rank_tx_bytes(), host_tx_bytes()]
    start = time.monotonic()
    chunk = b"x" * (1 << 16)
    while time.monotonic() - start < seconds:
        c.sendall(chunk)
    end = time.monotonic()
    c.shutdown(socket.SHUT_WR)
    assert c.recv(1) == b"k"  # everything sent has arrived: the counters hold it
    json.dump({"start": start, "end": end, "rank_tx": rank_tx_bytes() - counters[0],
               "host_tx": host_tx_bytes() - counters[1]}, open(os.path.join(out, f"send{rank}.json"), "w"))
"""


def received_between(samples, t0, t1):
    """Bytes a receiver got between t0 and t1, from its (time, bytes so far) samples."""
    def at(t):
        before = [b for s, b in samples if s <= t]
        return before[-1] if before else 0
    return at(t1) - at(t0)


def transfer(cluster, plan, seconds, tmp_path):
    """Runs the plan ({rank: role}) on the cluster; returns ({receiver: Mbit/s it got while every
    sender was sending, the first 0.5 s of that left out for TCP's start}, {receiver: bytes it got
    in all}, {sender: what it recorded}, RunResult)."""
    out = tmp_path / f"transfer{len(list(tmp_path.iterdir()))}"
    out.mkdir()
    result = cluster.run([[sys.executable, "-c", TRANSFER, str(out), json.dumps(plan), str(seconds), TOOLS]] *
                         cluster.n, timeout=120)
    sends = {int(r): json.loads((out / f"send{r}.json").read_text()) for r, v in plan.items() if v[0] == "send"}
    t0 = max(s["start"] for s in sends.values()) + 0.5
    t1 = min(s["end"] for s in sends.values())
    assert t1 - t0 > 1.0, f"senders overlapped for {t1 - t0 + 0.5:.2f} s only: {sends}"
    samples = {int(r): json.loads((out / f"recv{r}.json").read_text()) for r, v in plan.items() if v[0] == "recv"}
    rates = {r: received_between(s, t0, t1) * 8 / (t1 - t0) / 1e6 for r, s in samples.items()}
    return rates, {r: s[-1][1] for r, s in samples.items()}, sends, result


def test_ranks_of_a_host_share_its_link(tmp_path):
    """2 hosts x 2 ranks at 100 Mbit/s: one rank of host 0 sending to host 1 alone gets about the
    whole link; both ranks sending at once (to both ranks of host 1) get about half each, since
    they share host 0's upload and host 1's download. Links of their own would give each ~all."""
    namespaces_or_skip()
    link = 100.0  # Mbit/s
    with ec.EmulatedCluster(hosts=2, ranks_per_host=2, network="100mbit") as cluster:
        assert (cluster.hosts, cluster.ranks_per_host, cluster.n) == (2, 2, 4)
        assert [cluster.host_of(r) for r in range(4)] == [0, 0, 1, 1]
        assert sorted(ours(cluster.name)) == sorted([f"{cluster.name}-hub", f"{cluster.name}-h0", f"{cluster.name}-h1"])
        h1 = cluster.address(1)
        solo, _, _, _ = transfer(cluster, {"0": ["send", h1, 41000, 2], "2": ["recv", 41000]}, 2.5, tmp_path)
        both, received, sends, result = transfer(cluster, {"0": ["send", h1, 41000, 2], "1": ["send", h1, 41001, 3],
                                          "2": ["recv", 41000], "3": ["recv", 41001]}, 3.0, tmp_path)
    print(f"\none rank alone: {solo[2]:.1f} Mbit/s; two at once: {both[2]:.1f} + {both[3]:.1f} Mbit/s "
          f"(link {link:.0f}); sent: hosts {result.host_tx_bytes}, ranks {result.tx_bytes}")
    assert 0.8 * link < solo[2] < 1.05 * link, solo
    for r in (2, 3):
        assert 0.3 * link < both[r] < 0.7 * link, both
    assert both[2] + both[3] < 1.05 * link, both
    # Bytes: each sending rank's counter holds its own stream (payload plus TCP/IP/Ethernet
    # headers: under 5% at a 1500-byte MTU); host 0's NIC both, with the headers of the frames
    # the shaper splits large segments into; host 1 only ACKs.
    # Read from inside the rank (rank_tx_bytes), its own stream too; its host's counter both.
    for sender, receiver in ((0, 2), (1, 3)):
        assert received[receiver] <= result.tx_bytes[sender] < 1.06 * received[receiver], (received, result.tx_bytes)
        assert received[receiver] <= sends[sender]["rank_tx"] < 1.06 * received[receiver], (received, sends)
        assert sends[sender]["host_tx"] > sends[sender]["rank_tx"] + 0.2 * received[receiver], sends
    assert 0.93 * result.host_tx_bytes[0] < result.tx_bytes[0] + result.tx_bytes[1] <= result.host_tx_bytes[0], \
        (result.tx_bytes, result.host_tx_bytes)
    assert result.host_tx_bytes[1] < 0.05 * result.host_tx_bytes[0], result.host_tx_bytes
    assert result.tx_bytes[2] + result.tx_bytes[3] <= result.host_tx_bytes[1], (result.tx_bytes, result.host_tx_bytes)


ENVIRONMENT = r"""
import json, os, socket, sys
names = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
         "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "GLOO_SOCKET_IFNAME",
         "GOSSIPCC_NETNS_IFACE"]
record = {n: os.environ.get(n) for n in names}
record["netns"] = os.stat("/proc/self/ns/net").st_ino
record["hostname"] = socket.gethostname()
record["resolved"] = socket.gethostbyname(os.environ["MASTER_ADDR"])
with open(os.path.join(sys.argv[1], os.environ["RANK"]), "w") as f:
    json.dump(record, f)
"""


@pytest.mark.parametrize("hosts,per_host", [(2, 2), (3, 1)])
def test_ranks_get_torchruns_variables(hosts, per_host, tmp_path):
    namespaces_or_skip()
    with ec.EmulatedCluster(hosts=hosts, ranks_per_host=per_host, network="none", hostnames=True) as cluster:
        cluster.run([[sys.executable, "-c", ENVIRONMENT, str(tmp_path)]] * cluster.n, timeout=60)
    records = {r: json.loads((tmp_path / str(r)).read_text()) for r in range(hosts * per_host)}
    assert sorted(records) == list(range(hosts * per_host))
    for r, rec in records.items():
        host = r // per_host
        assert rec == dict(rec, RANK=str(r), WORLD_SIZE=str(hosts * per_host), LOCAL_RANK=str(r % per_host),
                           LOCAL_WORLD_SIZE=str(per_host), GROUP_RANK=str(host), GROUP_WORLD_SIZE=str(hosts),
                           ROLE_RANK=str(r), ROLE_WORLD_SIZE=str(hosts * per_host), ROLE_NAME="default",
                           MASTER_ADDR="host0", MASTER_PORT=str(ec.MASTER_PORT), GLOO_SOCKET_IFNAME=f"ve{host}",
                           GOSSIPCC_NETNS_IFACE=f"ve{host}", hostname=f"host{host}", resolved="198.18.0.1"), rec
        # Ranks of a host share its network namespace; hosts do not.
        assert (rec["netns"] == records[host * per_host]["netns"]), (r, records)
    assert len({rec["netns"] for rec in records.values()}) == hosts


def test_local_cluster_numbers_ranks_as_torchrun_does(tmp_path):
    """LocalCluster(hosts=2, ranks_per_host=2): the same variables over loopback, no namespaces."""
    cluster = ec.LocalCluster(hosts=2, ranks_per_host=2)
    assert (cluster.n, [cluster.host_of(r) for r in range(4)]) == (4, [0, 0, 1, 1])
    result = cluster.run([[sys.executable, "-c", ENVIRONMENT, str(tmp_path)]] * 4, timeout=60)
    assert result.tx_bytes == [None] * 4 and result.host_tx_bytes == [None] * 2
    for r in range(4):
        rec = json.loads((tmp_path / str(r)).read_text())
        assert rec == dict(rec, RANK=str(r), WORLD_SIZE="4", LOCAL_RANK=str(r % 2), LOCAL_WORLD_SIZE="2",
                           GROUP_RANK=str(r // 2), GROUP_WORLD_SIZE="2", ROLE_RANK=str(r), ROLE_WORLD_SIZE="4",
                           MASTER_ADDR="127.0.0.1", GOSSIPCC_NETNS_IFACE=None), rec
    with pytest.raises(ValueError, match="5 ranks do not make hosts of 2 ranks each"):
        ec.LocalCluster(5, ranks_per_host=2)
    with pytest.raises(ValueError, match="4 ranks but 3 hosts of 2 ranks"):
        ec.EmulatedCluster(4, hosts=3, ranks_per_host=2)
    with pytest.raises(ValueError, match="ranks per host must be a whole number >= 1, got 0"):
        ec.EmulatedCluster(hosts=2, ranks_per_host=0)


# Rank 0 sends 8 MB to rank 1 on the same host over the host's own address and over the loopback;
# prints the Mbit/s of each and the host NIC's tx_bytes around them.
INTRA_HOST = r"""
import os, socket, sys, threading, time
rank = int(os.environ["RANK"])
own = sys.argv[1]
size = 8 << 20
def nic():
    with open(f"/sys/class/net/{os.environ['GOSSIPCC_NETNS_IFACE']}/statistics/tx_bytes") as f:
        return int(f.read())
for i, address in enumerate((own, "127.0.0.1")):
    port = 42000 + i
    if rank == 1:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((address, port))
        s.listen(1)
        c, _ = s.accept()
        got = 0
        while got < size:
            got += len(c.recv(1 << 20))
        c.sendall(b"k")
        c.close(); s.close()
    else:
        while True:
            try:
                c = socket.create_connection((address, port))
                break
            except ConnectionRefusedError:
                time.sleep(0.01)
        before, start = nic(), time.monotonic()
        c.sendall(b"x" * size)
        assert c.recv(1) == b"k"
        seconds, after = time.monotonic() - start, nic()
        print(f"{address} {size * 8 / seconds / 1e6:.1f} {after - before}", flush=True)
"""


def test_ranks_of_a_host_talk_unshaped_and_off_the_nic():
    """At 10 Mbit/s links, 8 MB between two ranks of one host (over its address, then the
    loopback) go faster than 5x the link rate, and the NIC's counter barely moves (ARP at most)."""
    namespaces_or_skip()
    with ec.EmulatedCluster(hosts=2, ranks_per_host=2, network="rate=10mbit") as cluster:
        procs = [cluster.popen(r, [sys.executable, "-c", INTRA_HOST, cluster.address(0)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in (0, 1)]
        outputs = [p.communicate(timeout=120)[0] for p in procs]
        assert [p.returncode for p in procs] == [0, 0], outputs
    lines = outputs[0].split("\n")
    for line, address in zip(lines, (cluster.address(0), "127.0.0.1")):
        got, mbits, nic = line.split()
        print(f"\nwithin a host over {got}: {float(mbits):.0f} Mbit/s, {nic} bytes on the NIC")
        assert got == address, outputs
        assert float(mbits) > 50, line
        assert int(nic) < 10_000, line


def running(pid):
    """Whether pid is a live process (a zombie nobody reaped yet is not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


# Each rank records its pid and starts a process outside its session (setsid: not in the process
# group the cluster kills), then per MODE: exits, waits to be interrupted, or (rank 3) is killed.
LEFT_BEHIND = r"""
echo $$ > "$OUT/pid$RANK"
setsid sleep 60 & echo $! > "$OUT/.escaped$RANK" && mv "$OUT/.escaped$RANK" "$OUT/escaped$RANK"
case "$MODE" in
  exit) exit 0 ;;
  killed) if [ "$RANK" = 3 ]; then sleep 0.5; kill -9 $$; fi ;;
esac
sleep 60
"""


@pytest.mark.parametrize("mode", ["exit", "SIGINT", "SIGTERM", "killed"])
def test_two_hosts_of_two_ranks_leave_nothing_behind(mode, tmp_path):
    """At 2 x 2, after a normal exit, Ctrl-C, SIGTERM and a rank killed with SIGKILL: no
    namespace, no rank cgroup, no rank process, not even one that left its session."""
    namespaces_or_skip()
    before = set(ec.list_namespaces())
    proc = subprocess.Popen([sys.executable, os.path.join(TOOLS, "emulated_cluster.py"), "--hosts", "2",
                             "--ranks-per-host", "2", "--network", "100mbit", "--", "sh", "-c", LEFT_BEHIND],
                            env=dict(os.environ, OUT=str(tmp_path), MODE=mode),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    prefix = f"{ec.NAME_PREFIX}{proc.pid}-"
    if mode.startswith("SIG"):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(list(tmp_path.glob("escaped*"))) < 4:
            time.sleep(0.05)
        assert len(list(tmp_path.glob("escaped*"))) == 4, "the ranks did not start"
        mine = [ns for ns in set(ec.list_namespaces()) - before if ns.startswith(prefix)]
        assert len(mine) == 3, mine
        proc.send_signal(getattr(signal, mode))
    out, err = proc.communicate(timeout=60)
    expected = {"exit": 0, "SIGINT": 130, "SIGTERM": 130, "killed": 1}[mode]
    assert proc.returncode == expected, (out, err)
    if mode == "killed":
        assert "rank 3 exited with status -9" in err, err
    pids = [int(p.read_text()) for p in tmp_path.iterdir()]
    assert len(pids) == 8, sorted(p.name for p in tmp_path.iterdir())
    assert [ns for ns in ec.list_namespaces() if ns.startswith(prefix)] == []
    root = ec.cgroup2_root()
    if root is not None:
        assert [d for d in os.listdir(root) if d.startswith(prefix)] == []
    assert [p for p in pids if running(p)] == []


def test_cleanup_removes_the_rank_cgroups_of_dead_runs_only():
    namespaces_or_skip()
    root = ec.cgroup2_root()
    if root is None:
        pytest.skip("no cgroup2 file system mounted")
    dead = os.path.join(root, f"{ec.NAME_PREFIX}999999999-abcd")
    alive = os.path.join(root, f"{ec.NAME_PREFIX}{os.getpid()}-abcd")
    for d in (dead, alive):
        os.makedirs(os.path.join(d, "r0"))
    try:
        sleeper = subprocess.Popen(["sh", "-c", f'echo $$ > {dead}/r0/cgroup.procs && exec sleep 60'])
        deadline = time.monotonic() + 10
        while not open(f"{dead}/r0/cgroup.procs").read().strip() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ec.cleanup_stale_cgroups() == [os.path.basename(dead)]
        assert sleeper.wait(timeout=10) == -signal.SIGKILL
        assert not os.path.exists(dead) and os.path.isdir(os.path.join(alive, "r0"))
    finally:
        for d in (dead, alive):
            if os.path.exists(d):
                ec.remove_cgroup_tree(d)
