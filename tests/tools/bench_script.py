"""Imports a tools/bench script as a module, for the tests of its arithmetic and helpers."""
import importlib.util
import os
import sys

TOOLS = os.environ.get("GOSSIPCC_TOOLS") or os.path.join(os.path.dirname(__file__), "..", "..", "tools")


def load(name):
    """tools/bench/<name>.py as a module (with tools/bench and tools on sys.path, as when run)."""
    script = os.path.join(TOOLS, "bench", f"{name}.py")
    sys.path.insert(0, os.path.dirname(script))
    sys.path.insert(0, TOOLS)  # emulated_cluster
    spec = importlib.util.spec_from_file_location(name, script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def harness():
    """tools/bench/harness.py as the benchmarks import it (one module object for both)."""
    sys.path.insert(0, os.path.join(TOOLS, "bench"))
    import harness as module
    return module


def harness_args(**kw):
    """The harness's flags at their defaults (tools/bench/harness.py add_arguments), with kw set."""
    import argparse
    p = argparse.ArgumentParser()
    harness().add_arguments(p)
    a = p.parse_args([])
    for k, v in kw.items():
        setattr(a, k, v)
    return a
