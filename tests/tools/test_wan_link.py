"""A WAN link on a kernel without netem: tools/emulated_cluster.py with a delay, jitter or loss
runs one NFQUEUE delay line per host (tools/wan_link.py, tools/delay_line). Two hosts: the round
trip is twice the delay, a stream reaches the link rate, a loss drops about the asked fraction;
the lines and their rules go away on exit, an exception, SIGTERM, Ctrl-C, a killed rank, and with
`cleanup` after SIGKILL; a missing binary, a busy queue and a dead line are named. Skips (saying
why) where network namespaces are not allowed; on a kernel with netem (the delay line unused)
the cases about the delay line skip."""
import os
import signal
import statistics
import subprocess
import sys
import threading
import time

import pytest

import emulated_cluster as ec
import wan_calibration
import wan_link

TOOLS = os.environ.get("GOSSIPCC_TOOLS", os.path.dirname(ec.__file__))
CLI = [sys.executable, os.path.join(TOOLS, "emulated_cluster.py")]


def namespaces_or_skip():
    try:
        ec.check_namespaces_allowed()
        probe = f"{ec.NAME_PREFIX}{os.getpid()}-probe-h0"
        proc = subprocess.run(["ip", "netns", "add", probe], stderr=subprocess.PIPE, text=True)
        if proc.returncode != 0:
            raise ec.NamespacesUnavailable(f"`ip netns add` refused: {proc.stderr.strip()}")
        subprocess.run(["ip", "netns", "del", probe])
    except ec.NamespacesUnavailable as e:
        pytest.skip(f"network namespaces not allowed here: {e}")


def delay_lines_or_skip(cluster):
    if not cluster.delay_lines:
        pytest.skip("this kernel has sch_netem: the cluster delays with netem, not the delay line")


def lines_of(prefix):
    """pids of delay lines whose label names a namespace starting with `prefix`."""
    return wan_link.stray_processes(lambda ns: ns.startswith(prefix))


def ours(prefix):
    return [ns for ns in ec.list_namespaces() if ns.startswith(prefix)]


def remove_leftovers(prefix):
    """What a failed case left under `prefix` (not ec.cleanup_stale: that would also take other
    tests' namespaces of dead runs, which they may be using)."""
    for pid in lines_of(prefix):
        os.kill(pid, signal.SIGKILL)
    for ns in ours(prefix):
        for pid in subprocess.run(["ip", "netns", "pids", ns], stdout=subprocess.PIPE, text=True).stdout.split():
            os.kill(int(pid), signal.SIGKILL)
        subprocess.run(["ip", "netns", "del", ns])


def test_parse_link():
    assert ec.parse_link("rate=100mbit,delay=25ms,jitter=2ms,loss=1.5%") == ("100mbit", "25ms", "2ms", 0.015)
    assert ec.parse_link("100mbit-wan") == ("100mbit", "20ms", None, 0.0)
    assert ec.parse_link("loss=5%") == (None, None, None, 0.05)
    assert ec.parse_network("rate=1gbit,delay=5ms,loss=1%") == ("1gbit", "5ms")
    for spec, message in [("rate=1gbit,jitter=2ms", "jitter needs a delay"), ("loss=1", "bad part 'loss=1'"),
                          ("loss=100%", "below 100%"), ("delay=5ms,delay=6ms", "delay given twice"),
                          ("delay=5", "bad part 'delay=5'")]:
        with pytest.raises(ValueError, match=message):
            ec.parse_link(spec)


def test_round_trip_is_twice_the_delay():
    namespaces_or_skip()
    with ec.EmulatedCluster(hosts=2, network="rate=100mbit,delay=25ms") as cluster:
        delay_lines_or_skip(cluster)
        rtts = wan_calibration.measure_rtt(cluster, round_trips=20)
    # A packet is never accepted before its time; the median within the calibrated 10%.
    assert min(rtts) >= 0.050, f"a round trip shorter than 2 x 25 ms: {min(rtts) * 1e3:.2f} ms"
    assert statistics.median(rtts) <= 0.055, f"median round trip {statistics.median(rtts) * 1e3:.2f} ms"


def test_stream_reaches_the_link_rate():
    namespaces_or_skip()
    # 25 ms: the delay must hold far more than a socket's TCP Small Queues budget (two 64 KB
    # segments), which a delay on the sender's side would run into.
    with ec.EmulatedCluster(hosts=2, network="rate=100mbit,delay=25ms") as cluster:
        delay_lines_or_skip(cluster)
        stream = wan_calibration.measure_stream(cluster, seconds=2.0, warmup=1.0)
    goodput = stream["acked_bytes"] * 8 / stream["seconds"]
    data_rate = 100e6 * wan_calibration.payload_share(stream["mss"])  # what full frames leave for data
    # At most the link's data rate (tbf; 2% for its bucket and the clock); the calibrated bound is
    # 5% below it, 10% allows for a loaded machine.
    assert 0.90 * data_rate <= goodput <= 1.02 * data_rate, \
        f"goodput {goodput / 1e6:.1f} Mbit/s on a 100 Mbit/s link (data rate {data_rate / 1e6:.1f}): {stream}"


LOSS_PROBE = r"""
import os, socket, sys, time
port = 5301
if sys.argv[1] == "receive":
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    # Room for every datagram (rmem_max caps it), so that a receiver descheduled on a loaded
    # machine loses none: the only losses are then the delay line's.
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    s.bind(("0.0.0.0", port))
    print("ready", flush=True)  # the test starts the sender only now
    s.settimeout(30)
    n = 0
    try:
        while True:
            s.recv(2048)
            n += 1
            s.settimeout(3.0)  # the sender is done once 3 s pass without a datagram
    except socket.timeout:
        pass
    print(n, flush=True)
else:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for i in range(2000):
        s.sendto(b"x" * 100, (sys.argv[2], port))
        if i % 50 == 49:
            time.sleep(0.005)
"""


def test_loss_drops_about_the_asked_fraction():
    namespaces_or_skip()
    with ec.EmulatedCluster(hosts=2, network="loss=20%") as cluster:
        delay_lines_or_skip(cluster)
        receiver = cluster.popen(1, [sys.executable, "-c", LOSS_PROBE, "receive"], stdout=subprocess.PIPE, text=True)
        assert receiver.stdout.readline().strip() == "ready", "the receiver did not bind its port"
        sender = cluster.popen(0, [sys.executable, "-c", LOSS_PROBE, "send", cluster.address(1)])
        assert sender.wait(timeout=60) == 0
        out, _ = receiver.communicate(timeout=60)
        line = cluster.delay_lines[1]
        counters = line.stop()
    received = int(out)
    # 2000 datagrams, each dropped with probability 0.2: 1600 received, sigma ~18; 4 sigma.
    assert 1528 <= received <= 1672, f"{received} of 2000 datagrams arrived with 20% loss"
    assert counters["dropped"] == 2000 - received, counters
    assert counters["kernel_queue_full"] == 0 and counters["kernel_user_dropped"] == 0, counters


def rule_listing(ns):
    return subprocess.run(["ip", "netns", "exec", ns, "iptables", "-w", "-t", "raw", "-S", "PREROUTING"],
                          stdout=subprocess.PIPE, text=True).stdout


@pytest.mark.parametrize("how", ["normal exit", "exception"])
def test_nothing_left_after_exit_and_exception(how):
    namespaces_or_skip()
    cluster = ec.EmulatedCluster(hosts=2, network="rate=100mbit,delay=5ms")
    try:
        with cluster:
            delay_lines_or_skip(cluster)
            assert len(lines_of(cluster.name)) == 2
            for h in range(2):
                assert f"-i ve{h} -j NFQUEUE --queue-num 0" in rule_listing(cluster.netns(h))
            cluster.run([["true"]] * 2, timeout=30)
            if how == "exception":
                raise RuntimeError("boom")
    except RuntimeError as e:
        assert how == "exception" and str(e) == "boom"
    assert lines_of(cluster.name) == [] and ours(cluster.name) == []
    assert len(cluster.delay_line_counters) == 2, "every line printed its counters on the way out"


def test_stop_removes_the_rule_and_reports_counters():
    namespaces_or_skip()
    ns = f"{ec.NAME_PREFIX}{os.getpid()}-wl00-h0"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        line = wan_link.DelayLine(ns, "d0", "10ms", seed=3)  # iptables takes a name with no device yet
        line.start()
        try:
            assert "-i d0 -j NFQUEUE --queue-num 0" in rule_listing(ns)
            # A second line on the same queue of the same namespace is refused, saying why.
            other = wan_link.DelayLine(ns, "d0", "10ms")
            with pytest.raises(wan_link.WanLinkError, match="queue busy"):
                other.start()
        finally:
            counters = line.stop()
        assert "NFQUEUE" not in rule_listing(ns)
        assert counters is not None and counters["packets"] == 0, line.output
        assert not line.alive()
    finally:
        subprocess.run(["ip", "netns", "del", ns])


def wait_for(predicate, what, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what} not within {timeout:.0f} s"
        time.sleep(0.05)


def start_cli(*command, network="rate=100mbit,delay=5ms"):
    proc = subprocess.Popen(CLI + ["--hosts", "2", "--network", network, "--"] + list(command),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    prefix = f"{ec.NAME_PREFIX}{proc.pid}-"
    return proc, prefix


@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT", "killed rank"])
def test_nothing_left_after_sigterm_ctrl_c_and_a_killed_rank(how):
    namespaces_or_skip()
    if how != "killed rank":
        proc, prefix = start_cli("sleep", "60")
    else:
        proc, prefix = start_cli("sh", "-c", "sleep 1.5; kill -KILL $$")
    try:
        wait_for(lambda: len(lines_of(prefix)) == 2 or proc.poll() is not None, "two delay lines")
        if not lines_of(prefix):
            _, err = proc.communicate()
            pytest.skip(f"no delay lines (a kernel with netem?): {err}")
        if how != "killed rank":
            time.sleep(0.3)  # the ranks start
            proc.send_signal(getattr(signal, how))
        _, err = proc.communicate(timeout=60)
        if how != "killed rank":
            assert proc.returncode == 130 and "interrupted" in err, err
        else:
            assert proc.returncode == 1 and "exited with status -9" in err, err
        assert lines_of(prefix) == [] and ours(prefix) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        remove_leftovers(prefix)


def test_cleanup_after_sigkill():
    namespaces_or_skip()
    proc, prefix = start_cli("sleep", "60")
    try:
        wait_for(lambda: len(lines_of(prefix)) == 2 or proc.poll() is not None, "two delay lines")
        if not lines_of(prefix):
            proc.kill()
            proc.wait()
            pytest.skip("no delay lines (a kernel with netem?)")
        wait_for(lambda: all(subprocess.run(["ip", "netns", "pids", ns], stdout=subprocess.PIPE, text=True).stdout.count("\n") >= 2
                             for ns in ours(prefix) if not ns.endswith("-hub")), "the ranks started")
        proc.kill()
        proc.wait()
        # Its lines exit by themselves once their parent is gone; the namespaces and ranks stay.
        wait_for(lambda: lines_of(prefix) == [], "the delay lines exiting after their parent")
        left = ours(prefix)
        assert len(left) == 3
        ranks = [int(p) for ns in left for p in subprocess.run(["ip", "netns", "pids", ns], stdout=subprocess.PIPE,
                                                               text=True).stdout.split()]
        assert ranks, "the ranks of the killed run are still running"
        # (Its output is not checked for these names: a concurrent test's cleanup may take them first.)
        subprocess.run(CLI + ["cleanup"], stdout=subprocess.PIPE, text=True, check=True)
        assert ours(prefix) == []
        wait_for(lambda: not any(os.path.exists(f"/proc/{p}") and open(f"/proc/{p}/stat").read().split()[2] != "Z"
                                 for p in ranks), "the killed run's ranks ending")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        remove_leftovers(prefix)


def test_a_dead_delay_line_stops_the_run():
    namespaces_or_skip()
    with ec.EmulatedCluster(hosts=2, network="rate=100mbit,delay=5ms") as cluster:
        delay_lines_or_skip(cluster)
        victim = cluster.delay_lines[1]
        threading.Timer(0.5, lambda: os.kill(victim.proc.pid, signal.SIGKILL)).start()
        with pytest.raises(ec.ClusterError, match=f"the delay line of {cluster.netns(1)} exited"):
            cluster.run([["sleep", "30"]] * 2, timeout=20)


def test_missing_binary_is_named(monkeypatch):
    namespaces_or_skip()
    monkeypatch.setenv(wan_link.BINARY_ENV, "/nonexistent/delay_line")
    cluster = ec.EmulatedCluster(hosts=2, network="rate=100mbit,delay=5ms")
    try:
        with cluster:
            delay_lines_or_skip(cluster)
    except ec.ClusterError as e:
        assert "/nonexistent/delay_line is not an executable file" in str(e), str(e)
        assert "bazel build //tools/delay_line:delay_line" in str(e), str(e)
    else:
        pytest.fail("the cluster came up without its delay line binary")
    assert ours(cluster.name) == [] and lines_of(cluster.name) == []
