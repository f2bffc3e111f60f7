#!/usr/bin/env python3
"""Renders a benchmark's results (results/<benchmark>-<UTC time>/results.json, written by
tools/bench/harness.py) into the markdown tables of docs/benchmarks.md, and a plot with
--plot when matplotlib is installed. The tables are the ones the benchmark printed when it ran:
both come from its report(doc) on the same document.

    tools/bench/report.py results/allreduce_backends-20261128T021500Z [--plot docs/img/allreduce_backends.png]

A refused run (more than half its trials above --max-load, without --allow-load) is not
rendered: the command exits 2 with the refusal's reason.
"""
import argparse
import importlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

BENCHMARKS = ("allreduce_backends", "gossip_vs_allreduce", "p2p_segments", "powersgd_overlap", "powersgd_vs_torch",
              "quantized_allreduce")


def module_of(doc):
    name = doc["benchmark"]
    if name not in BENCHMARKS:
        raise harness.HarnessError(f"results of an unknown benchmark {name!r} (known: {', '.join(BENCHMARKS)})")
    return importlib.import_module(name)


def render(doc):
    """The benchmark's markdown report of doc."""
    return module_of(doc).report(doc)


def plot(doc, path):
    """The benchmark's plot of doc, as a PNG at path."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise harness.HarnessError("--plot needs matplotlib (Debian: python3-matplotlib)") from None
    module_of(doc).plot(doc, path)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("results", help="a results.json, or the results/<benchmark>-<UTC time>/ directory holding it")
    p.add_argument("--plot", metavar="PNG", help="also write the benchmark's plot here")
    args = p.parse_args(argv)
    try:
        doc = harness.read(args.results)
        if doc.get("refused"):
            print(f"report: {args.results}: the run was refused: {doc['refused']}", file=sys.stderr)
            return 2
        print(render(doc))
        if args.plot:
            plot(doc, args.plot)
            print(f"\nplot: {args.plot}")
    except (harness.HarnessError, OSError, ValueError) as e:
        print(f"report: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
