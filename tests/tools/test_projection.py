"""tools/bench/projection_model.py and projection.py: each formula against a value computed by
hand in the test, the calibration's fits recovering their constants from synthetic timings, the
check table flagging an error above 15% with the term that dominates, the projection from a
made-up check document, and bad input named."""
import math
import os
import subprocess
import sys

import pytest

import bench_script


def pm():
    return bench_script.load("projection_model")


def link(m, **kw):
    base = dict(alpha=0.01, beta=1e6, nic=1e7, local_alpha=0.001, local_rate=1e9)
    base.update(kw)
    return m.Link(**base)


def test_ring_allreduce_by_hand():
    m = pm()
    # 4 hosts of 1: 6 steps of 1 MB at 1 MB/s, each step 10 ms (link.ring, defaulting to alpha).
    c = m.ring_allreduce(4e6, m.World(4, 1), link(m), cpu_per_byte=1e-9)
    assert c.latency == pytest.approx(0.06) and c.wire == pytest.approx(6.0) and c.cpu == pytest.approx(4e-3)
    # gloo's ring uses link.gloo.
    assert m.ring_allreduce(4e6, m.World(4, 1), link(m, gloo=0.02), gloo=True).latency == pytest.approx(0.12)
    # 2 hosts of 2: half the hops cross hosts: 6 x (0.5 x 10 ms + 0.5 x 1 ms); the NIC still
    # carries one stream, so the wire term is unchanged.
    c = m.ring_allreduce(4e6, m.World(2, 2), link(m))
    assert c.latency == pytest.approx(0.033) and c.wire == pytest.approx(6.0)
    assert m.ring_bytes_per_host(4e6, m.World(4, 1)) == pytest.approx(6e6)
    # Idle connections: the first step's 100 kB chunk in slow start (14480 + 28960 bytes in two
    # round trips of 0.1 s, then the rest at 1 MB/s) instead of 0.1 s at beta.
    c = m.ring_allreduce(4e5, m.World(4, 1), link(m, rtt=0.1), idle=True)
    assert c.latency == pytest.approx(6 * 0.01 + 0.2 + (1e5 - 43_440) / 1e6 - 0.1)
    assert m.ring_allreduce(4e5, m.World(4, 1), link(m, rtt=0.1)).latency == pytest.approx(0.06)


def test_eager_and_direct_by_hand():
    m = pm()
    w = m.World(4, 1)
    assert m.eager_max_bytes(4) == (128 << 10) // 3
    # Eager: one exchange, each rank sends its 1000 bytes to 3 peers: max(3000 / nic, 1000 / beta).
    c = m.gossipcc_allreduce(1000, w, link(m, exchange=0.02))
    assert c.latency == pytest.approx(0.02) and c.wire == pytest.approx(1e-3)
    # Direct (above the eager limit, up to 512 KiB): the check and two exchanges of size / 4 per peer.
    size = 400_000
    c = m.gossipcc_allreduce(size, w, link(m, exchange=0.02, nic=2e6))
    assert c.latency == pytest.approx(0.06)
    assert c.wire == pytest.approx(2 * max(3 * size / 4 / 2e6, size / 4 / 1e6))
    # Above 512 KiB: the ring.
    assert m.gossipcc_allreduce(1 << 20, w, link(m)) == m.ring_allreduce(1 << 20, w, link(m))


def test_quantized_by_hand():
    m = pm()
    assert m.quantized_bytes(1000, 8) == 4 * 4 + 1000
    assert m.quantized_bytes(1000, 4) == 4 * 4 + 500
    with pytest.raises(m.ModelError, match="bits must be 4 or 8"):
        m.quantized_bytes(1000, 2)
    count = 1 << 20
    q = 4096 * 4 + count
    chunk = q / 4
    # No delay (no slow start): the check, 3 scatter rounds and 3 gather steps of one alpha each.
    c = m.quantized_allreduce(count, 8, m.World(4, 1), link(m, exchange=0.02), cpu_per_element=1e-8)
    assert c.latency == pytest.approx(0.02 + 3 * 0.01 + 3 * 0.01)
    assert c.wire == pytest.approx(6 * chunk / 1e6)
    assert c.cpu == pytest.approx(count * 1e-8)
    # 2 hosts of 2 (host 0: ranks 0 and 1): round 1 sends 0->1 (inside) and 1->2 (off the host),
    # round 2 0->2 and 1->3 (both off: they share the NIC, here 1.5 MB/s: 0.75 MB/s each), round
    # 3 0->3 (off) and 1->0 (inside); then the gather ring's 3 steps at beta.
    c = m.quantized_allreduce(count, 8, m.World(2, 2), link(m, exchange=0.02, nic=1.5e6))
    assert c.wire == pytest.approx(chunk / 1e6 + chunk / 0.75e6 + chunk / 1e6 + 3 * chunk / 1e6)
    assert m.quantized_bytes_per_host(count, 8, m.World(2, 2)) == pytest.approx((1 + 2 + 1) * chunk + 3 * chunk)


def test_slow_start_after_idle_by_hand():
    m = pm()
    # Window 14480 then 28960 (two round trips), then 56560 bytes at 1 MB/s (rate x rtt = 100 kB).
    assert m.idle_message(100_000, 0.0, 1e6, 0.1) == pytest.approx(0.2 + (100_000 - 43_440) / 1e6)
    assert m.idle_message(100_000, 0.005, 1e6, 0.0) == pytest.approx(0.105)
    # tcp_cwnd_restart: halved per retransmission timeout (rtt + 200 ms) of idle time, down to the floor.
    assert m.restart_after(0.5, 0.05, 1e6) == pytest.approx(2.5e5)
    assert m.restart_after(0.1, 0.05, 1e6) == pytest.approx(1e6)
    assert m.restart_after(10.0, 0.05, 1e6) == 14480 and m.restart_after(10.0, 0.05, 1e6, floor=5e4) == 5e4


def test_powersgd_push_sum_diloco_by_hand():
    m = pm()
    assert not m.psgd_compressed((8, 8)) and m.psgd_compressed((64, 64)) and not m.psgd_compressed((100,))
    assert m.psgd_sizes([(64, 64), (100,)]) == (400, 64 * 4 * 4, 64 * 4 * 4, 64 * 64 * 4)
    w = m.World(4, 1)
    ln = link(m, exchange=0.02)
    c = m.powersgd_allreduce([(64, 64), (100,)], w, ln, cpu_per_nmr=1e-9)
    # The check carries the exact part and the first P (1424 bytes, within the eager limit), then
    # the Q all-reduce (eager, 1024 bytes): two exchanges.
    assert c.latency == pytest.approx(2 * 0.02)
    assert c.wire == pytest.approx(sum(max(3 * b / 1e7, b / 1e6) for b in (1424, 1024)))
    assert m.powersgd_bytes_per_host([(64, 64), (100,)], w) == pytest.approx(3 * (1424 + 1024))
    # Above the eager limit the exact part and P go in all-reduces of their own (direct: 3 exchanges each).
    big = [(2048, 2048), (40_000,)]
    exact, p, q, _ = m.psgd_sizes(big)
    assert exact + p > m.eager_max_bytes(4)
    assert m.powersgd_allreduce(big, w, ln).latency == pytest.approx(
        0.02 + sum(m.gossipcc_allreduce(b, w, ln).latency for b in (exact, p, q)))
    assert c.cpu == pytest.approx(64 * 64 * 4 * 1e-9)
    assert m.exponential_distances(4) == [1, 2] and m.exponential_distances(8) == [1, 2, 4]
    c = m.push_sum_round(1e6, w, ln, cpu_per_element=4e-9)
    assert c.latency == pytest.approx(0.01) and c.wire == pytest.approx((1e6 + 8) / 1e6) and c.cpu == pytest.approx(1e-3)
    # 2 hosts of 2: distance 1 sends off the host from one rank of each host, distance 2 from both.
    assert m.push_sum_bytes_per_host(1000, m.World(2, 2)) == pytest.approx(1.5 * 1008)
    assert m.diloco_step(1.0, 2.0, 4) == pytest.approx(1.5)
    with pytest.raises(m.ModelError, match="H must be >= 1"):
        m.diloco_step(1.0, 2.0, 0)


def test_links_and_rates():
    m = pm()
    assert m.stream_rate(1.25e8, 0.05, 3e6) == pytest.approx(3e7)
    assert m.stream_rate(1.25e8, 0.05, 3e6, streams=2) == pytest.approx(6e7)
    assert m.stream_rate(1.25e8, 0.0, 3e6) == 1.25e8
    costs = {"alpha": (4.0, 0.001), "exchange": (1.0, 0.0), "ring": (2.0, 0.0005), "gloo": (3.0, 0.0)}
    ln = m.network_link(1e9, 0.01, 3e6, costs)
    assert ln.alpha == pytest.approx(0.041) and ln.ring == pytest.approx(0.0205) and ln.gloo == pytest.approx(0.03)
    assert ln.nic == pytest.approx(1e9 / 8 * 1448 / 1514) and ln.beta == pytest.approx(1.5e8 if 1.5e8 < ln.nic else ln.nic)
    assert m.shared_rate(ln, 8) == pytest.approx(min(ln.beta, ln.nic / 8))
    with pytest.raises(m.ModelError, match="no per-message cost for gloo"):
        m.network_link(1e9, 0.01, 3e6, {k: v for k, v in costs.items() if k != "gloo"})
    with pytest.raises(m.ModelError, match="beta must be > 0"):
        m.Link(0.01, 0.0, 1e6)
    with pytest.raises(m.ModelError, match="streams per peer must be >= 1"):
        m.stream_rate(1e6, 0.01, 1e5, streams=0)


def test_hierarchical_form():
    m = pm()
    w = m.World(4, 8)
    ln = link(m)
    flat = m.push_sum_round(8e6, w, ln)
    hier = m.hierarchical(lambda x: m.push_sum_round(8e6, x, ln), w, ln, 8e6)
    # Hierarchical: the intra-host ring, then one rank per host (4 hosts: distances 1 and 2, both off).
    assert hier.wire == pytest.approx(m.push_sum_round(8e6, m.World(4, 1), ln).wire
                                      + m.ring_allreduce(8e6, m.World(1, 8), ln).wire)
    assert m.push_sum_bytes_per_host(8e6, m.World(4, 1)) == pytest.approx(8e6 + 8)
    # Flat, 32 ranks: distances 1, 2, 4, 8, 16 send 1, 2, 4, 8, 8 of a host's 8 ranks off the
    # host, which share its NIC (nic / s against beta).
    assert m.push_sum_bytes_per_host(8e6, w) == pytest.approx((1 + 2 + 4 + 8 + 8) / 5 * (8e6 + 8))
    assert flat.wire == pytest.approx(sum((8e6 + 8) / min(1e6, 1e7 / s) for s in (1, 2, 4, 8, 8)) / 5)


def test_fits_recover_their_constants():
    m = pm()
    sizes = [8, 128 << 10, 512 << 10, 2 << 20]
    noise = [1e-4, -1e-4, 5e-5, -5e-5]
    a, b = m.fit_alpha_beta(sizes, [0.004 + s / 5e6 + e for s, e in zip(sizes, noise)])
    assert a == pytest.approx(0.004, rel=0.05) and b == pytest.approx(5e6, rel=0.02)
    with pytest.raises(m.ModelError, match="do not grow with the size"):
        m.fit_alpha_beta([1, 2, 3], [3.0, 2.0, 1.0])
    with pytest.raises(m.ModelError, match="every size is the same"):
        m.fit_alpha_beta([5, 5], [1.0, 2.0])
    # step_cost inverts ring_allreduce.
    for world in (m.World(4, 1), m.World(2, 2)):
        ln = link(m, ring=0.013, gloo=0.021)
        t = m.ring_allreduce(640 << 10, world, ln).total
        assert m.step_cost(t, 640 << 10, world, link(m)) == pytest.approx(0.013)
        t = m.ring_allreduce(64 << 10, world, ln, gloo=True).total
        assert m.step_cost(t, 64 << 10, world, link(m), gloo=True) == pytest.approx(0.021)
    # restart_window inverts idle_message: 2 MiB at 4 MB/s, rtt 50 ms, from a window of 4 x 14480.
    extra = m.idle_message(2 << 20, 0.0, 4e6, 0.05, 4 * 14480) - (2 << 20) / 4e6
    w = m.restart_window(extra, 2 << 20, 4e6, 0.05)
    assert 2 * 14480 < w <= 4 * 14480
    assert m.idle_message(2 << 20, 0.0, 4e6, 0.05, w) == pytest.approx(extra + (2 << 20) / 4e6)
    assert m.restart_window(0.0, 2 << 20, 4e6, 0.05) == pytest.approx(4e6 * 0.05)  # no slow start seen
    d, s = m.per_delay([(0.0, 0.002), (0.025, 0.102), (0.025, 0.098)])
    assert s == pytest.approx(0.002) and d == pytest.approx(3.92)
    assert m.per_delay([(0.01, 0.05)]) == pytest.approx((5.0, 0.0))


def test_check_table_flags_errors_above_the_goal():
    p = bench_script.load("projection")
    Cost = p.pm.Cost
    predicted = {"4x1 x: DDP step": {"a": Cost(0.01, 0.1, 0.0), "b": Cost(0.2, 0.01, 0.01)}}
    measured = {"4x1 x: DDP step": {"a": {"median": 0.1, "min": 0.1, "max": 0.1, "n": 5},
                                    "b": {"median": 0.3, "min": 0.3, "max": 0.3, "n": 5}}}
    rows = {r[1]: r for r in p.check_rows(predicted, measured)}
    assert rows["a"][4] == pytest.approx(10.0) and rows["a"][5] == ""
    assert rows["b"][4] == pytest.approx(-(1 - 0.22 / 0.3) * 100)
    assert rows["b"][5] == "**> 15%**: -80 ms, the latency term 200 ms"


def test_configs_and_bad_input():
    p = bench_script.load("projection")
    assert p.parse_configs("4x1@rate=100mbit;2x2@rate=100mbit,delay=25ms") == [
        (4, 1, "rate=100mbit"), (2, 2, "rate=100mbit,delay=25ms")]
    for bad, what in (("4@rate=1gbit", "not HxG@network"), ("1x4@rate=1gbit", "at least 2 hosts"), ("", "no configuration"),
                      ("4x1@rate=fast", "rate")):
        with pytest.raises(ValueError, match=what):
            p.parse_configs(bad)


def fake_check(p):
    """A check document as run_check writes it, with made-up figures."""
    layout = p.model_shapes.Layout("resnet50", 0.01, 25.0)
    local = {"resnet50 DDP step": {m: 0.01 for m in ("gloo", "gossipcc exact", "quantized 8 bits", "quantized 4 bits",
                                                     "PowerSGD r4 (gossipcc)")},
             "resnet50 DiLoCo outer sync": {m: 0.02 for m in ("gloo", "gossipcc exact", "quantized 8 bits",
                                                              "quantized 4 bits", "push-sum round (gossipcc)")}}
    configs = {}
    for name, delay, alpha in (("a", 0.0, 0.001), ("b", 0.025, 0.101)):
        ln = {"alpha": alpha, "exchange": alpha / 2, "ring": alpha / 2, "gloo": alpha, "nic": 1.2e7,
              "beta": 1.2e7 if delay == 0 else 6e6, "rtt": 2 * delay, "restart": 14480 if delay == 0 else 100_000}
        configs[name] = {"hosts": 4, "ranks_per_host": 1, "delay": delay, "fits": {"cross": [alpha, ln["beta"]]},
                         "link": ln, "local": local}
    return {"info": {"mode": "check", "cores": 2, "configs": configs}, "args": {"scale": 0.01},
            "commit": {"head": "0" * 40}}, layout


def test_projection_from_a_check():
    p = bench_script.load("projection")
    s = p.projection_scale
    check, layout = fake_check(p)
    k = s.constants(check)
    assert k["costs"]["alpha"] == pytest.approx((4.0, 0.001))
    assert k["window"] == pytest.approx(6e6 * 0.05) and k["window_from"] == "calibrated"
    assert k["restart"] == 100_000  # from the delayed configuration only
    # 4 ranks on 2 cores: the local time counts for half a core's work.
    assert k["cpu"]["diloco/push-sum round (gossipcc)"] == pytest.approx(0.02 * 0.5 / layout.total)
    args = type("A", (), dict(compute_124m=0.25, compute_1b=2.0, diloco_h=20, streams=1, gpus_per_host=8,
                              intra_gbit=1200.0, intra_alpha_us=10.0))()
    rows = s.project(k, args)
    assert len(rows) == 2 * 3 * 2 * 2
    one = rows[0]
    assert one["model"] == "124M" and one["parameters"] == 124_439_808
    assert rows[-1]["model"] == "1B" and 1.0e9 < rows[-1]["parameters"] < 1.05e9
    c = one["costs"]
    # DiLoCo at H = 20 sends a twentieth of its sync's bytes per step; 4 bits fewer than exact.
    assert c["DiLoCo 4 bits"][1] < c["DiLoCo exact"][1] < c["DDP (exact ring)"][1]
    # 8 hosts of 8: push-sum's distances 1..32 send 1, 2, 4, 8, 8, 8 of a host's ranks off the
    # host; hierarchically one message per host.
    assert c["push-sum (SGP)"][1] == pytest.approx(31 / 6 * c["push-sum, hierarchical"][1])
    for col in s.COLUMNS:
        assert c[col][0] > 0.25
    doc = {"args": vars(args) | {}, "info": {"calibration": "x", "calibration_commit": {"head": "0" * 40},
                                             "constants": k, "rows": rows}}
    doc["args"] = {"gpus_per_host": 8, "intra_gbit": 1200.0, "intra_alpha_us": 10.0, "streams": 1,
                   "compute_124m": 0.25, "compute_1b": 2.0, "diloco_h": 20}
    text = s.report(doc)
    assert "Time per step" in text and "Bytes per step per host" in text and text.count("| 124M |") == 24


def test_project_refuses_a_non_check_document():
    p = bench_script.load("projection")
    with pytest.raises(p.harness.HarnessError, match="not a results file of `projection.py check`"):
        p.projection_scale.constants({"info": {"mode": "project"}})
    assert math.isfinite(p.GOAL_PERCENT)


def test_flags_of_the_other_mode_are_refused():
    script = os.path.join(bench_script.TOOLS, "bench", "projection.py")
    for argv, what in ((["check", "--streams", "2"], "--streams: not a flag of check"),
                       (["project", "--calibration", "x", "--trials", "3"], "--trials: not a flag of project"),
                       (["project"], "project needs --calibration"),
                       (["check", "--configs", "4x1"], "not HxG@network")):
        r = subprocess.run([sys.executable, script] + argv, capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and what in r.stderr, (argv, r.stderr)
