"""A WAN link's delay, jitter and loss on the packets an emulated host receives, without netem.

tools/emulated_cluster.py uses this where the kernel has no sch_netem (this project's machines):
one delay line (tools/delay_line, a small program over NFQUEUE) runs inside each host's network
namespace, and one iptables rule there hands it every IPv4 packet that arrives on the host's NIC:

    iptables -t raw -A PREROUTING -i <dev> -j NFQUEUE --queue-num <N>

Each packet is delayed once, by the receiving host's line, so the one-way latency from host to
host is the delay (as with netem on the sending host's NIC), after the senders' and the switch's
rate limits (a link's serialisation, then its propagation). Why not the sender's OUTPUT chain,
where netem would sit: a packet held there still counts against its socket's TCP Small Queues
budget (about a millisecond of data at the socket's pacing rate; netem orphans the packets it
holds, NFQUEUE cannot), so TCP would stop sending after a few packets per delay and a long fat
link would carry a few percent of its rate. By PREROUTING the receiving stack has orphaned the
packet. Nor the switch's FORWARD chain: veth keeps the sender's socket attached across
namespaces, so the same holds there, and one process would carry every host's traffic. In the
host's own namespace, each host's arrivals pass through a process of their own, traffic between
the ranks of one host (loopback, its own address) never matches `-i <dev>`, and the rule
disappears with the namespace.

The veths keep their offloads (GSO/GRO): senders, the switch and tbf work on TCP's 64 KB
segments; the delay line holds them whole with a delay alone and lets the kernel split them
into frames first where loss or jitter must act per frame (tools/delay_line/delay_line.cc).

Without the rule's `--queue-bypass`, a host whose delay line has died receives nothing (instead
of receiving undelayed without saying so); the cluster checks that its delay lines are alive.

Needs root, iptables with the NFQUEUE target (xt_NFQUEUE) and the built delay line; start()
raises WanLinkError naming whichever is missing.
"""
import os
import re
import select
import shutil
import signal
import subprocess
import time

BINARY_ENV = "GOSSIPCC_DELAY_LINE"
BAZEL_TARGET = "//tools/delay_line:delay_line"
LABEL_PREFIX = "delay_line:"  # then the namespace's name: how `cleanup` finds stray lines


class WanLinkError(RuntimeError):
    """A delay line could not be started; the message names what is missing or failed."""


def find_binary():
    """The delay line's path: $GOSSIPCC_DELAY_LINE if set, else the copy beside this file in a
    Bazel test's runfiles, else the workspace's bazel-bin. Raises WanLinkError listing where it
    looked."""
    override = os.environ.get(BINARY_ENV)
    if override:
        if os.path.isfile(override) and os.access(override, os.X_OK):
            return override
        raise WanLinkError(f"${BINARY_ENV}={override} is not an executable file (the delay line, "
                           f"built by `bazel build {BAZEL_TARGET}`)")
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [os.path.join(here, "delay_line", "delay_line")]  # runfiles: tools/delay_line/delay_line
    for root in (os.environ.get("RUNFILES_DIR"), os.environ.get("TEST_SRCDIR")):
        if root:
            candidates.append(os.path.join(root, os.environ.get("TEST_WORKSPACE", "gossipcc"),
                                           "tools", "delay_line", "delay_line"))
    candidates.append(os.path.join(os.path.dirname(here), "bazel-bin", "tools", "delay_line", "delay_line"))
    for path in candidates:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    raise WanLinkError("the delay line is not built (looked at " + ", ".join(candidates) +
                       f"): run `bazel build {BAZEL_TARGET}` in the workspace, or set ${BINARY_ENV}")


def seconds(tc_time):
    """"25ms" -> 0.025 (tc's units us, ms, s)."""
    m = re.match(r"^(\d+(?:\.\d+)?)(us|ms|s)$", tc_time)
    if not m:
        raise ValueError(f"bad time {tc_time!r} (expected e.g. 25ms, 500us, 1s)")
    return float(m.group(1)) * {"us": 1e-6, "ms": 1e-3, "s": 1.0}[m.group(2)]


def max_held(rate_bps, delay_s, jitter_s):
    """The delay line's --max-held for a link: 4 x the MTU-sized packets in flight one way at the
    link's rate (10 Gbit/s where unshaped), for the data and the ACKs of the other direction
    with room to spare; at least the line's default, 16384."""
    in_flight = (rate_bps or 10e9) / 8 / 1514 * (delay_s + jitter_s)
    return int(min(1 << 24, max(16384, 4 * in_flight)))


class DelayLine:
    """One delay line for the packets arriving on `dev` in namespace `netns`.

        line = DelayLine("ns", "ve0", delay="25ms", jitter=None, loss=0.0, seed=1)
        line.start()      # the binary runs and holds the queue, then the rule is added
        ...
        line.stop()       # the rule is removed, the binary exits; returns its counters
    """

    def __init__(self, netns, dev, delay, jitter=None, loss=0.0, seed=1, rate_bps=None, queue=0, binary=None):
        self.netns, self.dev, self.queue = netns, dev, queue
        self.delay, self.jitter, self.loss, self.seed = delay or "0", jitter or "0", loss, seed
        self.max_held = max_held(rate_bps, seconds(delay) if delay else 0.0, seconds(jitter) if jitter else 0.0)
        self.binary = binary
        self.proc = None
        self.counters = None
        self.output = ""
        self._rule = None

    @property
    def label(self):
        return LABEL_PREFIX + self.netns

    def command(self):
        return [self.binary, "--queue", str(self.queue), "--delay", self.delay, "--jitter", self.jitter,
                "--loss", repr(float(self.loss)), "--seed", str(self.seed), "--max-held", str(self.max_held),
                "--label", self.label]

    def start(self, timeout=10.0):
        """Starts the binary in the namespace, waits for it to hold the queue, adds the rule.
        timeout: a safety net for the binary's start on a loaded machine."""
        if shutil.which("iptables") is None:
            raise WanLinkError("`iptables` not found: a delay line needs it to hand the host's packets to "
                               "its NFQUEUE queue (apt-get install iptables)")
        if self.binary is None:
            self.binary = find_binary()
        self.proc = subprocess.Popen(["ip", "netns", "exec", self.netns] + self.command(), stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True)
        deadline = time.monotonic() + timeout
        line = ""
        while not line.endswith("\n"):
            left = deadline - time.monotonic()
            if left <= 0:
                self.stop()
                raise WanLinkError(f"the delay line in {self.netns} did not report ready within {timeout:.0f} s")
            ready, _, _ = select.select([self.proc.stdout], [], [], left)
            if ready:
                chunk = self.proc.stdout.readline()
                if not chunk:  # exited before it was ready: its stderr says why
                    err = self.proc.stderr.read().strip()
                    code = self.proc.wait()
                    self.proc = None
                    raise WanLinkError(f"the delay line in {self.netns} failed to start (exit status {code}): "
                                       f"{err or 'no message'}")
                line += chunk
        if " ready " not in line:
            self.stop()
            raise WanLinkError(f"the delay line in {self.netns} printed {line.strip()!r} instead of its ready line")
        rule = ["PREROUTING", "-i", self.dev, "-j", "NFQUEUE", "--queue-num", str(self.queue)]
        proc = subprocess.run(["ip", "netns", "exec", self.netns, "iptables", "-w", "-t", "raw", "-A"] + rule,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if proc.returncode != 0:
            self.stop()
            err = proc.stderr.strip()
            hint = (" (the kernel lacks the NFQUEUE target: CONFIG_NETFILTER_XT_TARGET_NFQUEUE / module xt_NFQUEUE)"
                    if "NFQUEUE" in err or "No chain/target/match" in err or "Extension" in err else "")
            raise WanLinkError(f"`iptables -t raw -A {' '.join(rule)}` in {self.netns} failed{hint}: {err}")
        self._rule = rule

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def cpu_seconds(self):
        """User + system CPU time the delay line has used so far (/proc/<pid>/stat)."""
        if self.proc is None:
            return 0.0
        try:
            with open(f"/proc/{self.proc.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self, timeout=5.0):
        """Removes the rule (if the namespace still exists), stops the binary (SIGTERM: it accepts
        what it holds and prints its counters; SIGKILL after `timeout`). Idempotent. Returns the
        counters (dict of int), or None when it printed none."""
        if self._rule is not None:
            subprocess.run(["ip", "netns", "exec", self.netns, "iptables", "-w", "-t", "raw", "-D"] + self._rule,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self._rule = None
        if self.proc is None:
            return self.counters
        proc, self.proc = self.proc, None
        if proc.poll() is None:
            try:
                proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        self.output = (out or "") + (err or "")
        for line in (out or "").splitlines():
            if " packets=" in line:
                self.counters = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line)}
        return self.counters


def stray_processes(is_stale):
    """pids of delay lines whose label's namespace satisfies is_stale(name) (for `cleanup`)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if not argv or os.path.basename(argv[0]) != "delay_line" or "--label" not in argv:
            continue
        i = argv.index("--label")
        label = argv[i + 1] if i + 1 < len(argv) else ""
        if label.startswith(LABEL_PREFIX) and is_stale(label[len(LABEL_PREFIX):]):
            pids.append(int(entry))
    return pids
