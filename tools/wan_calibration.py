"""`tools/emulated_cluster.py calibrate`: the emulated WAN measured against the link it emulates.

Between two emulated hosts, for each network:
- RTT: the median of round trips of one byte over TCP (TCP_NODELAY) on an idle link, against
  2 x delay (target: within 10%).
- Rate: one TCP stream from host 0 to host 1 for `warmup` + `seconds`; its goodput (bytes
  acknowledged, TCP_INFO's tcpi_bytes_acked) over the last `seconds`, against the link's payload
  rate, the rate x MSS / (MSS + 66) that full frames leave for data (66: the Ethernet, IP and
  TCP headers with timestamps, which tbf counts; target: within 5% where the window allows).
  The window bound is the smaller of the largest receive window the receiver advertised
  (TCP_INFO's tcpi_snd_wnd at the sender) and the sender's largest send buffer (SO_SNDBUF, which
  holds the unacknowledged data) over the median RTT; beside it, the share of the stream's busy time that TCP spent limited by the receive window and by
  its send buffer (tcpi_rwnd_limited, tcpi_sndbuf_limited). The window allows the rate where
  the bound is above it and neither share is above 5%.
- Delay-line CPU: the CPU time of both hosts' delay lines over the stream's last `seconds`
  (/proc/<pid>/schedstat, else /proc/<pid>/stat), as the share of one core per Gbit/s of the
  stream's goodput.

tests/tools/test_wan_link.py uses measure_rtt and measure_stream.
"""
import json
import os
import statistics
import subprocess
import sys

import emulated_cluster as ec

# Runs inside an emulated host: `echo-server PORT`, `echo-client ADDR PORT N`, `sink PORT`,
# `stream ADDR PORT WARMUP SECONDS`. Clients connect with retries for 10 s (the server's start on a
# loaded machine) and print one JSON line; the stream client prints "warm" when its warm-up ends.
PROBE = r"""
import json, os, socket, struct, sys, time
def connect(addr, port):
    deadline = time.monotonic() + 10
    while True:
        try:
            return socket.create_connection((addr, port), timeout=30)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
def listen(port):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port))
    s.listen(1)
    return s.accept()[0]
def tx_bytes():
    with open(f"/sys/class/net/{os.environ['GOSSIPCC_NETNS_IFACE']}/statistics/tx_bytes") as f:
        return int(f.read())
def tcp_info(s):
    # struct tcp_info (linux/tcp.h): snd_mss at 16, total_retrans at 100, bytes_acked at 120;
    # busy_time, rwnd_limited, sndbuf_limited (us) at 168, 176, 184; snd_wnd at 228.
    b = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    if len(b) < 232:
        raise SystemExit(f"TCP_INFO has {len(b)} bytes: this kernel lacks tcpi_snd_wnd (Linux 5.19)")
    busy, rwnd, sndbuf = struct.unpack_from("QQQ", b, 168)
    return {"mss": struct.unpack_from("I", b, 16)[0], "retrans": struct.unpack_from("I", b, 100)[0],
            "acked": struct.unpack_from("Q", b, 120)[0], "busy_us": busy, "rwnd_limited_us": rwnd,
            "sndbuf_limited_us": sndbuf, "snd_wnd": struct.unpack_from("I", b, 228)[0]}
mode = sys.argv[1]
if mode == "echo-server":
    c = listen(int(sys.argv[2]))
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while True:
        d = c.recv(64)
        if not d:
            break
        c.sendall(d)
elif mode == "echo-client":
    c = connect(sys.argv[2], int(sys.argv[3]))
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    rtts = []
    for _ in range(int(sys.argv[4])):
        t = time.monotonic()
        c.sendall(b"x")
        if c.recv(64) != b"x":
            raise SystemExit("echo: wrong reply")
        rtts.append(time.monotonic() - t)
    print(json.dumps({"rtts": rtts}), flush=True)
elif mode == "sink":
    c = listen(int(sys.argv[2]))
    n = 0
    while True:
        d = c.recv(1 << 20)
        if not d:
            break
        n += len(d)
    print(json.dumps({"received": n}), flush=True)
elif mode == "stream":
    c = connect(sys.argv[2], int(sys.argv[3]))
    warmup, seconds = float(sys.argv[4]), float(sys.argv[5])
    buf = b"\0" * (1 << 20)
    start = time.monotonic()
    while time.monotonic() - start < warmup:
        c.sendall(buf)
    print("warm", flush=True)
    t0, tx0, info0 = time.monotonic(), tx_bytes(), tcp_info(c)
    snd_wnd, sndbuf = info0["snd_wnd"], 0
    while time.monotonic() - t0 < seconds:
        c.sendall(buf)
        snd_wnd = max(snd_wnd, tcp_info(c)["snd_wnd"])
        sndbuf = max(sndbuf, c.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF))
    t1, tx1, info1 = time.monotonic(), tx_bytes(), tcp_info(c)
    c.shutdown(socket.SHUT_WR)
    c.recv(1)
    print(json.dumps({"seconds": t1 - t0, "tx_bytes": tx1 - tx0, "acked_bytes": info1["acked"] - info0["acked"],
                      "snd_wnd_max": snd_wnd, "sndbuf_max": sndbuf, "mss": info1["mss"],
                      "retrans": info1["retrans"] - info0["retrans"],
                      "busy_us": info1["busy_us"] - info0["busy_us"],
                      "rwnd_limited_us": info1["rwnd_limited_us"] - info0["rwnd_limited_us"],
                      "sndbuf_limited_us": info1["sndbuf_limited_us"] - info0["sndbuf_limited_us"]}), flush=True)
"""

PORT = 5201


def _probe(cluster, rank, *args):
    return cluster.popen(rank, [sys.executable, "-c", PROBE] + [str(a) for a in args], stdout=subprocess.PIPE,
                         text=True)


def _finish(proc, what, timeout):
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise ec.ClusterError(f"calibration: {what} did not finish within {timeout:.0f} s")
    if proc.returncode != 0:
        raise ec.ClusterError(f"calibration: {what} exited with status {proc.returncode}")
    return json.loads(out.strip().splitlines()[-1]) if out.strip() else {}


def measure_rtt(cluster, round_trips=30, timeout=120.0):
    """Round-trip times (seconds) of one byte over TCP from host 0 to host 1 and back."""
    server = _probe(cluster, cluster.ranks_of(1)[0], "echo-server", PORT)
    client = _probe(cluster, 0, "echo-client", cluster.address(1), PORT, round_trips)
    rtts = _finish(client, "the echo client", timeout)["rtts"]
    _finish(server, "the echo server", timeout)
    return rtts


def cpu_seconds(pid):
    """CPU time a process has used: /proc/<pid>/schedstat (ns), else /proc/<pid>/stat (ticks)."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def payload_share(mss):
    """The share of a link's rate left for data in full frames: MSS / (MSS + 66 header bytes)."""
    return mss / (mss + 66)


def measure_stream(cluster, seconds=5.0, warmup=1.0, timeout=None):
    """One TCP stream from host 0 to host 1: the probe's figures over the last `seconds`
    (seconds, acked_bytes, tx_bytes of host 0's NIC, snd_wnd_max, sndbuf_max, mss, retrans,
    busy/rwnd/sndbuf-limited microseconds) and
    line_cpu_seconds, the CPU time of every delay line over the same span."""
    timeout = timeout or 10 * (seconds + warmup) + 30
    sink = _probe(cluster, cluster.ranks_of(1)[0], "sink", PORT + 1)
    sender = _probe(cluster, 0, "stream", cluster.address(1), PORT + 1, warmup, seconds)
    pids = [line.proc.pid for line in cluster.delay_lines if line.proc is not None]
    first = sender.stdout.readline()
    if first.strip() != "warm":
        sender.kill()
        sink.kill()
        raise ec.ClusterError(f"calibration: the stream did not start (printed {first.strip()!r})")
    cpu0 = sum(cpu_seconds(p) for p in pids)
    result = _finish(sender, "the stream", timeout)
    result["line_cpu_seconds"] = sum(cpu_seconds(p) for p in pids) - cpu0
    received = _finish(sink, "the sink", timeout)
    result["received"] = received.get("received", 0)
    return result


def calibrate(network, host_tcp="stock", seconds=5.0, warmup=1.0, round_trips=30):
    """Measures `network` between two emulated hosts: a dict of figures and verdicts."""
    link = ec.parse_link(network)
    with ec.EmulatedCluster(hosts=2, network=network, host_tcp=host_tcp) as cluster:
        tcp = cluster.tcp_summary()
        method = ("delay line" if cluster.delay_lines else "netem" if cluster._netem else "none")
        rtts = measure_rtt(cluster, round_trips)
        stream = measure_stream(cluster, seconds, warmup)
    rtt = statistics.median(rtts)
    target_rtt = 2 * ec.wan_link.seconds(link.delay) if link.delay else None
    rate = stream["acked_bytes"] * 8 / stream["seconds"]
    link_bps = ec.rate_bits_per_second(link.rate) * payload_share(stream["mss"]) if link.rate else None
    window = min(stream["snd_wnd_max"], stream["sndbuf_max"])
    window_bound = window * 8 / rtt if rtt > 0 else float("inf")
    busy = max(stream["busy_us"], 1)
    rwnd_share, sndbuf_share = stream["rwnd_limited_us"] / busy, stream["sndbuf_limited_us"] / busy
    window_allows = link_bps is not None and window_bound > link_bps and max(rwnd_share, sndbuf_share) <= 0.05
    return {
        "network": network, "method": method, "tcp": tcp,
        "rtt_median": rtt, "rtt_min": min(rtts), "rtt_target": target_rtt,
        # Jitter that never reorders lengthens the mean delay, and loss makes TCP back off below
        # the link rate by design: the targets are for a delay alone.
        "rtt_ok": None if target_rtt is None or link.jitter else abs(rtt - target_rtt) <= 0.1 * target_rtt,
        "rate": rate, "link_bps": link_bps, "window_bound": window_bound,
        "rwnd_limited": rwnd_share, "sndbuf_limited": sndbuf_share, "window_allows": window_allows,
        "rate_ok": (abs(rate - link_bps) <= 0.05 * link_bps) if window_allows and not (link.loss or link.jitter)
        else None,
        "retrans": stream["retrans"],
        "line_core_per_gbit": (stream["line_cpu_seconds"] / stream["seconds"]) / (rate / 1e9) if rate > 0 else None,
    }


def _verdict(ok):
    return "n/a" if ok is None else "ok" if ok else "MISSED"


def _mbit(bps):
    return "-" if bps is None else f"{bps / 1e6:.1f} Mb/s"


def format_table(results):
    """The calibration table (a header, one row per network), as calibrate prints it."""
    rows = [("network", "method", "RTT median", "2 x delay", "RTT", "goodput", "link data", "window bnd",
             "rwnd/sndbuf-lim", "rate", "retr", "line CPU")]
    for r in results:
        rows.append((
            r["network"], r["method"], f"{r['rtt_median'] * 1e3:.1f} ms",
            "-" if r["rtt_target"] is None else f"{r['rtt_target'] * 1e3:.1f} ms", _verdict(r["rtt_ok"]),
            _mbit(r["rate"]), _mbit(r["link_bps"]), _mbit(r["window_bound"]),
            f"{100 * r['rwnd_limited']:.0f}% / {100 * r['sndbuf_limited']:.0f}%", _verdict(r["rate_ok"]),
            str(r["retrans"]),
            "-" if r["line_core_per_gbit"] is None or r["method"] != "delay line"
            else f"{100 * r['line_core_per_gbit']:.0f}% core/Gb/s"))
    widths = [34, 10, 10, 9, 6, 12, 11, 12, 15, 6, 5, 17]
    return "\n".join(" ".join(f"{cell:<{w}}" if i < 2 else f"{cell:>{w}}" for i, (cell, w) in enumerate(zip(row, widths)))
                     for row in rows)


DEFAULT_NETWORKS = ["rate=100mbit,delay=25ms", "rate=100mbit,delay=50ms",
                    "rate=1gbit,delay=25ms", "rate=1gbit,delay=50ms"]


def main(argv):
    """`calibrate [--network SPEC]... [--host-tcp stock|machine] [--seconds S]`; returns an exit status
    (1 where a target was missed)."""
    import argparse
    parser = argparse.ArgumentParser(prog="emulated_cluster.py calibrate",
                                     description="RTT, long-transfer rate and delay-line CPU between two emulated hosts.")
    parser.add_argument("--network", action="append", default=None,
                        help="a preset or rate=..,delay=..[,jitter=..,loss=..]; repeat for several "
                             f"(default: {' '.join(DEFAULT_NETWORKS)})")
    parser.add_argument("--host-tcp", choices=["stock", "machine"], default="stock")
    parser.add_argument("--seconds", type=float, default=5.0, help="measured part of the stream (after 1 s)")
    args = parser.parse_args(argv)
    results = []
    for network in args.network or DEFAULT_NETWORKS:
        ec.parse_link(network)
        results.append(calibrate(network, args.host_tcp, args.seconds))
        if len(results) == 1:
            print(results[0]["tcp"])
        print(format_table(results[-1:]).splitlines()[-1] if len(results) > 1 else format_table(results), flush=True)
    print("targets (a delay alone; n/a with jitter or loss): median RTT within 10% of 2 x delay; goodput within "
          "5% of the link's data rate (rate x MSS/(MSS+66)) where the window allows it (bound above it, <= 5% of "
          "the time window-limited); line CPU: both hosts' delay lines, share of one core per Gbit/s of goodput")
    missed = [r["network"] for r in results if r["rtt_ok"] is False or r["rate_ok"] is False]
    if missed:
        print(f"missed a target: {', '.join(missed)}")
    return 1 if missed else 0
