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
egress towards the host (download) on `p<h>`, each with `tbf` at the link rate; a preset's
delay is added with `netem` on the host's egress only (one-way host-to-host latency = delay).

A host runs G ranks (--ranks-per-host, default 1), all in its namespace: they share its shaped
link in both directions, as the GPUs of a node share its NIC, and talk to each other over the
host's own address or its loopback, which the kernel delivers over `lo`: unshaped, and not on
the NIC's counters. Ranks are numbered as torchrun numbers them: host h runs ranks
h*G .. h*G+G-1.

Every namespace is removed when the cluster closes: on normal exit, on an exception, on Ctrl-C
and on SIGTERM/SIGHUP (rank processes are killed first). Names carry this process's pid and a
random token, so concurrent runs never collide; `cleanup` removes leftovers of runs that were
killed with SIGKILL.

Command line (runs one command per rank on its host, then prints the bytes each host and each
rank sent to other hosts):

    tools/emulated_cluster.py [--hosts 4] [--ranks-per-host 2] [--network 1gbit] -- python3 my_script.py
    tools/emulated_cluster.py --ranks 4 -- ...   (4 hosts of one rank: --hosts 4 --ranks-per-host 1)
    tools/emulated_cluster.py presets
    tools/emulated_cluster.py cleanup

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
the cluster raises NamespacesUnavailable with the reason. Kernels without sch_netem (this
project's CI machine) refuse the delay presets with a ClusterError saying so.

For Python callers: EmulatedCluster (above), LocalCluster (the same arguments and run() over
loopback, no namespaces), rank_tx_bytes() and host_tx_bytes() (inside a rank: its own and its
host's bytes sent so far).
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
MAX_HOSTS = 250
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
    """`hosts` hosts in network namespaces on one bridge, `ranks_per_host` ranks on each, every
    host's link shaped by `network`.

        with EmulatedCluster(hosts=4, ranks_per_host=2, network="1gbit") as cluster:
            results = cluster.run([[sys.executable, "train.py"]] * cluster.n)
            print(results.host_tx_bytes, results.tx_bytes)

    EmulatedCluster(n, network) is n hosts of one rank each.
    """

    def __init__(self, n=None, network="none", quiet=True, hostnames=False, interface_env=True,
                 hosts=None, ranks_per_host=1):
        """n: the number of ranks (the world size), hosts x ranks_per_host; give n or hosts (or
        both, if they agree). hostnames: each host has a name of its own, host<h> (a UTS
        namespace per rank process), which every host resolves (/etc/netns/<ns>/hosts, which
        `ip netns exec` mounts over /etc/hosts) to that host's address, as a real cluster's
        DNS or hosts file does; MASTER_ADDR is then host0. interface_env: whether each rank's
        command gets GLOO_SOCKET_IFNAME (False: nothing tells a backend which interface to use,
        as on a cluster launched the plain torch way)."""
        self.hosts, self.ranks_per_host = hosts_and_ranks(n, hosts, ranks_per_host)
        self.n = self.hosts * self.ranks_per_host
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
            self._shape(ns, ve, self.delay)   # upload (+ latency)
            self._shape(self.hub, port, None)  # download
            if self.hostnames:
                self.write_hosts_file(h)
        self._wait_reachable()
        self._count_ranks()

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
        """Kills rank processes still running, then deletes every namespace (idempotent)."""
        self.kill_all()
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
              "-- COMMAND...\n       %(prog)s presets | cleanup")
    parser.add_argument("--hosts", type=int, default=None, help="emulated hosts (default 4)")
    parser.add_argument("--ranks-per-host", type=int, default=1,
                        help="ranks on each host, sharing its link (default 1)")
    parser.add_argument("--ranks", type=int, default=None,
                        help="N hosts of one rank each (the same as --hosts N --ranks-per-host 1)")
    parser.add_argument("--network", default="1gbit", help=f"one of {', '.join(PRESETS)} or rate=..,delay=..")
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
        parse_network(args.network)
        with EmulatedCluster(network=args.network, hosts=hosts, ranks_per_host=args.ranks_per_host,
                             hostnames=args.hostnames, interface_env=not args.no_interface_env) as cluster:
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
