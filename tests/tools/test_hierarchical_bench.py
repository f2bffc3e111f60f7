"""tools/bench/hierarchical.py: its refusal of a run whose ranks (or a host's ranks, for the
gossip rounds over hosts) hold different bits, on made-up documents; and one small run at 2
emulated hosts x 2 ranks (1 MB, 100 Mbit/s, 5 ms delay, one trial) in which each two-level
form puts one copy of the data on each host's NIC: its bytes per host within 10% of the same
method's at 2 hosts x 1 rank, where the flat gossip rounds and the flat quantized all-reduce put
more. Skips, saying why, where network namespaces cannot be made."""
import json
import os
import subprocess
import sys

import pytest

import bench_script


def load():
    return bench_script.load("hierarchical")


def docs(differ=None):
    """Two hosts of two ranks; `differ`: (method, rank) whose digest is changed."""
    h = load()
    out = []
    for rank in range(4):
        digest = {m: "same" for m in h.METHODS}
        if differ and differ[1] == rank:
            digest[differ[0]] = "other"
        out.append({"digest": digest, "host": rank // 2, "trials": []})
    return out


def test_refuses_results_that_differ():
    h = load()
    h.check(docs())
    with pytest.raises(AssertionError, match="quantized 8 bits over hosts: ranks hold different results"):
        h.check(docs(("quantized 8 bits over hosts", 3)))
    with pytest.raises(AssertionError, match="push-sum over hosts: the ranks of host 1 hold different results"):
        h.check(docs(("push-sum over hosts", 3)))
    # Gossip rounds: hosts differ from one another, as they should.
    d = docs()
    for r in (2, 3):
        d[r]["digest"]["D-PSGD over hosts"] = "host 1's"
    h.check(d)


def test_two_hosts_of_two_ranks_one_copy_per_nic(tmp_path):
    sys.path.insert(0, bench_script.TOOLS)
    import emulated_cluster
    try:
        emulated_cluster.check_namespaces_allowed()
    except emulated_cluster.NamespacesUnavailable as e:
        pytest.skip(f"emulated network not available: {e}")
    out = subprocess.run([sys.executable, os.path.join(bench_script.TOOLS, "bench", "hierarchical.py"),
                          "--hosts", "2", "--ranks-per-host", "2", "--network", "rate=100mbit,delay=5ms",
                          "--bytes", str(1 << 20), "--trials", "1", "--allow-load", "--results-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "speed-up over flat" in out.stdout
    (d,) = os.listdir(tmp_path)
    doc = json.loads((tmp_path / d / "results.json").read_text())
    cells = doc["summary"]["cells"]
    for kind in ("push-sum", "D-PSGD", "quantized 8 bits", "PowerSGD rank 4", "exact all-reduce"):
        one = cells["2x1"]["methods"][f"{kind} flat"]["host_sent"]["median"]
        over = cells["2x2"]["methods"][f"{kind} over hosts"]["host_sent"]["median"]
        assert 0.9 * one < over < 1.1 * one, (kind, over, one)
    # D-PSGD on a ring of 4 ranks: each rank sends to two neighbours, at least one on the other host.
    flat = cells["2x2"]["methods"]["D-PSGD flat"]["host_sent"]["median"]
    assert flat > 1.4 * cells["2x1"]["methods"]["D-PSGD flat"]["host_sent"]["median"], flat
