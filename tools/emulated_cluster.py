#!/usr/bin/env python3
"""An emulated cluster on one machine: each rank is its own "host" in a network namespace.

Topology (docs/benchmarks.md, "The emulated network"); namespaces are named
gcc<pid>-<token>-hub and gcc<pid>-<token>-r<rank>:

    namespace <prefix>-r0 ... <prefix>-r{n-1}      namespace <prefix>-hub
      ve0  198.18.0.1/15  ----------- veth -----------  p0 \
      ve1  198.18.0.2/15  ----------- veth -----------  p1  +- bridge br0
      ...                                               ...  /

Addresses come from 198.18.0.0/15 (RFC 2544's benchmarking range) and exist only inside these
namespaces; nothing leaves the machine. A network preset shapes every host's link in both
directions like a full-duplex NIC: the rank's egress (upload) on `ve<r>` and the switch port's
egress towards the host (download) on `p<r>`, each with `tbf` at the link rate; a preset's
delay is added with `netem` on the rank's egress only (one-way host-to-host latency = delay).

Every namespace is removed when the cluster closes: on normal exit, on an exception, on Ctrl-C
and on SIGTERM/SIGHUP (rank processes are killed first). Names carry this process's pid and a
random token, so concurrent runs never collide; `cleanup` removes leftovers of runs that were
killed with SIGKILL.

Command line (runs one command per rank inside its namespace, then prints bytes sent):

    tools/emulated_cluster.py [--ranks 4] [--network 1gbit] -- python3 my_script.py
    tools/emulated_cluster.py presets
    tools/emulated_cluster.py cleanup

With --hostnames (hostnames=True) every rank is a host named host<r> (a UTS namespace per
process, and /etc/netns/<ns>/hosts that resolves every host's name to its address, as a
cluster's DNS would); with --no-interface-env (interface_env=False) no interface variable is set.

Each rank's command gets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR (rank 0's address, or host0),
MASTER_PORT, GLOO_SOCKET_IFNAME (its veth, so Gloo binds that interface; not with
--no-interface-env) and
GOSSIPCC_NETNS_IFACE (the same name, for reading /sys/class/net/<iface>/statistics/tx_bytes
from inside the rank: `ip netns exec` mounts the namespace's own sysfs).

Needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) and iproute2 (`ip`, `tc`); where that is missing
the cluster raises NamespacesUnavailable with the reason. Kernels without sch_netem (this
project's CI machine) refuse the delay presets with a ClusterError saying so.

For Python callers: EmulatedCluster (above), LocalCluster (the same run() over loopback, no
namespaces), rank_tx_bytes() (inside a rank: its NIC's tx counter).
"""
import argparse
import contextlib
import os
import random
import re
import secrets
import shutil
import socket
import signal
import subprocess
import sys
import threading
import time

NAME_PREFIX = "gcc"
ADDRESS_BASE = (198, 18)  # 198.18.0.0/15: benchmarking range (RFC 2544), only inside namespaces
PREFIX_LEN = 15
MAX_RANKS = 250
MASTER_PORT = 29500  # each cluster has its own address space: a fixed port cannot collide


class NamespacesUnavailable(RuntimeError):
    """Network namespaces cannot be made here; the message says why."""


class ClusterError(RuntimeError):
    """A rank failed, timed out, or the cluster could not be set up."""


# name: (rate, one-way delay). Rates are tc syntax; None = not shaped.
PRESETS = {
    "none": (None, None),
    "10gbit": ("10gbit", None),
    "1gbit": ("1gbit", None),
    "100mbit": ("100mbit", None),
    "1gbit-wan": ("1gbit", "10ms"),
    "100mbit-wan": ("100mbit", "20ms"),
}

_RATE_RE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit)$")
_DELAY_RE = re.compile(r"^(\d+(?:\.\d+)?)(us|ms|s)$")
_RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}


def log_tails(paths, lines=15):
    """The last `lines` lines of each rank's log file, as one text to append to an error."""
    text = ""
    for rank, path in enumerate(paths):
        with open(path) as f:
            tail = f.read().strip().splitlines()[-lines:]
        if tail:
            text += f"\n--- rank {rank} ({path}), last lines:\n" + "\n".join(tail)
    return text


def parse_network(spec):
    """A preset name or "rate=<tc rate>[,delay=<tc time>]" -> (rate or None, delay or None)."""
    if spec in PRESETS:
        return PRESETS[spec]
    rate = delay = None
    for part in spec.split(","):
        key, _, value = part.partition("=")
        if key == "rate" and _RATE_RE.match(value):
            rate = value
        elif key == "delay" and _DELAY_RE.match(value):
            delay = value
        else:
            raise ValueError(
                f"network {spec!r}: expected one of {', '.join(PRESETS)} or "
                f"'rate=<N>{{bit,kbit,mbit,gbit}}[,delay=<N>{{us,ms,s}}]'; bad part {part!r}")
    if rate is None and delay is None:
        raise ValueError(f"network {spec!r}: names neither a rate nor a delay")
    return rate, delay


def rate_bits_per_second(rate):
    """"1gbit" -> 1e9."""
    m = _RATE_RE.match(rate)
    if not m:
        raise ValueError(f"bad rate {rate!r}")
    return float(m.group(1)) * _RATE_UNITS[m.group(2)]


def _run(cmd, what):
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise ClusterError(f"{what}: `{' '.join(cmd)}` failed (exit {proc.returncode}): "
                           f"{proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


def check_namespaces_allowed():
    """Raises NamespacesUnavailable saying why this process cannot make network namespaces."""
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise NamespacesUnavailable(
                f"`{tool}` not found: the emulated cluster needs iproute2 (apt-get install iproute2)")
    if os.geteuid() != 0:
        raise NamespacesUnavailable(
            f"not root (euid {os.geteuid()}): making network namespaces needs root "
            "(CAP_SYS_ADMIN and CAP_NET_ADMIN); run with sudo")
    try:
        with open("/proc/self/status") as f:
            caps = int(next(l for l in f if l.startswith("CapEff:")).split()[1], 16)
        missing = [name for bit, name in ((12, "CAP_NET_ADMIN"), (21, "CAP_SYS_ADMIN")) if not caps >> bit & 1]
        if missing:
            raise NamespacesUnavailable(
                f"root without {' and '.join(missing)} (a restricted container?): "
                "network namespaces and tc need both")
    except (OSError, StopIteration, ValueError):
        pass  # no /proc status: let `ip netns add` decide


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def list_namespaces():
    out = subprocess.run(["ip", "netns", "list"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                         text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def cleanup_stale():
    """Removes namespaces left by runs whose process is gone (killed with SIGKILL). Returns them."""
    removed = []
    for ns in list_namespaces():
        m = re.match(rf"^{NAME_PREFIX}(\d+)-[0-9a-f]{{4}}-", ns)
        if m and not _pid_alive(int(m.group(1))):
            subprocess.run(["ip", "netns", "del", ns], stderr=subprocess.DEVNULL)
            shutil.rmtree(f"/etc/netns/{ns}", ignore_errors=True)
            removed.append(ns)
    return removed


class _Signals:
    """Turns SIGINT/SIGTERM/SIGHUP into KeyboardInterrupt while a cluster is up, so `finally`
    cleans up (SIGINT too: a shell starts background jobs with SIGINT ignored). Inside
    `deferred()` (a rank's process being started and recorded) the interrupt waits until the
    block ends: raised between the fork and the record, it would leave a rank nobody kills,
    holding the cluster's output pipes open."""

    _deferring = False
    _pending = None  # the signal that arrived while deferring

    def __init__(self):
        self.saved = {}

    @classmethod
    @contextlib.contextmanager
    def deferred(cls):
        cls._deferring = True
        try:
            yield
        finally:
            cls._deferring = False
            signum, cls._pending = cls._pending, None
            if signum is not None:
                raise KeyboardInterrupt(f"signal {signum}")

    def install(self):
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            self.saved[sig] = signal.signal(sig, self._raise)

    @classmethod
    def _raise(cls, signum, frame):
        if cls._deferring:
            cls._pending = signum
            return
        raise KeyboardInterrupt(f"signal {signum}")

    def restore(self):
        for sig, handler in self.saved.items():
            signal.signal(sig, handler)
        self.saved.clear()


class EmulatedCluster:
    """n hosts in network namespaces on one bridge, links shaped by `network`.

        with EmulatedCluster(4, "1gbit") as cluster:
            results = cluster.run([[sys.executable, "train.py"]] * 4)
            print(results.tx_bytes)
    """

    def __init__(self, n, network="none", quiet=True, hostnames=False, interface_env=True):
        """hostnames: each rank's namespace is a host with a name of its own, host<r> (a UTS
        namespace per rank process), which every host resolves (/etc/netns/<ns>/hosts, which
        `ip netns exec` mounts over /etc/hosts) to that host's address, as a real cluster's
        DNS or hosts file does; MASTER_ADDR is then host0. interface_env: whether each rank's
        command gets GLOO_SOCKET_IFNAME (False: nothing tells a backend which interface to use,
        as on a cluster launched the plain torch way)."""
        if not 1 <= n <= MAX_RANKS:
            raise ValueError(f"ranks must be in 1..{MAX_RANKS}, got {n}")
        self.n = n
        self.hostnames = hostnames
        self.interface_env = interface_env
        self.network = network
        self.rate, self.delay = parse_network(network)
        self.name = f"{NAME_PREFIX}{os.getpid()}-{secrets.token_hex(2)}"
        self.hub = f"{self.name}-hub"
        self.quiet = quiet
        self._made = []
        self._procs = []
        self._signals = _Signals()

    # --- names -------------------------------------------------------------------------------
    def netns(self, rank):
        return f"{self.name}-r{rank}"

    @staticmethod
    def iface(rank):
        return f"ve{rank}"

    def address(self, rank):
        return f"{ADDRESS_BASE[0]}.{ADDRESS_BASE[1]}.0.{rank + 1}"

    @staticmethod
    def hostname(rank):
        return f"host{rank}"

    def env(self, rank, port=MASTER_PORT):
        env = {
            "RANK": str(rank), "WORLD_SIZE": str(self.n), "LOCAL_RANK": "0",
            "MASTER_ADDR": self.hostname(0) if self.hostnames else self.address(0), "MASTER_PORT": str(port),
            "GOSSIPCC_NETNS_IFACE": self.iface(rank), "GOSSIPCC_NETWORK": self.network,
        }
        if self.interface_env:
            env["GLOO_SOCKET_IFNAME"] = self.iface(rank)
        return env

    def hosts_file(self, names=True):
        """/etc/hosts of every host: localhost, and (names) each host's name and address."""
        lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
        if names:
            lines += [f"{self.address(r)}\t{self.hostname(r)}" for r in range(self.n)]
        return "\n".join(lines) + "\n"

    def write_hosts_file(self, rank, names=True):
        """Writes rank's namespace's /etc/hosts (as mounted by `ip netns exec`)."""
        directory = f"/etc/netns/{self.netns(rank)}"
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "hosts"), "w") as f:
            f.write(self.hosts_file(names))

    # --- set-up / tear-down --------------------------------------------------------------------
    def __enter__(self):
        check_namespaces_allowed()
        self._signals.install()
        try:
            self._setup()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def _add_netns(self, ns):
        proc = subprocess.run(["ip", "netns", "add", ns], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if proc.returncode != 0:
            raise NamespacesUnavailable(f"`ip netns add {ns}` was refused: {proc.stderr.strip()} "
                                        "(network namespaces are not allowed here)")
        self._made.append(ns)

    def _setup(self):
        self._add_netns(self.hub)
        _run(["ip", "netns", "exec", self.hub, "sh", "-c",
              "echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6; "
              "echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6"], "sysctl of the hub")
        _run(["ip", "-n", self.hub, "link", "add", "br0", "type", "bridge"], "bridge")
        _run(["ip", "-n", self.hub, "link", "set", "br0", "up"], "bridge")
        for r in range(self.n):
            ns, ve, port = self.netns(r), self.iface(r), f"p{r}"
            self._add_netns(ns)
            # No IPv6: its neighbour discovery would add stray bytes to the tx counters.
            _run(["ip", "netns", "exec", ns, "sh", "-c",
                  "echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6; "
                  "echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6"], f"sysctl of rank {r}")
            _run(["ip", "-n", self.hub, "link", "add", port, "type", "veth", "peer", "name", ve, "netns", ns],
                 f"veth for rank {r}")
            _run(["ip", "-n", self.hub, "link", "set", port, "master", "br0", "up"], f"bridge port {port}")
            _run(["ip", "-n", ns, "addr", "add", f"{self.address(r)}/{PREFIX_LEN}", "dev", ve], f"address of rank {r}")
            _run(["ip", "-n", ns, "link", "set", ve, "up"], f"link of rank {r}")
            _run(["ip", "-n", ns, "link", "set", "lo", "up"], f"loopback of rank {r}")
            self._shape(ns, ve, self.delay)   # upload (+ latency)
            self._shape(self.hub, port, None)  # download
            if self.hostnames:
                self.write_hosts_file(r)
        self._wait_reachable()

    def _shape(self, ns, dev, delay):
        if self.rate is None and delay is None:
            return
        tc = ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev]
        parent = ["root"]
        if delay is not None:
            proc = subprocess.run(tc + ["root", "handle", "1:", "netem", "delay", delay, "limit", "100000"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            if proc.returncode != 0:
                unknown = "unknown" in proc.stderr
                raise ClusterError(
                    f"cannot add a delay of {delay} on {dev}: " +
                    ("this kernel has no netem qdisc (CONFIG_NET_SCH_NETEM), so network presets with a "
                     "delay cannot run here; use a rate-only preset (" +
                     ", ".join(k for k, v in PRESETS.items() if v[1] is None) + ")"
                     if unknown else proc.stderr.strip()))
            parent = ["parent", "1:1"]
        if self.rate is not None:
            bps = rate_bits_per_second(self.rate)
            # Bucket: >= 1 ms at line rate and >= one 64 KB GSO segment, else tbf drops or stalls
            # large segments; queue: 50 ms at line rate, like a switch port buffer.
            burst = max(64 * 1024, int(bps / 8 * 1e-3))
            _run(tc + parent + ["handle", "10:", "tbf", "rate", self.rate, "burst", str(burst),
                                "latency", "50ms"], f"tbf on {dev}")

    def _wait_reachable(self, timeout=10.0):
        """Waits until every veth end reports carrier (operstate UP); with STP off (the default)
        bridge ports forward as soon as they are up."""
        deadline = time.monotonic() + timeout
        pending = [(self.netns(r), self.iface(r)) for r in range(self.n)] + \
                  [(self.hub, f"p{r}") for r in range(self.n)]
        while pending:
            pending = [(ns, dev) for ns, dev in pending
                       if "state UP" not in _run(["ip", "-n", ns, "link", "show", dev], "link state")]
            if not pending:
                break
            if time.monotonic() > deadline:
                raise ClusterError(f"links {pending} not up after {timeout:.0f}s")
            time.sleep(0.05)

    def close(self):
        """Kills rank processes still running, then deletes every namespace (idempotent)."""
        self.kill_all()
        for ns in reversed(self._made):
            subprocess.run(["ip", "netns", "del", ns], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            shutil.rmtree(f"/etc/netns/{ns}", ignore_errors=True)
        self._made.clear()
        self._signals.restore()

    # --- measurements --------------------------------------------------------------------------
    def tx_bytes(self, rank):
        """Bytes the rank's NIC has sent (the veth's tx_bytes counter: frames incl. headers)."""
        out = _run(["ip", "netns", "exec", self.netns(rank), "cat",
                    f"/sys/class/net/{self.iface(rank)}/statistics/tx_bytes"], "tx counter")
        return int(out.strip())

    def all_tx_bytes(self):
        return [self.tx_bytes(r) for r in range(self.n)]

    # --- running -------------------------------------------------------------------------------
    def popen(self, rank, cmd, env=None, **kwargs):
        """Starts `cmd` inside rank's namespace with the rank environment (plus `env`)."""
        full_env = dict(os.environ)
        if not self.interface_env:
            for name in ("GLOO_SOCKET_IFNAME", "GOSSIPCC_SOCKET_IFNAME", "GOSSIPCC_HOSTNAME"):
                full_env.pop(name, None)
        full_env.update(self.env(rank))
        full_env.update(env or {})
        prefix = ["ip", "netns", "exec", self.netns(rank)]
        if self.hostnames:
            # A UTS namespace of its own: the process and its children see host<r> as this
            # host's name (gethostname), as on a real host.
            prefix += ["unshare", "--uts", "sh", "-c", f'hostname {self.hostname(rank)} && exec "$@"', "sh"]
        with _Signals.deferred():  # recorded before an interrupt can unwind, so kill_all stops it
            proc = subprocess.Popen(prefix + list(cmd), env=full_env, start_new_session=True, **kwargs)
            self._procs.append(proc)
        return proc

    def kill_all(self):
        for p in self._procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 5
        for p in self._procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
        self._procs.clear()

    def run(self, cmds, env=None, timeout=None, stdout=None, stderr=None):
        """Runs cmds[r] in rank r's namespace; waits for all. A failing rank stops the others.

        stdout/stderr: a list of file objects by rank (None: inherit). Returns RunResult.
        Raises ClusterError naming the first rank that failed or the timeout.
        """
        if len(cmds) != self.n:
            raise ValueError(f"{len(cmds)} commands for {self.n} ranks")
        before = self.all_tx_bytes()
        start = time.monotonic()
        procs = [self.popen(r, cmds[r], env=(env[r] if isinstance(env, list) else env),
                            stdout=stdout[r] if stdout else None, stderr=stderr[r] if stderr else None)
                 for r in range(self.n)]
        failed = None
        while True:
            codes = [p.poll() for p in procs]
            bad = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
            if bad:
                failed = f"rank {bad[0][0]} exited with status {bad[0][1]}"
                break
            if all(c == 0 for c in codes):
                break
            if timeout is not None and time.monotonic() - start > timeout:
                running = [r for r, c in enumerate(codes) if c is None]
                failed = f"ranks {running} still running after {timeout:.0f}s"
                _ask_for_stacks([procs[r] for r in running])
                break
            time.sleep(0.05)
        wall = time.monotonic() - start
        self.kill_all()
        if failed:
            raise ClusterError(failed)
        after = self.all_tx_bytes()
        return RunResult(wall, [a - b for a, b in zip(after, before)])


def _ask_for_stacks(procs, grace=2.0):
    """SIGUSR1 to hung ranks: a Python rank that registered faulthandler for it (the job's and
    benchmarks' workers do) prints every thread's stack to its log before being killed."""
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass
    time.sleep(grace)


class RunResult:
    def __init__(self, wall_seconds, tx_bytes):
        self.wall_seconds = wall_seconds
        self.tx_bytes = tx_bytes


def free_port():
    """A port for rank 0's store to listen on. Not bind(0)'s pick: that comes from the kernel's
    ephemeral range, where any outgoing connection (another method's, another test's) may take
    it before rank 0 binds it (seen in CI: "Address already in use"). A random free port just
    below that range is never handed out as a connection's source port."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral_low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32768
    low = max(1024, ephemeral_low - 12000)
    for _ in range(200):
        port = random.randint(low, ephemeral_low - 1)
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalCluster:
    """The ranks as local processes on loopback (no namespaces): same interface as the parts of
    EmulatedCluster that the job uses."""

    def __init__(self, n):
        self.n, self.network = n, "local"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def run(self, cmds, env=None, timeout=None, stdout=None, stderr=None):
        port = free_port()
        procs = []
        start = time.monotonic()
        try:
            for r in range(self.n):
                e = dict(os.environ, RANK=str(r), WORLD_SIZE=str(self.n), LOCAL_RANK=str(r),
                         MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GOSSIPCC_NETWORK="local")
                e.pop("GOSSIPCC_NETNS_IFACE", None)
                e.update(env or {})
                procs.append(subprocess.Popen(cmds[r], env=e, stdout=stdout[r] if stdout else None,
                                              stderr=stderr[r] if stderr else None, start_new_session=True))
            while True:
                codes = [p.poll() for p in procs]
                bad = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
                if bad:
                    raise ClusterError(f"rank {bad[0][0]} exited with status {bad[0][1]}")
                if all(c == 0 for c in codes):
                    return RunResult(time.monotonic() - start, [None] * self.n)
                if timeout is not None and time.monotonic() - start > timeout:
                    running = [r for r, c in enumerate(codes) if c is None]
                    _ask_for_stacks([procs[r] for r in running])
                    raise ClusterError(f"ranks {running} still running after {timeout:.0f}s")
                time.sleep(0.05)
        finally:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGTERM)
            for p in procs:
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()


def rank_tx_bytes():
    """From inside a rank of an EmulatedCluster: bytes its NIC has sent so far (None elsewhere).
    `ip netns exec` mounts the namespace's own sysfs, so the path names the rank's veth."""
    iface = os.environ.get("GOSSIPCC_NETNS_IFACE")
    if not iface:
        return None
    try:
        with open(f"/sys/class/net/{iface}/statistics/tx_bytes") as f:
            return int(f.read())
    except OSError:
        return None


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Run one command per rank, each rank in its own network namespace (an emulated host).",
        usage="%(prog)s [--ranks N] [--network PRESET|rate=..,delay=..] -- COMMAND...\n"
              "       %(prog)s presets | cleanup")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--network", default="1gbit", help=f"one of {', '.join(PRESETS)} or rate=..,delay=..")
    parser.add_argument("--timeout", type=float, default=None, help="seconds before the ranks are killed")
    parser.add_argument("--hostnames", action="store_true",
                        help="each rank a host named host<r> that every host resolves; MASTER_ADDR=host0")
    parser.add_argument("--no-interface-env", action="store_true",
                        help="set no GLOO_SOCKET_IFNAME (nor pass one through): backends choose their address")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if cmd == ["presets"]:
        for name, (rate, delay) in PRESETS.items():
            print(f"{name:12s} rate={rate or 'unshaped'} delay={delay or '0'}")
        return 0
    if cmd == ["cleanup"]:
        removed = cleanup_stale()
        print(f"removed {len(removed)} stale namespaces" + (f": {' '.join(removed)}" if removed else ""))
        return 0
    if not cmd:
        parser.error("no command given (put it after --)")
    try:
        parse_network(args.network)
        with EmulatedCluster(args.ranks, args.network, hostnames=args.hostnames,
                             interface_env=not args.no_interface_env) as cluster:
            result = cluster.run([cmd] * args.ranks, timeout=args.timeout)
    except (NamespacesUnavailable, ClusterError, ValueError) as e:
        print(f"emulated_cluster: {e}", file=sys.stderr)
        return 2 if isinstance(e, NamespacesUnavailable) else 1
    except KeyboardInterrupt:
        print("emulated_cluster: interrupted; namespaces removed", file=sys.stderr)
        return 130
    print(f"emulated_cluster: {args.ranks} ranks, network {args.network}, {result.wall_seconds:.2f} s")
    for r, b in enumerate(result.tx_bytes):
        print(f"  rank {r}: sent {b} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
