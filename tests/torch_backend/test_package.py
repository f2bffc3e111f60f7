"""The Python package's shape: its modules import one way (none imports the package root, no
cycle), none is over ~500 lines, `import gossipcc` patches torch only where this torch or the
program needs it (gossipcc/_torch_patches.py), and the deprecated names still work, warning."""
import ast
import json
import os
import pickle
import subprocess
import sys
import textwrap
import warnings

import pytest

import gossipcc

PACKAGE_DIR = os.path.dirname(os.path.abspath(gossipcc.__file__))
MODULES = sorted(f[:-3] for f in os.listdir(PACKAGE_DIR) if f.endswith(".py"))
SUBMODULES = set(MODULES) | {"_C"}  # _C: the extension


def _imports(name):
    """(line, imported sibling module or None, what is wrong or None) of every import in `name`."""
    with open(os.path.join(PACKAGE_DIR, name + ".py")) as f:
        tree = ast.parse(f.read(), name + ".py")
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "gossipcc" or alias.name.startswith("gossipcc."):
                    yield node.lineno, None, f"import {alias.name} (the package root)"
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                if node.module == "gossipcc" or (node.module or "").startswith("gossipcc."):
                    yield node.lineno, None, f"from {node.module} import ... (the package root)"
                continue
            if node.level > 1:
                yield node.lineno, None, "an import above the package"
            elif node.module:
                yield node.lineno, node.module.split(".")[0], None
            else:
                for alias in node.names:
                    if alias.name in SUBMODULES:
                        yield node.lineno, alias.name, None
                    else:
                        yield node.lineno, None, f"from . import {alias.name} (a name of __init__)"


def test_no_module_imports_the_package_root():
    bad = [f"{m}.py:{line}: {what}" for m in MODULES if m != "__init__"
           for line, _, what in _imports(m) if what]
    assert not bad, "modules of the package import its root; import the sibling module instead:\n" + "\n".join(bad)


def test_imports_form_no_cycle():
    graph = {m: {dep for _, dep, _ in _imports(m) if dep and dep != "_C"} for m in MODULES if m != "__init__"}
    state = {}

    def visit(m, path):
        if state.get(m) == "done":
            return None
        if state.get(m) == "open":
            return path[path.index(m):] + [m]
        state[m] = "open"
        for dep in sorted(graph.get(m, ())):
            cycle = visit(dep, path + [m])
            if cycle:
                return cycle
        state[m] = "done"
        return None

    for m in sorted(graph):
        cycle = visit(m, [])
        assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_module_over_500_lines():
    long = {}
    for m in MODULES:
        with open(os.path.join(PACKAGE_DIR, m + ".py")) as f:
            n = sum(1 for _ in f)
        if n > 500:
            long[m] = n
    assert not long, f"modules over 500 lines (split them by job): {long}"


# A fresh interpreter per case: the patches are process-wide.
PATCH_PROBE = textwrap.dedent("""
    import json, os, sys
    import torch, torch.distributed as dist
    from torch.distributed import distributed_c10d
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.distributed.elastic.multiprocessing import api
    original = {"ddp_init": DDP.__init__, "register_comm_hook": DDP.register_comm_hook,
                "destroy": distributed_c10d.destroy_process_group,
                "init": distributed_c10d.init_process_group, "std_from_str": api.Std.__dict__["from_str"]}
    import gossipcc, gossipcc.torchrun
    from gossipcc import _torch_patches as tp

    def state():
        out = {"ddp_init": DDP.__init__ is not original["ddp_init"],
               "register_comm_hook": DDP.register_comm_hook is not original["register_comm_hook"],
               "destroy": distributed_c10d.destroy_process_group is not original["destroy"],
               "init": distributed_c10d.init_process_group is not original["init"],
               "std_from_str": api.Std.__dict__["from_str"] is not original["std_from_str"],
               "use_libuv": os.environ.get("USE_LIBUV"), "tcpstores": {}}
        for name in tp._RENDEZVOUS_MODULES:
            try:
                module = __import__(name, fromlist=["TCPStore"])
            except ImportError:
                continue
            if hasattr(module, "TCPStore"):
                out["tcpstores"][name] = tp.is_patched(module, "TCPStore")
        return out

    report = {"torch_major": tp.torch_major(), "lacks_libuv": tp.torch_lacks_libuv(), "import": state()}
    if sys.argv[1] == "configure":
        gossipcc.configure(allreduce="powersgd:rank=1")
        report["configure"] = state()
    if sys.argv[1] == "group":
        dist.init_process_group("gossipcc", init_method="file://" + sys.argv[2], rank=0, world_size=1)
        report["group"] = state()
        dist.destroy_process_group()
    print("REPORT " + json.dumps(report))
""")


def probe(tmp_path, case, env):
    environ = {k: v for k, v in os.environ.items() if k not in ("GOSSIPCC_ALLREDUCE", "USE_LIBUV")}
    environ.update(env)
    out = subprocess.run([sys.executable, "-c", PATCH_PROBE, case, str(tmp_path / "init")], env=environ,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(next(line[7:] for line in out.stdout.splitlines() if line.startswith("REPORT ")))


def test_import_patches_only_what_this_torch_needs(tmp_path):
    report = probe(tmp_path, "group", {})
    at_import = report["import"]
    # Every torch: the rendezvous timeout needs init_process_group's start.
    assert at_import["init"], at_import
    # No policy asked for, no group yet: DDP and destroy_process_group are torch's own.
    assert not at_import["ddp_init"] and not at_import["register_comm_hook"] and not at_import["destroy"], at_import
    # The launcher fix only under python -m gossipcc.torchrun, not on import.
    assert not at_import["std_from_str"], at_import
    # USE_LIBUV and the rendezvous modules' TCPStore: only a torch 2.x without libuv.
    if report["lacks_libuv"]:
        assert at_import["use_libuv"] == "0" and at_import["tcpstores"] and all(at_import["tcpstores"].values())
    else:
        assert at_import["use_libuv"] is None and not any(at_import["tcpstores"].values()), at_import
    if report["torch_major"] < 2:
        assert not report["lacks_libuv"]
    # A gossipcc group: destroy shuts it down, torch's PowerSGD hooks get ordered; the policy is
    # "exact", so DDP.__init__ stays torch's.
    group = report["group"]
    assert group["destroy"] and group["register_comm_hook"] and not group["ddp_init"], group


@pytest.mark.parametrize("case,env", [("import", {"GOSSIPCC_ALLREDUCE": "powersgd:rank=1"}),
                                      ("configure", {})])
def test_a_policy_patches_ddp(tmp_path, case, env):
    report = probe(tmp_path, case, env)
    patched = report["import"] if case == "import" else report["configure"]
    assert patched["ddp_init"] and patched["register_comm_hook"], report
    if case == "configure":
        assert not report["import"]["ddp_init"], report


def test_comm_timeout_error_and_deprecated_names():
    assert "TimeoutError" not in gossipcc.__all__ and "CommTimeoutError" in gossipcc.__all__
    assert issubclass(gossipcc.CommTimeoutError, gossipcc.CommError)
    assert gossipcc.CommTimeoutError.__name__ == "CommTimeoutError"
    again = pickle.loads(pickle.dumps(gossipcc.CommTimeoutError("late")))
    assert type(again) is gossipcc.CommTimeoutError and str(again) == "late"
    with pytest.warns(DeprecationWarning, match="use gossipcc.CommTimeoutError"):
        assert gossipcc.TimeoutError is gossipcc.CommTimeoutError
    with pytest.warns(DeprecationWarning, match="use gossipcc.CommTimeoutError"):
        from gossipcc import TimeoutError as old  # noqa: F401
    namespace = {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        exec("from gossipcc import *", namespace)  # noqa: S102 - what a star import binds
    assert "TimeoutError" not in namespace and namespace["CommTimeoutError"] is gossipcc.CommTimeoutError
    from gossipcc import powersgd
    # The old policy hook is the one hook now: it warns, then runs gossipcc.hooks.powerSGD_hook
    # (which reads the bucket first: None has no buffer()).
    with pytest.warns(DeprecationWarning, match="gossipcc.hooks.powerSGD_hook"):
        with pytest.raises(AttributeError, match="buffer"):
            powersgd.policy_hook(None, None)
