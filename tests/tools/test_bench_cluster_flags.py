"""The cluster flags every benchmark of tools/bench takes (common.add_cluster_arguments):
--hosts H --ranks-per-host G, --ranks N (N hosts of one rank), --network/--networks with the
presets (the *-wan ones too) and link specs; bad input named; each benchmark's driver accepts
them; the timed trial loop's bytes per rank and per host; a smoke run at 2 hosts x 2 ranks on
local processes (quantized_allreduce) and, where namespaces can be made, on the emulated cluster
with delay (p2p_segments: the host's bytes are its two ranks')."""
import argparse
import json
import os
import subprocess
import sys

import pytest

import bench_script

BENCH = os.path.join(bench_script.TOOLS, "bench")
SCRIPTS = ("allreduce_backends", "gossip_vs_allreduce", "hierarchical", "model_shapes", "p2p_segments", "powersgd_overlap",
           "powersgd_vs_torch", "quantized_allreduce")


def common():
    return bench_script.load("common")


def resolve(argv, **kw):
    c = common()
    p = argparse.ArgumentParser()
    c.add_cluster_arguments(p, **kw)
    args = p.parse_args(argv)
    c.resolve_cluster_arguments(args, "test")
    return args


def test_hosts_ranks_per_host_and_ranks():
    a = resolve(["--hosts", "4", "--ranks-per-host", "2", "--network", "100mbit-wan"])
    assert (a.hosts, a.ranks_per_host, a.ranks, a.network, a.networks) == (4, 2, 8, "100mbit-wan", ["100mbit-wan"])
    a = resolve(["--ranks", "3", "--network", "rate=100mbit,delay=25ms"])
    assert (a.hosts, a.ranks_per_host, a.ranks) == (3, 1, 3)
    a = resolve([], hosts=2)
    assert (a.hosts, a.ranks_per_host, a.ranks, a.network) == (2, 1, 2, "1gbit")
    a = resolve(["--hosts", "2,4", "--ranks-per-host", "2"], hosts="2,4,8", sweep_hosts=True)
    assert (a.hosts, a.ranks) == ([2, 4], [4, 8])
    a = resolve(["--networks", "local,1gbit-wan"], sweep_networks=True)
    assert a.networks == ["local", "1gbit-wan"]
    # A link spec's own commas stay with it.
    a = resolve(["--networks", "rate=100mbit,delay=25ms"], sweep_networks=True)
    assert a.networks == ["rate=100mbit,delay=25ms"]
    a = resolve(["--networks", "none,rate=1gbit,delay=10ms,jitter=1ms,loss=1%,1gbit,delay=5ms"], sweep_networks=True)
    assert a.networks == ["none", "rate=1gbit,delay=10ms,jitter=1ms,loss=1%", "1gbit", "delay=5ms"]
    assert common().split_networks("rate=1gbit,delay=1ms,delay=2ms") == ["rate=1gbit,delay=1ms", "delay=2ms"]


@pytest.mark.parametrize("argv, words", [
    (["--ranks", "4", "--hosts", "2"], "--ranks N means N hosts of one rank each"),
    (["--ranks", "4", "--ranks-per-host", "2"], "--ranks N means N hosts of one rank each"),
    (["--hosts", "two"], "--hosts must be a whole number, got 'two'"),
    (["--hosts", "1"], "needs at least 2 ranks, got 1"),
    (["--hosts", "2", "--ranks-per-host", "0"], "ranks per host must be a whole number >= 1"),
    (["--network", "rate=fast"], "bad part 'rate=fast'"),
    (["--network", "10mbit-wan"], "network '10mbit-wan'"),
])
def test_bad_flags_are_named(argv, words, capsys):
    with pytest.raises(SystemExit) as e:
        resolve(argv)
    assert e.value.code == 2 and words in capsys.readouterr().err


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_benchmark_takes_the_flags(script, tmp_path):
    out = subprocess.run([sys.executable, os.path.join(BENCH, f"{script}.py"), "--help"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for flag in ("--hosts", "--ranks-per-host", "--ranks", "--network"):
        assert flag in out.stdout, (script, flag)
    out = subprocess.run([sys.executable, os.path.join(BENCH, f"{script}.py"), "--ranks", "4", "--hosts", "2",
                          "--results-dir", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "--ranks N means N hosts of one rank each" in out.stderr, (script, out.stderr)


def test_trials_record_bytes_per_rank_and_per_host(monkeypatch):
    """run_trials: each method once per iteration in the rotating order, its time and both byte
    counts; slowest_samples: the slowest rank per iteration, bytes averaged over the ranks."""
    c = common()
    counters = iter([(0, 0), (10, 25), (10, 25), (30, 65), (30, 65), (60, 125), (60, 125), (100, 205)])
    monkeypatch.setattr(c, "tx_counters", lambda: next(counters))
    ran = []
    trials = c.run_trials(lambda: None, ["a", "b"], 2, 1,
                          lambda m: (ran.append(m), c.timed(lambda: None, lambda: None))[1])
    assert ran == ["a", "b", "b", "a"]
    assert [t["order"] for t in trials] == [["a", "b"], ["b", "a"]]
    assert trials[0]["sent"] == {"a": [10], "b": [20]} and trials[0]["host_sent"] == {"a": [25], "b": [40]}
    assert trials[1]["sent"] == {"b": [30], "a": [40]} and trials[1]["host_sent"] == {"b": [60], "a": [80]}
    other = json.loads(json.dumps(trials))
    other[0]["times"]["a"] = [5.0]
    other[0]["sent"]["a"] = [30]
    s = c.slowest_samples([{"trials": trials}, {"trials": other}], 0, ["a", "b"])
    assert s["a"]["time"] == 5.0 and s["a"]["sent"] == 20 and s["a"]["host_sent"] == 25
    assert c.slowest_samples([{"trials": [dict(trials[0], sent={"a": [], "b": []})]}], 0, ["a"])["a"]["sent"] is None


def run_bench(script, argv, tmp_path):
    out = subprocess.run([sys.executable, os.path.join(BENCH, f"{script}.py")] + argv
                         + ["--trials", "1", "--allow-load", "--results-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=600)
    return out


def test_two_hosts_of_two_local_ranks(tmp_path):
    out = run_bench("quantized_allreduce", ["--network", "local", "--hosts", "2", "--ranks-per-host", "2",
                                            "--bytes", str(64 << 10)], tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "2 hosts x 2 ranks" in out.stdout and "MB sent/host/op" in out.stdout
    (d,) = os.listdir(tmp_path)
    doc = json.loads((tmp_path / d / "results.json").read_text())
    assert (doc["args"]["hosts"], doc["args"]["ranks_per_host"], doc["args"]["ranks"]) == (2, 2, 4)


def namespaces_or_skip():
    sys.path.insert(0, bench_script.TOOLS)
    import emulated_cluster
    try:
        emulated_cluster.check_namespaces_allowed()
    except emulated_cluster.NamespacesUnavailable as e:
        pytest.skip(f"emulated network not available: {e}")


def test_two_hosts_of_two_ranks_over_a_delayed_link(tmp_path):
    """p2p_segments at 2 hosts x 2 ranks, 100 Mbit/s with 5 ms one-way delay (the delay line where
    there is no netem): every rank exchanges 256 KB with a rank of the other host, so a host's NIC
    carries its two ranks' bytes."""
    namespaces_or_skip()
    out = run_bench("p2p_segments", ["--network", "rate=100mbit,delay=5ms", "--hosts", "2", "--ranks-per-host", "2",
                                     "--bytes", str(256 << 10), "--segments", f"{256 << 10},{64 << 10}"], tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (d,) = os.listdir(tmp_path)
    doc = json.loads((tmp_path / d / "results.json").read_text())
    for seg in (str(256 << 10), str(64 << 10)):
        s = doc["summary"]["cells"]["exchange"]["methods"][seg]
        rank, host = s["sent"]["median"], s["host_sent"]["median"]
        assert 256 << 10 < rank < 1.2 * (256 << 10), (seg, rank)
        assert 1.9 * rank < host < 2.2 * rank, (seg, rank, host)


def test_quantized_over_hosts_puts_one_copy_on_each_nic(tmp_path):
    """quantized_allreduce at 2 emulated hosts x 2 ranks: the two-level variants run beside the
    flat ones (same bits on every rank, checked by the benchmark), and each host's NIC carries
    about half the flat variant's bytes (one quantized copy per host instead of two)."""
    namespaces_or_skip()
    out = run_bench("quantized_allreduce", ["--network", "100mbit", "--hosts", "2", "--ranks-per-host", "2",
                                            "--bytes", str(1 << 20)], tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "vs flat" in out.stdout, out.stdout[-3000:]
    (d,) = os.listdir(tmp_path)
    doc = json.loads((tmp_path / d / "results.json").read_text())
    methods = doc["summary"]["cells"]["all-reduce"]["methods"]
    for bits in (8, 4):
        flat = methods[f"quantized {bits} bits"]["host_sent"]["median"]
        over = methods[f"quantized {bits} bits over hosts"]["host_sent"]["median"]
        assert 0.4 * flat < over < 0.65 * flat, (bits, flat, over)
