"""`python -m gossipcc.info`: --help, every set variable checked with the backend's own checks
(invalid values and unknown GOSSIPCC_* names make the exit status 1, each named with why),
whether CUDA tensors will work, and its variable list against docs/pytorch.md's table."""
import os
import re
import subprocess
import sys

import gossipcc
import gossipcc.info

# The source tree's docs (Bazel: //docs:docs in the runfiles; by hand: the checkout).
DOCS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "pytorch.md")


def run_info(*args, **env):
    """Runs `python -m gossipcc.info ARGS` with the environment's GOSSIPCC_* and USE_LIBUV
    variables replaced by `env`."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GOSSIPCC_") and k != "USE_LIBUV"}
    clean.update(env)
    return subprocess.run([sys.executable, "-m", "gossipcc.info", *args], env=clean, capture_output=True, text=True,
                          timeout=120)


def test_help():
    out = run_info("--help")
    assert out.returncode == 0, out.stderr
    assert "usage: python -m gossipcc.info" in out.stdout and "--json" in out.stdout, out.stdout
    assert "Exit status" in out.stdout, out.stdout
    bad = run_info("--jsn")
    assert bad.returncode == 2 and "unrecognized arguments: --jsn" in bad.stderr, bad.stderr


def test_valid_settings_exit_zero():
    out = run_info(GOSSIPCC_ALLREDUCE="POWERSGD:Rank=2", GOSSIPCC_COLLECTIVE_LANES="4",
                   GOSSIPCC_POWERSGD_CPU_KERNELS="Baseline", GOSSIPCC_SOCKET_IFNAME="lo",
                   GLOO_SOCKET_IFNAME="nosuchif0")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "every setting is valid" in out.stdout, out.stdout
    # gossipcc listens on GOSSIPCC_SOCKET_IFNAME then: gloo's variable is not its to check.
    assert "GLOO_SOCKET_IFNAME                     = nosuchif0   (not used: GOSSIPCC_SOCKET_IFNAME is set)" \
        in out.stdout, out.stdout
    assert re.search(r"GOSSIPCC_ALLREDUCE +  = POWERSGD:Rank=2\n", out.stdout), out.stdout


def test_invalid_values_and_unknown_names_are_named_with_why():
    out = run_info(GOSSIPCC_COLLECTIVE_LANES="99", GOSSIPCC_ALLREDUCE="powersgd:rnak=2",
                   GOSSIPCC_CUDA_DEVICE="5", GOSSIPCC_VERIFY_COLLECTIVES="yes", GOSSIPCC_SOCKET_IFNAME="nosuchif0",
                   GOSSIPCC_POWERSGD_CPU_KERNELS="sse9", GOSSIPCC_ALLREDUCES="exact", USE_LIBUV="yes")
    assert out.returncode == 1, out.stdout + out.stderr
    lines = {line.split()[0]: line for line in out.stdout.splitlines() if line.startswith("  GOSSIPCC_")
             or line.startswith("  USE_LIBUV")}
    expected = {
        "GOSSIPCC_COLLECTIVE_LANES": "INVALID: GOSSIPCC_COLLECTIVE_LANES='99': out of range: collective_lanes must "
                                     "be in [1, 8], got 99",
        "GOSSIPCC_ALLREDUCE": "INVALID: gossipcc allreduce policy \"powersgd:rnak=2\": invalid PowerSGD options "
                              "\"rnak=2\": unknown key \"rnak\"; valid keys: rank",
        "GOSSIPCC_CUDA_DEVICE": "INVALID: GOSSIPCC_CUDA_DEVICE='5': ",
        "GOSSIPCC_VERIFY_COLLECTIVES": "INVALID: GOSSIPCC_VERIFY_COLLECTIVES must be 0 or 1, got 'yes'",
        "GOSSIPCC_SOCKET_IFNAME": "INVALID: GOSSIPCC_SOCKET_IFNAME='nosuchif0': network interface 'nosuchif0' "
                                  "does not exist on this host",
        "GOSSIPCC_POWERSGD_CPU_KERNELS": "INVALID: GOSSIPCC_POWERSGD_CPU_KERNELS='sse9': expected baseline or avx2",
        "GOSSIPCC_ALLREDUCES": "UNKNOWN: gossipcc reads no variable GOSSIPCC_ALLREDUCES; did you mean "
                               "GOSSIPCC_ALLREDUCE?",
        "USE_LIBUV": "INVALID: USE_LIBUV must be 0 or 1, got 'yes'",
    }
    for name, fragment in expected.items():
        assert name in lines and fragment in lines[name], f"{name}: {lines.get(name)}\n{out.stdout}"
    assert "8 setting(s) to fix" in out.stdout, out.stdout
    # A device that does not exist: why, as init_process_group says it.
    assert "built without CUDA" in lines["GOSSIPCC_CUDA_DEVICE"] or "no such CUDA device cuda:5" in \
        lines["GOSSIPCC_CUDA_DEVICE"], lines["GOSSIPCC_CUDA_DEVICE"]
    # The same checks in --json.
    js = run_info("--json", GOSSIPCC_COLLECTIVE_LANES="99")
    assert js.returncode == 1 and '"status": "invalid"' in js.stdout, js.stdout


def test_tool_variables_are_not_flagged():
    out = run_info(GOSSIPCC_TOOLS="/somewhere", GOSSIPCC_TEST_INIT_FILE="/tmp/x")
    assert out.returncode == 0, out.stdout
    assert "read by gossipcc's build and test tools" in out.stdout, out.stdout


def test_says_whether_cuda_tensors_work():
    import torch
    out = run_info()
    line = next(line for line in out.stdout.splitlines() if line.startswith("CUDA tensors:"))
    works, why = gossipcc.info.cuda_tensors()
    assert works == (gossipcc._build_info.WITH_CUDA and torch.cuda.is_available()), (works, why)
    if not gossipcc._build_info.WITH_CUDA:
        assert line.startswith("CUDA tensors: no, this gossipcc was built without CUDA"), line
    elif torch.version.cuda is None:
        assert line.startswith("CUDA tensors: no, this torch"), line
    elif not torch.cuda.is_available():
        assert line.startswith("CUDA tensors: no, no CUDA device is visible"), line
    else:
        assert line.startswith("CUDA tensors: yes"), line


def docs_table():
    """{name: (default, agree)} of docs/pytorch.md's "Environment variables" table, in order."""
    text = open(DOCS).read()
    section = text[text.index("### Environment variables"):]
    rows = {}
    for line in section.splitlines()[1:]:
        if line.startswith("#"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("| `") or len(cells) < 5:
            continue
        rows[cells[0].strip("`")] = (cells[1].strip("`"), cells[-1])
    return rows


def test_variable_list_agrees_with_the_docs_table():
    table = docs_table()
    listed = gossipcc.info.ENVIRONMENT
    assert list(table) == [v["name"] for v in listed], (list(table), [v["name"] for v in listed])
    for v in listed:
        default, agree = table[v["name"]]
        assert default.replace("`", "") == v["default"].replace("`", ""), (v, default)
        assert agree == ("yes" if v["agree"] else "no"), (v, agree)
