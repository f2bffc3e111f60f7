"""The examples in torch_backend/python/examples run and learn (so that docs/algorithms.md's
commands keep working), and their ranks communicate: each method's ranks end closer than ranks
that never communicate."""
import os
import re
import subprocess
import sys

EXAMPLE = os.path.join("torch_backend", "python", "examples", "train_algorithms.py")


def test_train_algorithms_every_method():
    out = subprocess.run([sys.executable, EXAMPLE, "--world-size", "4", "--steps", "40"], capture_output=True,
                         text=True, timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    rows = {m.group(1): (float(m.group(2)), float(m.group(3)), float(m.group(4)), float(m.group(5)))
            for m in re.finditer(r"^(\w+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", out.stdout, re.M)}
    assert set(rows) == set(METHODS), out.stdout
    for method, (first, last, acc, _) in rows.items():
        assert last < 0.6 * first and acc > 0.6, (method, out.stdout)
    # The ranks communicated: how far apart their models were before any final averaging, against
    # "local" (each rank alone on its own data). Exact averaging: one model (diloco's
    # step 40 is an outer step); gossip and elastic averaging: apart, but well below local
    # (0.12-0.33 of it here); Streaming DiLoCo with mix=0.5 between outer steps: 0.64 of it.
    apart = {method: row[3] for method, row in rows.items()}
    local = apart.pop("local")
    assert local > 0.1, out.stdout
    for method in ("uneven", "allreduce", "powersgd", "powersgd_hook", "diloco"):
        assert apart[method] == 0.0, (method, out.stdout)
    for method in ("sgp", "osgp", "dpsgd", "adpsgd", "easgd", "gossip_hook"):
        assert 0.0 < apart[method] < 0.5 * local, (method, out.stdout)
    assert apart["streaming_diloco"] < 0.8 * local, out.stdout


METHODS = ("sgp", "osgp", "dpsgd", "adpsgd", "easgd", "uneven", "allreduce", "powersgd", "powersgd_hook", "gossip_hook",
           "diloco", "streaming_diloco", "local")


def test_train_algorithms_help_lists_every_method():
    out = subprocess.run([sys.executable, EXAMPLE, "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    listed = re.findall(r"^  (\w+)  +\S", out.stdout.split("methods:", 1)[-1], re.M)
    assert listed == list(METHODS), out.stdout
    assert "DiLoCo(sync_every=10, fragments=2, overlap=2, mix=0.5)" in out.stdout, out.stdout


CUSTOM_GRAPH = os.path.join("torch_backend", "python", "examples", "custom_peer_graph.py")


def replay_push_sum(spec, n, rounds):
    """Push-sum on an "edges:" spec, computed here: at round k (phase k mod phases) a rank with
    d out-peers keeps 1/(d+1) of (x, w) and sends 1/(d+1) to each. Returns [(z, w)] per round."""
    phases = [[tuple(int(v) for v in e.split(">")) for e in phase.split(",")] for phase in spec[len("edges:"):].split(";")]
    x, w = [r + 1.0 for r in range(n)], [1.0] * n
    out = []
    for k in range(rounds):
        edges = phases[k % len(phases)]
        degree = [sum(1 for a, _ in edges if a == r) for r in range(n)]
        share = [1.0 / (d + 1) for d in degree]
        nx, nw = [x[r] * share[r] for r in range(n)], [w[r] * share[r] for r in range(n)]
        for a, b in edges:
            nx[b] += x[a] * share[a]
            nw[b] += w[a] * share[a]
        x, w = nx, nw
        out.append(([x[r] / w[r] for r in range(n)], list(w)))
    return out


def test_custom_peer_graph_example():
    out = subprocess.run([sys.executable, CUSTOM_GRAPH], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    source = open(CUSTOM_GRAPH).read()
    graph = re.search(r'^GRAPH = "([^"]+)"', source, re.M).group(1)
    # The bad list is refused with the reason.
    assert re.search(r"^refused 'edges:0>1,1>2,2>0': .*rank 3 is never reached", out.stdout, re.M), out.stdout
    # Push-sum on the custom graph: every rank's de-biased value and weight, round by round.
    rounds = [(int(m.group(1)), [float(v) for v in m.group(2).split()], [float(v) for v in m.group(3).split()])
              for m in re.finditer(r"^round (\d+): z ([-\d.e ]+) w ([-\d.e ]+)$", out.stdout, re.M)]
    expected = replay_push_sum(graph, 4, 6)
    assert [k for k, _, _ in rounds] == list(range(6)), out.stdout
    for (k, z, w), (ez, ew) in zip(rounds, expected):
        assert all(abs(a - b) <= 1e-12 * max(1.0, abs(b)) for a, b in zip(z + w, ez + ew)), (k, z, w, ez, ew)
    assert any(abs(v - 1.0) > 0.05 for _, ew in expected for v in ew), "the weights never leave 1: no test of de-biasing"
    assert abs(sum(rounds[-1][2]) - 4.0) < 1e-12, rounds[-1]  # push-sum conserves the weights
    # Training on the custom graphs learns.
    trained = {m.group(1): (float(m.group(2)), float(m.group(3)), float(m.group(4)))
               for m in re.finditer(r"^train (\w+) ([\d.]+) ([\d.]+) ([\d.]+)$", out.stdout, re.M)}
    assert set(trained) == {"sgp", "dpsgd"}, out.stdout
    for method, (first, last, acc) in trained.items():
        assert last < 0.6 * first and acc > 0.6, (method, out.stdout)
