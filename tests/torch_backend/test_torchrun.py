"""python -m gossipcc.torchrun takes torchrun's options in both spellings on every torch
(docs/getting-started.md and docs/pytorch.md write `--nproc-per-node`, which torch 1.13's own
launcher refuses), and leaves the training script's arguments alone."""
import subprocess
import sys
import textwrap

from emulated_cluster import free_port

SCRIPT = textwrap.dedent("""
    import os, sys, torch, torch.distributed as dist, gossipcc
    dist.init_process_group(backend="gossipcc")
    t = torch.ones(3) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    # One write per line: the ranks share torchrun's stdout pipe.
    os.write(1, f"rank {dist.get_rank()} of {dist.get_world_size()} sum {t.tolist()} argv {sys.argv[1:]}\\n".encode())
    dist.destroy_process_group()
""")


def test_hyphen_spellings_launch_two_ranks(tmp_path):
    """The documented command line, hyphens throughout, and a script argument spelled like a
    torchrun option that must reach the script unchanged."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    cmd = [sys.executable, "-m", "gossipcc.torchrun", "--nnodes=1", "--nproc-per-node=2",
           "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}", "--rdzv-id", "job1",
           "--max-restarts=0", str(script), "--nproc-per-node=7", "--max_restarts", "x"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    for r in range(2):
        line = f"rank {r} of 2 sum [3.0, 3.0, 3.0] argv ['--nproc-per-node=7', '--max_restarts', 'x']"
        assert line in out.stdout, out.stdout + out.stderr


def test_translate_flags_only_before_the_script():
    from torch.distributed.run import get_args_parser
    from gossipcc.torchrun import translate_flags
    parser = get_args_parser()
    known = {o for a in parser._actions for o in a.option_strings}
    under = lambda o: o if o in known else "--" + o[2:].replace("-", "_")  # noqa: E731
    argv = ["--nproc-per-node", "2", "--master-addr=h0", "--standalone", "--node-rank", "1",
            "-m", "pkg.train", "--nproc-per-node", "3", "--log-dir=x"]
    assert translate_flags(argv, parser) == [
        under("--nproc-per-node"), "2", under("--master-addr") + "=h0", "--standalone", under("--node-rank"), "1",
        "-m", "pkg.train", "--nproc-per-node", "3", "--log-dir=x"]
    # A value that looks like an option name is the option's value, not an option.
    assert translate_flags(["--rdzv-id", "--max-restarts", "t.py"], parser)[1:] == ["--max-restarts", "t.py"]
    # Everything after "--" is the script's.
    assert translate_flags(["--nnodes=1", "--", "t.py", "--rdzv-backend=c10d"], parser)[1:] == [
        "--", "t.py", "--rdzv-backend=c10d"]
    # Every option torchrun spells with "_" is accepted with "-" too, parsed the same.
    pairs = [(a, o) for a in parser._actions for o in a.option_strings if o.startswith("--") and "_" in o]
    assert len(pairs) >= 10, pairs  # nproc_per_node, rdzv_backend, rdzv_endpoint, node_rank, master_addr, ...
    for action, opt in pairs:
        value = [] if action.nargs == 0 else [sorted(action.choices)[0] if action.choices else "1"]
        hyphen = opt.replace("_", "-")
        assert parser.parse_args(translate_flags([hyphen] + value + ["t.py"], parser)) == \
            parser.parse_args([opt] + value + ["t.py"]), opt
