"""tools/suite_skips.py: every case of a distributed_test.py log gets its outcome and reason."""
import importlib.util
import os
import subprocess
import sys

TOOLS = os.environ.get("GOSSIPCC_TOOLS") or os.path.join(os.path.dirname(__file__), "..", "..", "tools")
SCRIPT = os.path.join(TOOLS, "suite_skips.py")

LOG = """\
test_a (__main__.TestGossipccBackend.test_a) ... skipped 'CUDA is not available.'
test_b (__main__.TestGossipccBackend.test_b) ... INFO:torch.testing._internal.common_distributed:Started process 0
INFO:torch.testing._internal.common_distributed:Started process 1
ok
test_c (__main__.TestGossipccBackend.test_c) ... skipped "Test requires backend to be one of {'gloo'}"
test_d (__main__.TestGossipccBackend.test_d)
Runs something using default inputs ... skipped 'get_future is only supported on mpi, nccl and gloo'
test_e (__main__.TestGossipccBackend.test_e) ... ERROR
test_f (__main__.TestGossipccBackend.test_f) ... skipped 'a reason nobody has classified'
test_g (__main__.TestGossipccBackend.test_g) ... ok
----------------------------------------------------------------------
Ran 7 tests in 1.0s

FAILED (errors=1, skipped=4)
"""


def load():
    spec = importlib.util.spec_from_file_location("suite_skips", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_outcomes_and_reasons():
    outcome = load().parse(LOG.splitlines())
    assert outcome == {
        "test_a": ("skipped", "CUDA is not available."),
        "test_b": ("ok", ""),  # after the ranks' log lines
        "test_c": ("skipped", "Test requires backend to be one of {'gloo'}"),  # double-quoted
        "test_d": ("skipped", "get_future is only supported on mpi, nccl and gloo"),  # docstring line
        "test_e": ("fail", ""),
        "test_f": ("skipped", "a reason nobody has classified"),
        "test_g": ("ok", ""),
    }


def test_page_counts_and_flags_unclassified_reasons(tmp_path):
    log = tmp_path / "test.log"
    log.write_text(LOG)
    page = subprocess.run([sys.executable, SCRIPT, str(log), "--title", "t"], capture_output=True, text=True,
                          check=True).stdout
    assert "7 cases: 2 pass, 4 skipped, 1 fail." in page
    assert "Ran 7 tests in 1.0s; FAILED (errors=1, skipped=4)." in page
    assert "| 1 | a reason nobody has classified | (not classified) | `test_f` |" in page
    assert "| 1 | CUDA is not available. | no GPU on the test machine | `test_a` |" in page
    assert "Failed (1): `test_e`." in page
