"""examples/slurm/train.sbatch on a real (one-machine) Slurm cluster: tools/slurm_cluster.sh
starts munged, slurmctld and slurmd (4 task slots), `sbatch --wait` runs the DDP example with 4
tasks on backend gossipcc, and every rank's result file must say world size 4, a finite loss and
the same parameters. The cluster is stopped in a `finally` (SIGTERM from Bazel's timeout included)
and nothing of it may be left running. Skips, with the script's one-line reason, where the
machine cannot run the daemons (not root, or a daemon refused for a permission or kernel limit).
"""
import glob
import json
import math
import os
import random
import signal
import socket
import subprocess
import tempfile
import time

import pytest

# run_pytest.sh runs from the runfiles root, which holds tools/ and examples/ as in the source.
ROOT = os.environ.get("TEST_SRCDIR") and os.getcwd() or os.path.join(os.path.dirname(__file__), "..", "..")
CLUSTER = os.path.join(ROOT, "tools", "slurm_cluster.sh")
SBATCH = os.path.join(ROOT, "examples", "slurm", "train.sbatch")
CANNOT_RUN = 77
RANKS = 4


def free_port_pair():
    """A port p with p and p + 1 free (slurmctld's and slurmd's), away from the ephemeral range."""
    for _ in range(200):
        port = random.randrange(16000, 30000, 2)
        try:
            for p in (port, port + 1):
                with socket.socket() as s:
                    s.bind(("0.0.0.0", p))
            return port
        except OSError:
            continue
    raise RuntimeError("no free port pair found")


def leftovers(state_dir):
    out = subprocess.run(["pgrep", "-a", "-f", state_dir], stdout=subprocess.PIPE, text=True).stdout
    return [line for line in out.splitlines() if "pgrep" not in line]


@pytest.fixture
def cluster():
    # A directory of its own (and ports of its own), so a developer's cluster at the default
    # /tmp/gossipcc-slurm is left alone. Short: munge's socket path must fit in sun_path.
    state_dir = tempfile.mkdtemp(prefix="gossipcc-slurm-", dir="/tmp")
    env = dict(os.environ, GOSSIPCC_SLURM_DIR=state_dir, GOSSIPCC_SLURM_PORT=str(free_port_pair()))
    env.pop("SLURM_CONF", None)

    # Bazel ends a test that runs past its timeout with SIGTERM: turn it into an exception so
    # the `finally` below still stops the daemons.
    def on_term(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        start = time.monotonic()
        proc = subprocess.run([CLUSTER, "start"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, timeout=120)
        if proc.returncode == CANNOT_RUN:
            pytest.skip(proc.stderr.strip().splitlines()[-1])
        assert proc.returncode == 0, f"slurm_cluster.sh start failed ({proc.returncode}):\n{proc.stderr}"
        print(f"cluster up in {time.monotonic() - start:.1f} s")
        env["SLURM_CONF"] = os.path.join(state_dir, "slurm.conf")
        yield env
    finally:
        start = time.monotonic()
        stop = subprocess.run([CLUSTER, "stop"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=60)
        print(f"cluster stopped in {time.monotonic() - start:.1f} s")
        signal.signal(signal.SIGTERM, previous)
        assert stop.returncode == 0, stop.stdout
        assert not os.path.exists(state_dir), f"{state_dir} left behind"
        left = leftovers(state_dir)
        assert not left, f"left running after stop: {left}"


def test_sbatch_ddp_job_on_gossipcc(cluster, tmp_path):
    env = dict(cluster, RESULT_DIR=str(tmp_path / "results"), PYTHON="/usr/bin/python3", STEPS="20")
    assert "PYTHONPATH" in env and "torch_backend" in env["PYTHONPATH"], \
        "the job finds gossipcc through the submitting environment's PYTHONPATH"
    out = tmp_path / "job.out"
    start = time.monotonic()
    # Command-line options override the script's #SBATCH lines (written for 2 nodes).
    proc = subprocess.run(
        ["sbatch", "--wait", "--parsable", "--nodes=1", f"--ntasks={RANKS}", f"--ntasks-per-node={RANKS}",
         "--time=3", f"--output={out}", SBATCH],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=170)
    elapsed = time.monotonic() - start
    job_out = out.read_text() if out.exists() else "(no job output)"
    print(f"sbatch --wait: {elapsed:.1f} s\n{job_out}")
    assert proc.returncode == 0, (
        f"sbatch exited {proc.returncode}\nstdout: {proc.stdout}\nstderr: {proc.stderr}\njob output:\n{job_out}")

    files = sorted(glob.glob(str(tmp_path / "results" / "rank*.json")))
    assert len(files) == RANKS, (files, job_out)
    results = [json.loads(open(f).read()) for f in files]
    assert sorted(r["rank"] for r in results) == list(range(RANKS))
    assert sorted(r["local_rank"] for r in results) == list(range(RANKS))
    job_id = proc.stdout.strip().split(";")[0]
    for r in results:
        assert r["world_size"] == RANKS, r
        assert r["backend"] == "gossipcc", r
        assert r["slurm_job_id"] == job_id, r
        assert r["steps"] == 20, r
        assert math.isfinite(r["final_loss"]) and math.isfinite(r["mean_final_loss"]), r
    # DDP: identical parameters on every rank, and one mean loss (an all-reduce) for all.
    assert len({r["param_sha256"] for r in results}) == 1, [(r["rank"], r["param_sha256"]) for r in results]
    assert len({r["mean_final_loss"] for r in results}) == 1, results
    # The rendezvous came from Slurm: the first host of the node list, the port from the job id.
    host = socket.gethostname().split(".")[0]
    assert {r["master"] for r in results} == {f"{host}:{20000 + int(job_id) % 20000}"}, results
