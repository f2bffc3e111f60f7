"""The examples in torch_backend/python/examples run and learn (so that docs/algorithms.md's
commands keep working)."""
import os
import re
import subprocess
import sys

EXAMPLE = os.path.join("torch_backend", "python", "examples", "train_algorithms.py")


def test_train_algorithms_every_method():
    out = subprocess.run([sys.executable, EXAMPLE, "--world-size", "4", "--steps", "40"], capture_output=True,
                         text=True, timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    rows = {m.group(1): (float(m.group(2)), float(m.group(3)), float(m.group(4)))
            for m in re.finditer(r"^(\w+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", out.stdout, re.M)}
    assert set(rows) == {"sgp", "osgp", "dpsgd", "adpsgd", "easgd", "uneven", "allreduce", "powersgd",
                         "powersgd_hook", "gossip_hook"}, out.stdout
    for method, (first, last, acc) in rows.items():
        assert last < 0.6 * first and acc > 0.6, (method, out.stdout)
