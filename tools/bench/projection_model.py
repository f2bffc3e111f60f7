"""The alpha-beta model of tools/bench/projection.py: each method's time per call (or per step)
on H hosts of G ranks that share their host's NIC, as small functions a reader can check
against the code they model (each names its file). Pure arithmetic: no torch, no network.

Units: bytes, seconds, bytes/s. A cost is Cost(latency, wire, cpu): latency, the per-message
costs on the critical path; wire, the bytes on the busiest stream over its rate; cpu, the
method's own compute on one rank. Its total is their sum (no overlap between them is assumed,
except where a function says so).

The link (Link): alpha, a message's cost between two hosts (one-way delay plus the software's
per-message cost); beta, the rate one TCP stream achieves between two hosts, which a stock
host's TCP window bounds at high delay (stream_rate: min(nic, streams x window / RTT)); nic,
the host's NIC payload rate, shared by every stream that crosses it at once
(shared_rate: min(beta, nic / streams)); local_alpha and local_rate, the same between two ranks
of one host. Bytes per host are what its NIC sends to other hosts.

The world (World): hosts H, ranks per host G, ranks numbered as torchrun numbers them (host h
runs ranks hG .. hG+G-1); rank r's ring neighbour is r + 1 (mod n). No method is topology-aware
today: each rank's messages to other hosts leave through its host's NIC, G ranks' worth
together where they are sent at once (hierarchical() gives the topology-aware form: the host's
G ranks reduce over the intra-host link first, one rank per host runs the method, then the
result is broadcast inside the host).
"""
import collections
import math

Cost = collections.namedtuple("Cost", "latency wire cpu")
Cost.total = property(lambda c: c.latency + c.wire + c.cpu)

DIRECT_MAX_BYTES = 512 << 10        # comm/gloo/collectives.cc: the direct all-reduce up to 512 KiB
QUANTIZED_BLOCK = 256                # compression/quantized_allreduce.h kDefaultQuantizedBlockSize
QUANTIZED_EAGER_BYTES = 64 << 10     # compression/quantized_allreduce.h kQuantizedEagerBytes
COLLECTIVE_LANES = 2                 # comm/core/options.h collective_lanes: DDP's buckets on 2 lanes
PAYLOAD_SHARE = 1448 / (1448 + 66)   # full TCP frames: MSS 1448 of 1514 bytes (tools/wan_calibration.py)
INITIAL_WINDOW = 10 * 1448           # Linux's initial congestion window: 10 segments


class ModelError(ValueError):
    """Bad input to the model (a message naming what was wrong)."""


class Link:
    """One network (see the module's doc). Per-message costs by primitive, each calibrated:
    alpha, one point-to-point message (gossipcc's send: a header, then the payload); exchange,
    one exchange of a collective's signature check, which carries eager payloads
    (comm/gloo/consistency_check.cc); ring, one step of gossipcc's ring (comm/gloo/ring_common.cc); gloo,
    one step of gloo's ring. Each defaults to alpha. rtt: the round trip; restart: the window a
    connection idle for longer than TCP's retransmission timeout restarts from (idle_message)."""

    def __init__(self, alpha, beta, nic, local_alpha=20e-6, local_rate=2e9, exchange=None, ring=None, gloo=None,
                 rtt=0.0, restart=INITIAL_WINDOW):
        for name, v in (("alpha", alpha), ("local_alpha", local_alpha), ("rtt", rtt)):
            if not v >= 0:
                raise ModelError(f"Link: {name} must be >= 0 seconds, got {v}")
        for name, v in (("beta", beta), ("nic", nic), ("local_rate", local_rate)):
            if not v > 0:
                raise ModelError(f"Link: {name} must be > 0 bytes/s, got {v}")
        self.alpha, self.beta, self.nic = alpha, beta, nic
        self.local_alpha, self.local_rate = local_alpha, local_rate
        self.exchange = alpha if exchange is None else exchange
        self.ring = alpha if ring is None else ring
        self.gloo = alpha if gloo is None else gloo
        self.rtt, self.restart = rtt, restart

    def __repr__(self):
        return (f"Link(alpha={self.alpha:.3g} s, beta={self.beta:.4g} B/s, nic={self.nic:.4g} B/s, "
                f"exchange={self.exchange:.3g} s, ring={self.ring:.3g} s, gloo={self.gloo:.3g} s, "
                f"local_alpha={self.local_alpha:.3g} s, local_rate={self.local_rate:.4g} B/s, rtt={self.rtt:.3g} s)")


def stream_rate(nic, delay, window, streams=1):
    """The rate of one peer's traffic over `streams` TCP streams (GOSSIPCC_STREAMS_PER_PEER):
    each stream carries at most `window` bytes per round trip (2 x delay), the NIC at most nic."""
    if streams < 1:
        raise ModelError(f"streams per peer must be >= 1, got {streams}")
    if delay <= 0 or window == math.inf:
        return nic
    return min(nic, streams * window / (2 * delay))


PRIMITIVES = ("alpha", "exchange", "ring", "gloo")


def network_link(rate_bits, delay, window, costs, streams=1, local_alpha=20e-6, local_rate=2e9,
                 restart=INITIAL_WINDOW):
    """A Link from a NIC's line rate (bits/s), the one-way delay, a stream's TCP window (bytes)
    and per primitive (PRIMITIVES) its cost as (one-way delays per message, software seconds):
    cost = delays x delay + seconds; beta = stream_rate()."""
    missing = [p for p in PRIMITIVES if p not in costs]
    if missing:
        raise ModelError(f"network_link: no per-message cost for {', '.join(missing)}")
    nic = rate_bits / 8 * PAYLOAD_SHARE
    cost = {p: costs[p][0] * delay + costs[p][1] for p in PRIMITIVES}
    return Link(cost["alpha"], stream_rate(nic, delay, window, streams), nic, local_alpha, local_rate,
                exchange=cost["exchange"], ring=cost["ring"], gloo=cost["gloo"], rtt=2 * delay, restart=restart)


def idle_message(size, alpha, rate, rtt, initial=INITIAL_WINDOW):
    """One message on a connection idle for longer than TCP's retransmission timeout, which
    Linux restarts from a smaller window (net.ipv4.tcp_slow_start_after_idle; `initial`, at
    least the initial window: calibrated as Link.restart): the window doubles each round trip
    until it carries `rate` x rtt, then the rest goes at `rate`.
    alpha + (round trips of slow start) x rtt + the rest / rate."""
    if rtt <= 0 or size <= 0:
        return alpha + size / rate
    sent, window, rounds = 0.0, float(initial), 0
    while sent + window < size and window < rate * rtt:
        sent += window
        window *= 2
        rounds += 1
    return alpha + rounds * rtt + (size - sent) / rate


RTO_MIN = 0.2  # Linux's TCP_RTO_MIN: the retransmission timeout is about rtt + 200 ms on a steady link


def restart_after(idle, rtt, window, floor=INITIAL_WINDOW):
    """The window a connection that carried `window` bytes per round trip restarts from after
    `idle` seconds without traffic (Linux's tcp_cwnd_restart): halved once per retransmission
    timeout (rtt + RTO_MIN) of idle time, never below `floor` (the initial window, or the
    calibrated restart window)."""
    halvings = int(idle // (rtt + RTO_MIN)) if idle > 0 else 0
    return max(float(floor), window / 2 ** min(halvings, 60))


def restart_window(extra, size, rate, rtt):
    """The window a restarted connection starts from (idle_message's `initial`, between the
    initial window and rate x rtt) for which a message of `size` bytes takes `extra` seconds
    more than size / rate: the calibration's inverse of idle_message (bisection; the slow
    start's time only falls as the window grows)."""
    lo, hi = float(INITIAL_WINDOW), max(float(INITIAL_WINDOW), rate * rtt)
    if rtt <= 0 or idle_message(size, 0.0, rate, rtt, lo) - size / rate <= extra:
        return lo
    for _ in range(60):
        mid = math.sqrt(lo * hi)
        if idle_message(size, 0.0, rate, rtt, mid) - size / rate > extra:
            lo = mid
        else:
            hi = mid
    return hi


def shared_rate(link, streams):
    """What each of `streams` streams leaving one host at once gets: min(beta, nic / streams)."""
    return min(link.beta, link.nic / max(1, streams))


class World:
    def __init__(self, hosts, ranks_per_host=1):
        if hosts < 1 or ranks_per_host < 1:
            raise ModelError(f"World: hosts and ranks per host must be >= 1, got {hosts} x {ranks_per_host}")
        self.hosts, self.g = hosts, ranks_per_host
        self.n = hosts * ranks_per_host

    def host(self, rank):
        return (rank % self.n) // self.g

    def __repr__(self):
        return f"World({self.hosts} x {self.g})"


# ---- the exact all-reduce ---------------------------------------------------------------------

def ring_allreduce(size, world, link, cpu_per_byte=0.0, gloo=False, idle=False):
    """comm/gloo/ring_allreduce.cc (gloo=True: gloo's ring, ProcessGroupGloo's all-reduce): 2(n-1)
    steps of size/n bytes to the next rank. The NIC carries one stream each way (only host h's
    last rank sends to another host), so the wire term is 2(n-1) size/n at beta; each step costs
    the hop's per-step cost (link.ring or link.gloo between hosts, local_alpha inside one), and
    a step's hop crosses hosts for H of the n ranks. idle: the ring's connections were idle for
    longer than TCP's retransmission timeout (between training steps, between outer syncs), so
    its first step's chunk goes out in slow start (idle_message). cpu: cpu_per_byte per byte of
    the buffer (measured: the reduce and the copies)."""
    n = world.n
    if n == 1 or size == 0:
        return Cost(0.0, 0.0, 0.0)
    steps = 2 * (n - 1)
    chunk = size / n
    cross = world.hosts / n if world.hosts > 1 else 0.0
    latency = steps * (cross * (link.gloo if gloo else link.ring) + (1 - cross) * link.local_alpha)
    rate = min(link.beta, link.nic) if world.hosts > 1 else link.local_rate
    if idle and world.hosts > 1:
        latency += idle_message(chunk, 0.0, rate, link.rtt, link.restart) - chunk / rate
    return Cost(latency, steps * chunk / rate, size * cpu_per_byte)


def exchange(per_peer, world, link):
    """(latency, wire) of one exchange in which every rank sends per_peer bytes to each of its
    n - 1 peers at once: a host's NIC carries G (n - G) of them together."""
    n, g = world.n, world.g
    if world.hosts > 1:
        return link.exchange, max(g * (n - g) * per_peer / link.nic, per_peer / link.beta)
    return link.local_alpha, (n - 1) * per_peer / link.local_rate


def eager_max_bytes(n):
    """comm/core/options.h EagerCollectiveMaxBytes: 128 KiB / (n - 1); 0 for one rank."""
    return 0 if n < 2 else (128 << 10) // (n - 1)


def eager_allreduce(size, world, link, cpu_per_byte=0.0):
    """comm/gloo/eager_collectives.cc: the payload rides in the signature check, one exchange in
    which every rank sends its whole buffer to every peer."""
    if world.n == 1 or size == 0:
        return Cost(0.0, 0.0, 0.0)
    a, w = exchange(size, world, link)
    return Cost(a, w, size * cpu_per_byte)


def direct_allreduce(size, world, link, cpu_per_byte=0.0):
    """comm/gloo/direct_allreduce.cc: two exchanges (chunk p to rank p, then the reduced chunk back to
    every rank) after the signature check (one more exchange). cpu as ring_allreduce's."""
    if world.n == 1 or size == 0:
        return Cost(0.0, 0.0, 0.0)
    a, w = exchange(size / world.n, world, link)
    return Cost(3 * a, 2 * w, size * cpu_per_byte)


def gossipcc_allreduce(size, world, link, cpu_per_byte=0.0, idle=False):
    """comm/gloo/collectives.cc (collective_plan.cc): eager up to EagerCollectiveMaxBytes, the
    direct all-reduce up to 512 KiB, the ring above (idle: as ring_allreduce's)."""
    if size <= eager_max_bytes(world.n):
        return eager_allreduce(size, world, link, cpu_per_byte)
    if size <= DIRECT_MAX_BYTES:
        return direct_allreduce(size, world, link, cpu_per_byte)
    return ring_allreduce(size, world, link, cpu_per_byte, idle=idle)


def ring_bytes_per_host(size, world):
    """Bytes a host's NIC sends in one ring all-reduce of `size` bytes: 2(n-1) chunks of size/n."""
    n = world.n
    return 0.0 if world.hosts == 1 else 2 * (n - 1) * size / n


def bucketed(costs, lanes=COLLECTIVE_LANES):
    """DDP's buckets issued at once (torch's reducer; comm/lanes.cc: lane k mod lanes): the
    lanes overlap the buckets' latencies; their bytes share the same link, their cpu one core."""
    costs = list(costs)
    return Cost(sum(c.latency for c in costs) / lanes, sum(c.wire for c in costs), sum(c.cpu for c in costs))


# ---- the quantized all-reduce -----------------------------------------------------------------

def quantized_bytes(count, bits, block=QUANTIZED_BLOCK):
    """compression/quantized_allreduce.cc QuantizedBytes: codes plus a float32 scale per block."""
    if bits not in (4, 8):
        raise ModelError(f"quantized all-reduce: bits must be 4 or 8, got {bits}")
    blocks = -(-count // block)
    return blocks * 4 + -(-count * bits // 8)


def off_host_senders(world, distance):
    """How many of host 0's ranks send off the host when every rank sends to rank + distance."""
    return sum(1 for i in range(world.g) if world.host(i + distance) != 0)


def quantized_allreduce(count, bits, world, link, cpu_per_element=0.0):
    """compression/quantized_allreduce.cc: the check (an all-gather of a header: one exchange), the
    scatter in n - 1 point-to-point rounds one at a time (round d: every rank sends its quantized
    copy of rank r+d's region, Q/n bytes, on a connection idle since the previous call:
    idle_message; the host's ranks that send off the host share its NIC), then the ring
    all-gather of the owners' quantized sums (RingGather: n - 1 steps of Q/n, one stream per NIC,
    one message's alpha per step). Up to 64 KiB quantized every round is in flight at once: two
    exchanges of messages. cpu: quantize, sum and dequantize, cpu_per_element per element
    (measured; not overlapped with the rounds)."""
    n = world.n
    q = quantized_bytes(count, bits)
    cpu = count * cpu_per_element
    if n == 1:
        return Cost(0.0, 0.0, cpu)
    chunk = q / n
    check = link.exchange if world.hosts > 1 else link.local_alpha
    if q <= QUANTIZED_EAGER_BYTES:
        _, w = exchange(chunk, world, link)
        a = link.alpha if world.hosts > 1 else link.local_alpha
        return Cost(check + 2 * a, 2 * w, cpu)
    latency, wire = check, 0.0
    for d in range(1, n):
        s = off_host_senders(world, d)
        if s:
            rate = shared_rate(link, s)
            t = idle_message(chunk, link.alpha, rate, link.rtt, link.restart)
            latency += t - chunk / rate
            wire += chunk / rate
        else:
            latency += link.local_alpha
            wire += chunk / link.local_rate
    cross = world.hosts / n if world.hosts > 1 else 0.0
    latency += (n - 1) * (cross * link.alpha + (1 - cross) * link.local_alpha)
    wire += (n - 1) * chunk / (min(link.beta, link.nic) if world.hosts > 1 else link.local_rate)
    return Cost(latency, wire, cpu)


def quantized_bytes_per_host(count, bits, world):
    """NIC bytes of one quantized all-reduce: each off-host scatter message, then the gather ring."""
    if world.hosts == 1:
        return 0.0
    chunk = quantized_bytes(count, bits) / world.n
    scatter = sum(off_host_senders(world, d) for d in range(1, world.n)) * chunk
    return scatter + (world.n - 1) * chunk


# ---- PowerSGD ---------------------------------------------------------------------------------

def psgd_compressed(shape, rank=4, min_rate=2.0):
    """compression/power_sgd_steps.cc SelectTensorsToCompress: a tensor of >= 2 dimensions viewed
    as n x m (first dimension by the rest) when (n + m) r min_rate < n m."""
    if len(shape) < 2:
        return False
    n = shape[0]
    m = math.prod(shape) // n
    r = min(n, m, rank)
    return (n + m) * r * min_rate < n * m


def psgd_sizes(shapes, rank=4):
    """(exact bytes, P bytes, Q bytes, sum of n m r over the compressed tensors) of one call."""
    exact = p = q = nmr = 0
    for shape in shapes:
        k = math.prod(shape)
        if psgd_compressed(shape, rank):
            n, m = shape[0], k // shape[0]
            r = min(n, m, rank)
            p += 4 * n * r
            q += 4 * m * r
            nmr += n * m * r
        else:
            exact += 4 * k
    return exact, p, q, nmr


def powersgd_allreduce(shapes, world, link, cpu_per_nmr=0.0, rank=4):
    """compression/power_sgd.cc (steps: compression/power_sgd_steps.h): the cross-rank check, one
    exchange (compression/power_sgd_check.h), which carries the exact part and the first P when
    they fit the eager limit together; else the exact all-reduce of the tensors left
    uncompressed and the all-reduce of every P packed in one buffer after it; then the Q
    all-reduce: gossipcc's all-reduces. cpu: M Q, M^T P and P Q^T with the error memory,
    cpu_per_nmr per n m r (measured)."""
    exact, p, q, nmr = psgd_sizes(shapes, rank)
    riding = exact + p <= eager_max_bytes(world.n)
    check = eager_allreduce(exact + p, world, link) if riding else Cost(
        link.exchange if world.hosts > 1 else link.local_alpha, 0.0, 0.0)
    parts = [check] + [gossipcc_allreduce(b, world, link) for b in ([q] if riding else [exact, p, q]) if b]
    return Cost(sum(c.latency for c in parts), sum(c.wire for c in parts), nmr * cpu_per_nmr)


def powersgd_bytes_per_host(shapes, world, rank=4):
    exact, p, q, _ = psgd_sizes(shapes, rank)
    riding = exact + p <= eager_max_bytes(world.n)
    return sum(allreduce_bytes_per_host(b, world) for b in ([exact + p, q] if riding else [exact, p, q]) if b)


def allreduce_bytes_per_host(size, world):
    """NIC bytes of gossipcc's all-reduce: eager, G (n-G) whole buffers; direct, G (n-G) chunks
    per exchange; the ring's."""
    if world.hosts == 1:
        return 0.0
    if size <= eager_max_bytes(world.n):
        return world.g * (world.n - world.g) * size
    if size <= DIRECT_MAX_BYTES:
        return 2 * world.g * (world.n - world.g) * size / world.n
    return ring_bytes_per_host(size, world)


# ---- gossip and DiLoCo ------------------------------------------------------------------------

def exponential_distances(n):
    """algorithms/peer_graph.cc, exponential with peers = 1: at step k rank i sends to
    i + 2^(k mod T), T the period (2^T >= n, at least 1)."""
    t = max(1, math.ceil(math.log2(n))) if n > 1 else 1
    return [2 ** k for k in range(t) if 2 ** k < n] or [1]


def push_sum_round(size, world, link, cpu_per_element=0.0):
    """algorithms/push_sum.cc (one round of gossipcc.push_sum_round, graph exponential:peers=1):
    every rank sends its buffer and weight to one peer and receives from one, a message on a
    connection idle since the previous round (idle_message); the host's ranks whose peer is on
    another host share its NIC. Averaged over the graph's period.
    cpu: the mix of the received buffer, cpu_per_element per element (measured)."""
    if world.n == 1:
        return Cost(0.0, 0.0, 0.0)
    costs = []
    for d in exponential_distances(world.n):
        s = off_host_senders(world, d)
        if s:
            rate = shared_rate(link, s)
            costs.append((idle_message(size + 8, link.alpha, rate, link.rtt, link.restart) - (size + 8) / rate, (size + 8) / rate))
        else:
            costs.append((link.local_alpha, (size + 8) / link.local_rate))
    k = len(costs)
    return Cost(sum(a for a, _ in costs) / k, sum(w for _, w in costs) / k, size / 4 * cpu_per_element)


def push_sum_bytes_per_host(size, world):
    ds = exponential_distances(world.n)
    return sum(off_host_senders(world, d) for d in ds) * (size + 8) / len(ds)


def diloco_step(compute, sync, every):
    """torch_backend/python/gossipcc/diloco.py (blocking outer sync): H inner steps of `compute`
    seconds, then one outer sync of `sync` seconds: per inner step compute + sync / H."""
    if every < 1:
        raise ModelError(f"DiLoCo: the outer sync's period H must be >= 1 step, got {every}")
    return compute + sync / every


def hierarchical(method_cost, world, link, size):
    """The topology-aware form of a method: the host's G ranks reduce `size` bytes over the
    intra-host link (a ring among G), one rank per host runs method_cost(World(H, 1)), then a
    broadcast inside the host (the ring's second half: counted in the same ring)."""
    inner = World(1, world.g)
    intra = ring_allreduce(size, inner, link)
    outer = method_cost(World(world.hosts, 1))
    return Cost(intra.latency + outer.latency, intra.wire + outer.wire, intra.cpu + outer.cpu)


# ---- calibration ------------------------------------------------------------------------------

def fit_alpha_beta(sizes, times):
    """Least squares of time = a + size / b over (size, time) pairs: (a, b). The sizes must
    differ; ModelError when the slope is not positive (the timings do not grow with the size)."""
    if len(sizes) != len(times) or len(sizes) < 2:
        raise ModelError(f"fit_alpha_beta: needs >= 2 (size, time) pairs, got {len(sizes)} sizes, {len(times)} times")
    k = len(sizes)
    mx, my = sum(sizes) / k, sum(times) / k
    sxx = sum((x - mx) ** 2 for x in sizes)
    if sxx == 0:
        raise ModelError("fit_alpha_beta: every size is the same")
    slope = sum((x - mx) * (y - my) for x, y in zip(sizes, times)) / sxx
    if not slope > 0:
        raise ModelError(f"fit_alpha_beta: the times do not grow with the size (slope {slope:.3g} s/byte)")
    return max(0.0, my - slope * mx), 1.0 / slope


def step_cost(seconds, size, world, link, gloo=False):
    """The per-step cost between hosts of a ring (link.ring, or link.gloo) that makes
    ring_allreduce(size) take `seconds`: (seconds - wire - the steps inside hosts) / the steps
    between hosts. The calibration's inverse of ring_allreduce."""
    zero = Link(link.alpha, link.beta, link.nic, link.local_alpha, link.local_rate, ring=0.0, gloo=0.0, rtt=link.rtt)
    base = ring_allreduce(size, world, zero, gloo=gloo)
    crossing = 2 * (world.n - 1) * world.hosts / world.n
    if world.hosts < 2:
        raise ModelError("step_cost: a ring inside one host has no step between hosts")
    return max(0.0, (seconds - base.latency - base.wire) / crossing)


def per_delay(values):
    """(one-way delays per message, seconds) of a per-message cost from [(delay, cost)]: the
    seconds from the configurations without delay (median; 0 without one), the delays per
    message the median of (cost - seconds) / delay over the others (1 without one)."""
    import statistics
    flat = [c for d, c in values if d == 0]
    base = statistics.median(flat) if flat else 0.0
    slopes = [(c - base) / d for d, c in values if d > 0]
    return (statistics.median(slopes) if slopes else 1.0), base


def error_percent(predicted, measured):
    """(predicted - measured) / measured, in percent."""
    if not measured > 0:
        raise ModelError(f"measured time must be > 0, got {measured}")
    return 100.0 * (predicted - measured) / measured
