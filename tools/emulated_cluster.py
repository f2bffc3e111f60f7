#!/usr/bin/env python3
"""An emulated cluster on one machine: hosts in network namespaces, one or more ranks on each.

Topology (docs/benchmarks.md, "The emulated network"); namespaces are named
gcc<pid>-<token>-hub and gcc<pid>-<token>-h<host>:

    namespace <prefix>-h0 ... <prefix>-h{H-1}      namespace <prefix>-hub
      ve0  198.18.0.1/15  ----------- veth -----------  p0 \
      ve1  198.18.0.2/15  ----------- veth -----------  p1  +- bridge br0
      ...                                               ...  /

Addresses come from 198.18.0.0/15 (RFC 2544's benchmarking range) and exist only inside these
namespaces; nothing leaves the machine. A network preset shapes every host's link in both
directions like a full-duplex NIC: the host's egress (upload) on `ve<h>` and the switch port's
egress towards the host (download) on `p<h>`, each with `tbf` at the link rate. A network's
delay, jitter and loss are added once per packet (one-way host-to-host latency = delay): with
`netem` on the sending host's egress where the kernel has it, else (this project's machines)
with a delay line over NFQUEUE on the receiving host's ingress, inside its namespace
(tools/wan_link.py says why there; tools/delay_line), whose processes and rules are stopped
with the cluster.

The hosts run a stock Linux host's TCP settings (--host-tcp stock, the default: tcp_rmem max
6 MB, tcp_wmem max 4 MB, cubic; set in each host's namespace) or this machine's own
(--host-tcp machine); the command line prints them. net.core.rmem_max/wmem_max cannot be set
per namespace on every kernel (on this project's machines they are machine-wide and read-only
inside a namespace); the printout says where the value in effect differs from a stock host's.

A host runs G ranks (--ranks-per-host, default 1), all in its namespace: they share its shaped
link in both directions, as the GPUs of a node share its NIC, and talk to each other over the
host's own address or its loopback, which the kernel delivers over `lo`: unshaped, and not on
the NIC's counters. Ranks are numbered as torchrun numbers them: host h runs ranks
h*G .. h*G+G-1.

Every namespace is removed when the cluster closes: on normal exit, on an exception, on Ctrl-C
and on SIGTERM/SIGHUP (rank processes are killed first). Names carry this process's pid and a
random token, so concurrent runs never collide; `cleanup` removes leftovers of runs that were
killed with SIGKILL (processes still inside their namespaces, delay lines, the namespaces).

Command line (runs one command per rank on its host, then prints the bytes each host and each
rank sent to other hosts):

    tools/emulated_cluster.py [--hosts 4] [--ranks-per-host 2] [--network 1gbit] -- python3 my_script.py
    tools/emulated_cluster.py --ranks 4 -- ...   (4 hosts of one rank: --hosts 4 --ranks-per-host 1)
    tools/emulated_cluster.py presets
    tools/emulated_cluster.py cleanup
    tools/emulated_cluster.py calibrate [--network SPEC]...   (RTT, rate and delay-line CPU, 2 hosts)

With --hostnames (hostnames=True) every host is named host<h> (a UTS namespace per rank
process, and /etc/netns/<ns>/hosts that resolves every host's name to its address, as a
cluster's DNS would); with --no-interface-env (interface_env=False) no interface variable is set.

Each rank's command gets what torchrun gives a worker: RANK, WORLD_SIZE (H x G), LOCAL_RANK,
LOCAL_WORLD_SIZE (G), GROUP_RANK (its host), GROUP_WORLD_SIZE (H), ROLE_RANK, ROLE_WORLD_SIZE,
ROLE_NAME, MASTER_ADDR (host 0's address, or host0), MASTER_PORT; and GLOO_SOCKET_IFNAME (its
host's veth, so Gloo binds that interface; not with --no-interface-env) and GOSSIPCC_NETNS_IFACE
(the same name, for reading /sys/class/net/<iface>/statistics/tx_bytes from inside the rank:
`ip netns exec` mounts the namespace's own sysfs).

Bytes: a host's are its veth's tx_bytes counter. With one rank per host a rank's are its host's;
with several, each rank runs in a cgroup of its own and an iptables rule on its host's NIC
(raw table, `-m cgroup`) counts what that rank's sockets send there. Where cgroup2, iptables or
xt_cgroup is missing, ranks' own bytes are not counted (the run says why); hosts' still are.

Needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) and iproute2 (`ip`, `tc`); where that is missing
the cluster raises NamespacesUnavailable with the reason. A delay, jitter or loss on a kernel
without sch_netem needs iptables, the NFQUEUE target and the built delay line (`bazel build
//tools/delay_line`); where one is missing the cluster raises ClusterError naming it.

For Python callers: EmulatedCluster (above), LocalCluster (the same arguments and run() over
loopback, no namespaces), rank_tx_bytes() and host_tx_bytes() (inside a rank: its own and its
host's bytes sent so far).
"""
import argparse
import collections
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

import wan_link

NAME_PREFIX = "gcc"
ADDRESS_BASE = (198, 18)  # 198.18.0.0/15: benchmarking range (RFC 2544), only inside namespaces
PREFIX_LEN = 15
MAX_HOSTS = 250
MASTER_PORT = 29500  # each cluster has its own address space: a fixed port cannot collide
# A stock Debian/Ubuntu host's TCP (--host-tcp stock): set in each host's namespace.
STOCK_TCP = {"net.ipv4.tcp_rmem": "4096 131072 6291456", "net.ipv4.tcp_wmem": "4096 16384 4194304",
             "net.ipv4.tcp_congestion_control": "cubic"}
STOCK_SOCKET_MAX = 212992  # a stock host's net.core.rmem_max and wmem_max


class NamespacesUnavailable(RuntimeError):
    """Network namespaces cannot be made here; the message says why."""


class ClusterError(RuntimeError):
    """A rank failed, timed out, or the cluster could not be set up."""


# name: (rate, one-way delay). Rates are tc syntax; None = not shaped. parse_link reads these
# and "rate=..,delay=..,jitter=..,loss=..".
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
_LOSS_RE = re.compile(r"^(\d+(?:\.\d+)?)%$")
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


# A host's link: rate (tc syntax) or None = not shaped; one-way delay and jitter (tc times) or
# None; loss, the fraction of the host's packets dropped (0 = none).
Link = collections.namedtuple("Link", "rate delay jitter loss")
_SPEC_SYNTAX = ("'rate=<N>{bit,kbit,mbit,gbit}[,delay=<N>{us,ms,s}[,jitter=<N>{us,ms,s}]]"
                "[,loss=<N>%]'")


def parse_link(spec):
    """A preset name or "rate=..,delay=..,jitter=..,loss=<percent>%" (any of them, each at most
    once; jitter only with a delay) -> Link. ValueError naming what is wrong."""
    if spec in PRESETS:
        rate, delay = PRESETS[spec]
        return Link(rate, delay, None, 0.0)
    fields = {}
    for part in spec.split(","):
        key, _, value = part.partition("=")
        ok = {"rate": _RATE_RE, "delay": _DELAY_RE, "jitter": _DELAY_RE, "loss": _LOSS_RE}.get(key)
        if ok is None or not ok.match(value):
            raise ValueError(f"network {spec!r}: expected one of {', '.join(PRESETS)} or {_SPEC_SYNTAX}; "
                             f"bad part {part!r}")
        if key in fields:
            raise ValueError(f"network {spec!r}: {key} given twice")
        fields[key] = value
    loss = float(_LOSS_RE.match(fields["loss"]).group(1)) / 100 if "loss" in fields else 0.0
    if not loss < 1:
        raise ValueError(f"network {spec!r}: loss must be below 100%")
    if "jitter" in fields and "delay" not in fields:
        raise ValueError(f"network {spec!r}: jitter needs a delay (delay=<N>ms,jitter=<N>ms)")
    link = Link(fields.get("rate"), fields.get("delay"), fields.get("jitter"), loss)
    if link.rate is None and link.delay is None and not link.loss:
        raise ValueError(f"network {spec!r}: names neither a rate, a delay nor a loss")
    return link


def parse_network(spec):
    """A preset name or a link spec (parse_link) -> (rate or None, delay or None)."""
    link = parse_link(spec)
    return link.rate, link.delay


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


def _stale(name):
    """Whether a namespace (or delay line) name is of a run whose process is gone."""
    m = re.match(rf"^{NAME_PREFIX}(\d+)-[0-9a-f]{{4}}-", name)
    return bool(m) and not _pid_alive(int(m.group(1)))


def cleanup_stale(among=None):
    """Removes what runs killed with SIGKILL left: their delay lines, the processes still inside
    their namespaces (ranks), and the namespaces. `among`, if given, limits it to those names.
    Returns the namespaces removed."""
    among = None if among is None else set(among)

    def doomed(name):
        return _stale(name) and (among is None or name in among)

    for pid in wan_link.stray_processes(doomed):  # a line exits by itself once its parent is gone
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    removed = []
    for ns in list_namespaces():
        if doomed(ns):
            pids = subprocess.run(["ip", "netns", "pids", ns], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                  text=True).stdout.split()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
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
    """`hosts` hosts in network namespaces on one bridge, `ranks_per_host` ranks on each, every
    host's link shaped by `network`.

        with EmulatedCluster(hosts=4, ranks_per_host=2, network="1gbit") as cluster:
            results = cluster.run([[sys.executable, "train.py"]] * cluster.n)
            print(results.host_tx_bytes, results.tx_bytes)

    EmulatedCluster(n, network) is n hosts of one rank each.
    """

    def __init__(self, n=None, network="none", quiet=True, hostnames=False, interface_env=True,
                 hosts=None, ranks_per_host=1, host_tcp="stock"):
        """n: the number of ranks (the world size), hosts x ranks_per_host; give n or hosts (or
        both, if they agree). hostnames: each host has a name of its own, host<h> (a UTS
        namespace per rank process), which every host resolves (/etc/netns/<ns>/hosts, which
        `ip netns exec` mounts over /etc/hosts) to that host's address, as a real cluster's
        DNS or hosts file does; MASTER_ADDR is then host0. interface_env: whether each rank's
        command gets GLOO_SOCKET_IFNAME (False: nothing tells a backend which interface to use,
        as on a cluster launched the plain torch way). host_tcp: "stock" (a stock Linux host's
        TCP buffers and congestion control in every host, STOCK_TCP) or "machine" (this
        machine's own); tcp_summary() says what the hosts run."""
        self.hosts, self.ranks_per_host = hosts_and_ranks(n, hosts, ranks_per_host)
        self.n = self.hosts * self.ranks_per_host
        self.hostnames = hostnames
        self.interface_env = interface_env
        self.network = network
        self.link = parse_link(network)
        self.rate, self.delay = self.link.rate, self.link.delay
        if host_tcp not in ("stock", "machine"):
            raise ValueError(f"host_tcp must be 'stock' or 'machine', got {host_tcp!r}")
        self.host_tcp = host_tcp
        self.delay_lines = []  # wan_link.DelayLine per host, where the kernel has no netem
        self.delay_line_counters = []  # their counters, once stopped
        self._netem = None  # whether the kernel has sch_netem (None: not tried yet)
        self.name = f"{NAME_PREFIX}{os.getpid()}-{secrets.token_hex(2)}"
        self.hub = f"{self.name}-hub"
        self.quiet = quiet
        self._made = []
        self._procs = []
        self._signals = _Signals()
        self._cgroup = None  # this cluster's cgroup directory (per-rank counters), when made
        # Why ranks' own bytes cannot be counted here (None: they can, or one rank per host).
        self.rank_counters_unavailable = None

    # --- names -------------------------------------------------------------------------------
    def host_of(self, rank):
        """The host (GROUP_RANK) that rank runs on: ranks 0..G-1 on host 0, and so on."""
        if not 0 <= rank < self.n:
            raise ValueError(f"rank {rank} is not in 0..{self.n - 1}")
        return rank // self.ranks_per_host

    def local_rank(self, rank):
        return rank % self.ranks_per_host

    def ranks_of(self, host):
        return list(range(host * self.ranks_per_host, (host + 1) * self.ranks_per_host))

    def netns(self, host):
        return f"{self.name}-h{host}"

    @staticmethod
    def iface(host):
        return f"ve{host}"

    def address(self, host):
        return f"{ADDRESS_BASE[0]}.{ADDRESS_BASE[1]}.0.{host + 1}"

    @staticmethod
    def hostname(host):
        return f"host{host}"

    def env(self, rank, port=MASTER_PORT):
        """The variables torchrun gives a worker (one role, "default"), and the emulator's own."""
        host = self.host_of(rank)
        env = rank_environment(rank, self.hosts, self.ranks_per_host,
                               self.hostname(0) if self.hostnames else self.address(0), port)
        env.update({"GOSSIPCC_NETNS_IFACE": self.iface(host), "GOSSIPCC_NETWORK": self.network})
        if self.interface_env:
            env["GLOO_SOCKET_IFNAME"] = self.iface(host)
        return env

    def hosts_file(self, names=True):
        """/etc/hosts of every host: localhost, and (names) each host's name and address."""
        lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
        if names:
            lines += [f"{self.address(h)}\t{self.hostname(h)}" for h in range(self.hosts)]
        return "\n".join(lines) + "\n"

    def write_hosts_file(self, host, names=True):
        """Writes host's namespace's /etc/hosts (as mounted by `ip netns exec`)."""
        directory = f"/etc/netns/{self.netns(host)}"
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
        for h in range(self.hosts):
            ns, ve, port = self.netns(h), self.iface(h), f"p{h}"
            self._add_netns(ns)
            # No IPv6: its neighbour discovery would add stray bytes to the tx counters.
            _run(["ip", "netns", "exec", ns, "sh", "-c",
                  "echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6; "
                  "echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6"], f"sysctl of host {h}")
            _run(["ip", "-n", self.hub, "link", "add", port, "type", "veth", "peer", "name", ve, "netns", ns],
                 f"veth for host {h}")
            _run(["ip", "-n", self.hub, "link", "set", port, "master", "br0", "up"], f"bridge port {port}")
            _run(["ip", "-n", ns, "addr", "add", f"{self.address(h)}/{PREFIX_LEN}", "dev", ve], f"address of host {h}")
            _run(["ip", "-n", ns, "link", "set", ve, "up"], f"link of host {h}")
            _run(["ip", "-n", ns, "link", "set", "lo", "up"], f"loopback of host {h}")
            self._set_host_tcp(ns)
            self._shape(ns, ve, host=True)   # upload; delay, jitter, loss
            self._shape(self.hub, port, host=False)  # download
            if self.hostnames:
                self.write_hosts_file(h)
        self._wait_reachable()
        self._count_ranks()

    def _shape(self, ns, dev, host):
        """tbf at the link rate on `dev`'s egress. On a host's own veth (host=True) also the
        link's delay, jitter and loss: netem on its egress where the kernel has sch_netem (tbf
        below it), else a delay line on its ingress (tools/wan_link.py)."""
        impaired = host and (self.link.delay is not None or self.link.loss > 0)
        tc = ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev]
        parent = ["root"]
        if impaired and self._netem is not False:
            netem = ["netem", "delay", self.link.delay or "0ms"] + ([self.link.jitter] if self.link.jitter else [])
            if self.link.loss > 0:
                netem += ["loss", f"{self.link.loss * 100:g}%"]
            proc = subprocess.run(tc + ["root", "handle", "1:"] + netem + ["limit", "100000"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            if proc.returncode == 0:
                self._netem = True
                parent = ["parent", "1:1"]
            elif "unknown" in proc.stderr:  # no sch_netem (CONFIG_NET_SCH_NETEM)
                self._netem = False
            else:
                raise ClusterError(f"netem on {dev} in {ns}: {proc.stderr.strip()}")
        if impaired and self._netem is False:
            line = wan_link.DelayLine(ns, dev, self.link.delay, self.link.jitter, self.link.loss,
                                      seed=len(self.delay_lines) + 1,
                                      rate_bps=rate_bits_per_second(self.rate) if self.rate else None)
            with _Signals.deferred():  # recorded before an interrupt can unwind, so close() stops it
                self.delay_lines.append(line)
                try:
                    line.start()
                except wan_link.WanLinkError as e:
                    raise ClusterError(f"network {self.network!r}: this kernel has no netem, and a delay "
                                       f"line cannot run: {e}") from None
        if self.rate is not None:
            bps = rate_bits_per_second(self.rate)
            # Bucket: >= 1 ms at line rate and >= one 64 KB GSO segment, else tbf drops or stalls
            # large segments; queue: 50 ms at line rate, like a switch port buffer.
            burst = max(64 * 1024, int(bps / 8 * 1e-3))
            _run(tc + parent + ["handle", "10:", "tbf", "rate", self.rate, "burst", str(burst),
                                "latency", "50ms"], f"tbf on {dev}")

    def _set_host_tcp(self, ns):
        """A stock host's TCP settings in namespace `ns` (host_tcp="stock"). A namespace may only
        choose a congestion control the machine allows (tcp_allowed_congestion_control), so
        cubic is added to that list where missing. net.core.rmem_max/wmem_max are set where the
        kernel lets a namespace set them (tcp_summary says where it does not)."""
        if self.host_tcp != "stock":
            return
        cc = STOCK_TCP["net.ipv4.tcp_congestion_control"]
        with open("/proc/sys/net/ipv4/tcp_available_congestion_control") as f:
            if cc not in f.read().split():
                raise ClusterError(f"this kernel has no {cc} congestion control (tcp_available_congestion_control); "
                                   "use --host-tcp machine (host_tcp='machine')")
        with open("/proc/sys/net/ipv4/tcp_allowed_congestion_control") as f:
            allowed = f.read().split()
        if cc not in allowed:
            with open("/proc/sys/net/ipv4/tcp_allowed_congestion_control", "w") as f:
                f.write(" ".join(allowed + [cc]))
        _run(["ip", "netns", "exec", ns, "sysctl", "-q", "-w"] + [f"{k}={v}" for k, v in STOCK_TCP.items()],
             f"TCP settings of {ns}")
        subprocess.run(["ip", "netns", "exec", ns, "sh", "-c",
                        f"echo {STOCK_SOCKET_MAX} > /proc/sys/net/core/rmem_max && "
                        f"echo {STOCK_SOCKET_MAX} > /proc/sys/net/core/wmem_max"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def tcp_settings(self, host=0):
        """{sysctl name: value} of the TCP settings host `host` runs with."""
        names = list(STOCK_TCP) + ["net.core.rmem_max", "net.core.wmem_max"]
        out = _run(["ip", "netns", "exec", self.netns(host), "sysctl", "-n"] + names, "TCP settings")
        return dict(zip(names, (" ".join(line.split()) for line in out.splitlines())))

    def tcp_summary(self):
        """One line: the TCP settings the hosts run with, and where they differ from a stock host's."""
        t = self.tcp_settings()
        text = (f"hosts' TCP ({self.host_tcp}): tcp_rmem {t['net.ipv4.tcp_rmem']}, tcp_wmem {t['net.ipv4.tcp_wmem']}, "
                f"{t['net.ipv4.tcp_congestion_control']}, rmem_max {t['net.core.rmem_max']}, "
                f"wmem_max {t['net.core.wmem_max']}")
        differ = [k for k, v in STOCK_TCP.items() if t[k] != v] + \
                 [k for k in ("net.core.rmem_max", "net.core.wmem_max") if t[k] != str(STOCK_SOCKET_MAX)]
        if differ:
            why = (" (machine-wide on this kernel, read-only in a namespace)" if self.host_tcp == "stock" and
                   all(k.startswith("net.core.") for k in differ) else "")
            text += f"; differs from a stock host in {', '.join(k.split('.')[-1] for k in differ)}{why}"
        return text

    def _dead_delay_line(self):
        """A message naming a delay line that has exited (its host receives nothing), or None."""
        for line in self.delay_lines:
            if not line.alive():
                line.stop()
                return f"the delay line of {line.netns} exited: {line.output.strip() or 'no message'}"
        return None

    def _stop_delay_lines(self):
        """Stops every delay line (rules removed, processes ended), keeping their counters; warns
        where the kernel dropped packets the link did not ask to drop."""
        for line in self.delay_lines:
            counters = line.stop()
            if counters is not None:
                self.delay_line_counters.append(counters)
                lost = counters.get("kernel_queue_full", 0) + counters.get("kernel_user_dropped", 0)
                if lost:
                    print(f"emulated_cluster: warning: the delay line of {line.netns} lost {lost} packets in the "
                          f"kernel (queue full or undelivered): {line.output.strip()}", file=sys.stderr)
        self.delay_lines = []

    def _count_ranks(self):
        """With several ranks per host: a cgroup per rank, and a counting rule per rank on its
        host's NIC (iptables' raw table, OUTPUT: `-o ve<h> -m cgroup --path <rank's cgroup>`, no
        target), which counts the packets of the sockets that rank's processes made. Where that
        cannot be done (no cgroup2, no iptables, no xt_cgroup), ranks' own bytes are not counted
        and rank_counters_unavailable says why; the hosts' counters are unaffected."""
        if self.ranks_per_host == 1:
            return
        root = cgroup2_root()
        if root is None:
            self.rank_counters_unavailable = "no cgroup2 file system is mounted"
            return
        if shutil.which("iptables") is None:
            self.rank_counters_unavailable = "`iptables` not found (apt-get install iptables)"
            return
        try:
            os.mkdir(os.path.join(root, self.name))
        except OSError as e:
            self.rank_counters_unavailable = f"cannot make a cgroup in {root}: {e}"
            return
        self._cgroup = os.path.join(root, self.name)
        for rank in range(self.n):
            os.mkdir(os.path.join(self._cgroup, f"r{rank}"))
            proc = subprocess.run(["ip", "netns", "exec", self.netns(self.host_of(rank)), "iptables", "-w", "-t", "raw",
                                   "-A", "OUTPUT", "-o", self.iface(self.host_of(rank)),
                                   "-m", "cgroup", "--path", self._rank_cgroup_path(rank)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            if proc.returncode != 0:
                self.rank_counters_unavailable = (f"iptables cannot count packets by cgroup here (xt_cgroup): "
                                                  f"{proc.stderr.strip()}")
                self._remove_cgroup()
                return

    def _rank_cgroup_path(self, rank):
        """The rank's cgroup as iptables' cgroup match names it (from the cgroup2 root)."""
        return f"/{self.name}/r{rank}"

    def _remove_cgroup(self):
        """Kills whatever is left in the ranks' cgroups (a rank's process that left its session
        too), then removes them."""
        if self._cgroup is None:
            return
        remove_cgroup_tree(self._cgroup)
        self._cgroup = None

    def _wait_reachable(self, timeout=10.0):
        """Waits until every veth end reports carrier (operstate UP); with STP off (the default)
        bridge ports forward as soon as they are up."""
        deadline = time.monotonic() + timeout
        pending = [(self.netns(h), self.iface(h)) for h in range(self.hosts)] + \
                  [(self.hub, f"p{h}") for h in range(self.hosts)]
        while pending:
            pending = [(ns, dev) for ns, dev in pending
                       if "state UP" not in _run(["ip", "-n", ns, "link", "show", dev], "link state")]
            if not pending:
                break
            if time.monotonic() > deadline:
                raise ClusterError(f"links {pending} not up after {timeout:.0f}s")
            time.sleep(0.05)

    def close(self):
        """Kills rank processes still running, stops the delay lines, then deletes every namespace
        (idempotent)."""
        self.kill_all()
        self._stop_delay_lines()
        self._remove_cgroup()
        for ns in reversed(self._made):
            subprocess.run(["ip", "netns", "del", ns], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            shutil.rmtree(f"/etc/netns/{ns}", ignore_errors=True)
        self._made.clear()
        self._signals.restore()

    # --- measurements --------------------------------------------------------------------------
    def host_tx_bytes(self, host):
        """Bytes the host's NIC has sent (the veth's tx_bytes counter: frames incl. headers)."""
        out = _run(["ip", "netns", "exec", self.netns(host), "cat",
                    f"/sys/class/net/{self.iface(host)}/statistics/tx_bytes"], "tx counter")
        return int(out.strip())

    def all_host_tx_bytes(self):
        return [self.host_tx_bytes(h) for h in range(self.hosts)]

    def _ranks_tx_bytes(self, host):
        """{rank: bytes} its ranks' sockets have sent through the host's NIC (None: not counted)."""
        if self.ranks_per_host == 1:
            return {host: self.host_tx_bytes(host)}
        if self._cgroup is None:
            return {rank: None for rank in self.ranks_of(host)}
        out = _run(["ip", "netns", "exec", self.netns(host), "iptables", "-w", "-t", "raw", "-nvxL", "OUTPUT"],
                   "per-rank counters")
        counted = _cgroup_counters(out)
        return {rank: counted.get(self._rank_cgroup_path(rank)) for rank in self.ranks_of(host)}

    def tx_bytes(self, rank):
        """Bytes the rank has sent to other hosts. One rank per host: its host's NIC counter.
        Several: the packets its sockets sent out of the host's NIC (IP length plus the 14-byte
        Ethernet header each, counted as they leave the socket layer; their sum is the host's
        counter less ARP and the headers of large segments the shaper splits), or None where
        rank_counters_unavailable says why not."""
        return self._ranks_tx_bytes(self.host_of(rank))[rank]

    def all_tx_bytes(self):
        by_rank = {}
        for h in range(self.hosts):
            by_rank.update(self._ranks_tx_bytes(h))
        return [by_rank[r] for r in range(self.n)]

    # --- running -------------------------------------------------------------------------------
    def popen(self, rank, cmd, env=None, **kwargs):
        """Starts `cmd` inside the namespace of rank's host with the rank environment (plus `env`)."""
        full_env = dict(os.environ)
        if not self.interface_env:
            for name in ("GLOO_SOCKET_IFNAME", "GOSSIPCC_SOCKET_IFNAME", "GOSSIPCC_HOSTNAME"):
                full_env.pop(name, None)
        full_env.update(self.env(rank))
        full_env.update(env or {})
        host = self.host_of(rank)
        prefix = ["ip", "netns", "exec", self.netns(host)]
        if self._cgroup is not None:
            # Into the rank's cgroup first (outside the namespace: `ip netns exec` mounts a sysfs
            # without the cgroup file systems); its children and sockets are the rank's.
            prefix = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"',
                      os.path.join(self._cgroup, f"r{rank}")] + prefix
        if self.hostnames:
            # A UTS namespace of its own: the process and its children see host<h> as this
            # host's name (gethostname), as on a real host.
            prefix += ["unshare", "--uts", "sh", "-c", f'hostname {self.hostname(host)} && exec "$@"', "sh"]
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
        """Runs cmds[r] as rank r on its host; waits for all. A failing rank stops the others.

        stdout/stderr: a list of file objects by rank (None: inherit). Returns RunResult.
        Raises ClusterError naming the first rank that failed or the timeout.
        """
        if len(cmds) != self.n:
            raise ValueError(f"{len(cmds)} commands for {self.n} ranks")
        before = self.all_host_tx_bytes(), self.all_tx_bytes()
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
            failed = self._dead_delay_line()
            if failed:
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
        after = self.all_host_tx_bytes(), self.all_tx_bytes()
        return RunResult(wall, _differences(after[1], before[1]), _differences(after[0], before[0]))


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
    """wall_seconds; tx_bytes by rank and host_tx_bytes by host (bytes sent to other hosts during
    the run; None where not counted)."""

    def __init__(self, wall_seconds, tx_bytes, host_tx_bytes):
        self.wall_seconds = wall_seconds
        self.tx_bytes = tx_bytes
        self.host_tx_bytes = host_tx_bytes


def _differences(after, before):
    return [None if a is None or b is None else a - b for a, b in zip(after, before)]


_COUNTER_RE = re.compile(r"^\s*(\d+)\s+(\d+)\s.*\bcgroup (\S+)\s*$")
ETHERNET_HEADER = 14


def _cgroup_counters(listing):
    """`iptables -nvxL` output -> {cgroup path: bytes}, bytes = IP bytes + an Ethernet header per packet."""
    counted = {}
    for line in listing.splitlines():
        m = _COUNTER_RE.match(line)
        if m:
            counted[m.group(3)] = int(m.group(2)) + ETHERNET_HEADER * int(m.group(1))
    return counted


def cgroup2_root():
    """Where the cgroup2 file system is mounted (/sys/fs/cgroup, or .../unified on a hybrid
    layout), or None."""
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                fields = line.split()
                if len(fields) > 2 and fields[2] == "cgroup2":
                    return fields[1]
    except OSError:
        pass
    return None


def remove_cgroup_tree(path, timeout=5.0):
    """Kills every process in the cgroup `path` and its children (cgroup.kill, else SIGKILL to
    each listed process), then removes them. Returns False if some directory stayed."""
    leaves = sorted((os.path.join(d, s) for d, subdirs, _ in os.walk(path) for s in subdirs),
                    key=len, reverse=True) + [path]
    try:
        with open(os.path.join(path, "cgroup.kill"), "w") as f:
            f.write("1")
    except OSError:  # kernels before 5.14
        for leaf in leaves:
            try:
                with open(os.path.join(leaf, "cgroup.procs")) as f:
                    for pid in f.read().split():
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass
    deadline = time.monotonic() + timeout
    for leaf in leaves:
        while True:
            try:
                os.rmdir(leaf)
                break
            except FileNotFoundError:
                break
            except OSError:  # EBUSY until the killed processes are gone
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.02)
    return True


def cleanup_stale_cgroups():
    """Removes the rank cgroups of runs whose process is gone (killed with SIGKILL). Returns them."""
    root = cgroup2_root()
    removed = []
    if root is None:
        return removed
    for entry in sorted(os.listdir(root)):
        m = re.match(rf"^{NAME_PREFIX}(\d+)-[0-9a-f]{{4}}$", entry)
        if m and not _pid_alive(int(m.group(1))) and os.path.isdir(os.path.join(root, entry)):
            remove_cgroup_tree(os.path.join(root, entry))
            removed.append(entry)
    return removed


def hosts_and_ranks(n, hosts, ranks_per_host):
    """(hosts, ranks per host) from a number of ranks n and/or hosts; ValueError saying what is wrong."""
    if isinstance(ranks_per_host, bool) or not isinstance(ranks_per_host, int) or ranks_per_host < 1:
        raise ValueError(f"ranks per host must be a whole number >= 1, got {ranks_per_host!r}")
    if hosts is None:
        if n is None:
            raise ValueError("give the number of ranks (n) or of hosts")
        if n % ranks_per_host:
            raise ValueError(f"{n} ranks do not make hosts of {ranks_per_host} ranks each")
        hosts = n // ranks_per_host
    elif n is not None and n != hosts * ranks_per_host:
        raise ValueError(f"{n} ranks but {hosts} hosts of {ranks_per_host} ranks ({hosts * ranks_per_host})")
    if isinstance(hosts, bool) or not isinstance(hosts, int) or not 1 <= hosts <= MAX_HOSTS:
        raise ValueError(f"hosts must be in 1..{MAX_HOSTS}, got {hosts!r}")
    return hosts, ranks_per_host


def rank_environment(rank, hosts, ranks_per_host, master_addr, port):
    """The variables torchrun sets for a worker of a one-role job on hosts x ranks_per_host."""
    world = hosts * ranks_per_host
    return {
        "RANK": str(rank), "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(rank % ranks_per_host), "LOCAL_WORLD_SIZE": str(ranks_per_host),
        "GROUP_RANK": str(rank // ranks_per_host), "GROUP_WORLD_SIZE": str(hosts),
        "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(world), "ROLE_NAME": "default",
        "MASTER_ADDR": master_addr, "MASTER_PORT": str(port),
    }


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
    """The ranks as local processes on loopback (no namespaces, nothing shaped or counted): the
    same arguments, environment (hosts x ranks_per_host as torchrun would number them) and run()
    as EmulatedCluster, for the parts the job and the benchmarks use."""

    def __init__(self, n=None, hosts=None, ranks_per_host=1):
        self.hosts, self.ranks_per_host = hosts_and_ranks(n, hosts, ranks_per_host)
        self.n, self.network = self.hosts * self.ranks_per_host, "local"

    def host_of(self, rank):
        if not 0 <= rank < self.n:
            raise ValueError(f"rank {rank} is not in 0..{self.n - 1}")
        return rank // self.ranks_per_host

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
                e = dict(os.environ, **rank_environment(r, self.hosts, self.ranks_per_host, "127.0.0.1", port),
                         GOSSIPCC_NETWORK="local")
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
                    return RunResult(time.monotonic() - start, [None] * self.n, [None] * self.hosts)
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
    """From inside a rank of an EmulatedCluster: bytes this rank has sent to other hosts so far
    (None elsewhere, or where the cluster could not count ranks' own bytes). One rank per host:
    its host's NIC counter (`ip netns exec` mounts the namespace's own sysfs, so the path names
    the host's veth). Several: the counting rule of this process's cgroup on that NIC (see
    EmulatedCluster.tx_bytes), read with iptables (a few milliseconds: read it outside timed code)."""
    iface = os.environ.get("GOSSIPCC_NETNS_IFACE")
    if not iface:
        return None
    if os.environ.get("LOCAL_WORLD_SIZE", "1") == "1":
        return host_tx_bytes()
    try:
        with open("/proc/self/cgroup") as f:
            path = next(line[3:].strip() for line in f if line.startswith("0::"))
        out = subprocess.run(["iptables", "-w", "-t", "raw", "-nvxL", "OUTPUT"], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True, check=True).stdout
    except (OSError, StopIteration, subprocess.CalledProcessError):
        return None
    return _cgroup_counters(out).get(path)


def host_tx_bytes():
    """From inside a rank of an EmulatedCluster: bytes its host's NIC has sent so far, every rank
    of the host together (None elsewhere)."""
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
        description="Run one command per rank on emulated hosts (a network namespace each, G ranks on each).",
        usage="%(prog)s [--hosts H [--ranks-per-host G] | --ranks N] [--network PRESET|rate=..,delay=..] "
              "-- COMMAND...\n       %(prog)s presets | cleanup\n"
              "       %(prog)s calibrate [--network SPEC]... [--host-tcp stock|machine] [--seconds S]")
    parser.add_argument("--hosts", type=int, default=None, help="emulated hosts (default 4)")
    parser.add_argument("--ranks-per-host", type=int, default=1,
                        help="ranks on each host, sharing its link (default 1)")
    parser.add_argument("--ranks", type=int, default=None,
                        help="N hosts of one rank each (the same as --hosts N --ranks-per-host 1)")
    parser.add_argument("--network", default="1gbit",
                        help=f"one of {', '.join(PRESETS)} or rate=..[,delay=..[,jitter=..]][,loss=..%%]")
    parser.add_argument("--host-tcp", choices=["stock", "machine"], default="stock",
                        help="the hosts' TCP buffers and congestion control: a stock Linux host's (default) "
                             "or this machine's own")
    parser.add_argument("--timeout", type=float, default=None, help="seconds before the ranks are killed")
    parser.add_argument("--hostnames", action="store_true",
                        help="each host named host<h>, which every host resolves; MASTER_ADDR=host0")
    parser.add_argument("--no-interface-env", action="store_true",
                        help="set no GLOO_SOCKET_IFNAME (nor pass one through): backends choose their address")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if cmd == ["presets"]:
        for name, (rate, delay) in PRESETS.items():
            print(f"{name:12s} rate={rate or 'unshaped'} delay={delay or '0'}")
        return 0
    if cmd[:1] == ["calibrate"]:
        import wan_calibration
        try:
            return wan_calibration.main(cmd[1:])
        except (NamespacesUnavailable, ClusterError, ValueError) as e:
            print(f"emulated_cluster: {e}", file=sys.stderr)
            return 2 if isinstance(e, NamespacesUnavailable) else 1
        except KeyboardInterrupt:
            print("emulated_cluster: interrupted; namespaces removed", file=sys.stderr)
            return 130
    if cmd == ["cleanup"]:
        removed = cleanup_stale()
        print(f"removed {len(removed)} stale namespaces" + (f": {' '.join(removed)}" if removed else ""))
        cgroups = cleanup_stale_cgroups()
        if cgroups:
            print(f"removed {len(cgroups)} stale rank cgroups: {' '.join(cgroups)}")
        return 0
    if not cmd:
        parser.error("no command given (put it after --)")
    if args.ranks is not None and (args.hosts is not None or args.ranks_per_host != 1):
        parser.error("--ranks N means N hosts of one rank each: give it alone, or --hosts with --ranks-per-host")
    hosts = args.ranks if args.ranks is not None else (4 if args.hosts is None else args.hosts)
    try:
        parse_link(args.network)
        with EmulatedCluster(network=args.network, hosts=hosts, ranks_per_host=args.ranks_per_host,
                             hostnames=args.hostnames, interface_env=not args.no_interface_env,
                             host_tcp=args.host_tcp) as cluster:
            print(f"emulated_cluster: {cluster.tcp_summary()}", flush=True)
            result = cluster.run([cmd] * cluster.n, timeout=args.timeout)
    except (NamespacesUnavailable, ClusterError, ValueError) as e:
        print(f"emulated_cluster: {e}", file=sys.stderr)
        return 2 if isinstance(e, NamespacesUnavailable) else 1
    except KeyboardInterrupt:
        print("emulated_cluster: interrupted; namespaces removed", file=sys.stderr)
        return 130
    print(f"emulated_cluster: {cluster.hosts} hosts x {cluster.ranks_per_host} ranks, "
          f"network {args.network}, {result.wall_seconds:.2f} s; bytes sent to other hosts:")
    for h in range(cluster.hosts):
        ranks = cluster.ranks_of(h)
        print(f"  host {h}: {result.host_tx_bytes[h]} bytes (NIC counter)")
        for r in ranks:
            print(f"    rank {r}: " + (f"{result.tx_bytes[r]} bytes" if result.tx_bytes[r] is not None
                                      else f"not counted ({cluster.rank_counters_unavailable})"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
