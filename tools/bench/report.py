#!/usr/bin/env python3
"""Renders a benchmark's results (results/<benchmark>-<UTC time>/results.json, written by
tools/bench/harness.py) into the markdown tables of docs/benchmarks.md, and a plot with
--plot when matplotlib is installed. The tables are the ones the benchmark printed when it ran:
both come from its report(doc) on the same document.

    tools/bench/report.py results/allreduce_backends-20261128T021500Z [--plot docs/img/allreduce_backends.png]
    tools/bench/report.py results/sitting-20261128T060000Z --update-doc docs/benchmarks.md

Known results: every benchmark of tools/bench (BENCHMARKS), the main job's workloads "digits"
and "lm" (main_job.py wraps their summaries) and a sitting (sitting.py: its record of every
step). --update-doc rewrites the page's generated blocks (docgen.py) from a sitting's results:
`<!-- generated:STEP -->` gets the step's report, `<!-- generated:plot:STEP -->` its plot (a PNG
under the page's img/sitting/, linked), `<!-- generated:sitting -->` (or `sitting@WHAT`, for a
page that shows more than one sitting) the sitting's record; everything outside the blocks is
kept byte for byte, and a block naming a step the sitting did not run is left as it is (listed
on stderr; --strict makes that an error). --blocks NAME,... rewrites the named blocks only (a
sitting of some steps, beside the blocks of an earlier full one).

A refused run (more than half its trials above --max-load, without --allow-load) is not
rendered: the command exits 2 with the refusal's reason (in a page, its block says it was refused).
"""
import argparse
import importlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import docgen  # noqa: E402
import harness  # noqa: E402

# results document's "benchmark" -> the module that renders it
BENCHMARKS = {"allreduce_backends": "allreduce_backends", "gossip_vs_allreduce": "gossip_vs_allreduce",
              "model_shapes": "model_shapes", "p2p_segments": "p2p_segments", "powersgd_overlap": "powersgd_overlap",
              "powersgd_vs_torch": "powersgd_vs_torch", "quantized_allreduce": "quantized_allreduce",
              "projection": "projection", "hierarchical": "hierarchical",
              "digits": "main_job", "lm": "main_job", "sitting": "sitting"}
PLOT_DIR = os.path.join("img", "sitting")  # relative to the page


def module_of(doc):
    name = doc["benchmark"]
    if name not in BENCHMARKS:
        raise harness.HarnessError(f"results of an unknown benchmark {name!r} (known: {', '.join(BENCHMARKS)})")
    return importlib.import_module(BENCHMARKS[name])


def render(doc):
    """The benchmark's markdown report of doc."""
    return module_of(doc).report(doc)


def plot(doc, path):
    """The benchmark's plot of doc, as a PNG at path."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise harness.HarnessError("--plot needs matplotlib (Debian: python3-matplotlib)") from None
    module = module_of(doc)
    if not hasattr(module, "plot"):
        raise harness.HarnessError(f"{doc['benchmark']} has no plot")
    module.plot(doc, path)


def sitting_renderer(sitting_dir, page):
    """render(name) for docgen.regenerate from a sitting's folder (see the module's doc)."""
    import sitting
    record, folder = sitting.read(sitting_dir)
    steps = {s["name"]: s for s in record["steps"]}
    source = f"*Generated from results/{os.path.basename(folder)} by `tools/bench/report.py --update-doc`.*\n"

    def step_doc(name):
        step = steps[name]
        if step["error"]:
            return None, f"Not measured in sitting {record['created_utc']}: {name} failed ({step['error']})."
        doc = harness.read(os.path.join(folder, step["results"]))
        if doc.get("refused"):
            return None, f"Not measured in sitting {record['created_utc']}: {name} was refused: {doc['refused']}"
        return doc, None

    def render_block(name):
        if name == "sitting" or name.startswith("sitting@"):  # the page's sittings: "sitting", "sitting@WHAT"
            return source + "\n" + sitting.report(record) + "\n"
        plot_of = name[len("plot:"):] if name.startswith("plot:") else None
        step = plot_of or name
        if step not in steps:
            return None
        doc, why = step_doc(step)
        if why:
            return source + "\n" + why + "\n"
        if plot_of is None:
            return source + "\n" + render(doc) + "\n"
        rel = os.path.join(PLOT_DIR, f"{step}.png")
        target = os.path.join(os.path.dirname(os.path.abspath(page)), rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        plot(doc, target)
        return source + f"\n![{step}]({rel})\n"

    return render_block


def update_doc(page, sitting_dir, strict=False, only=None):
    """Rewrites page's generated blocks from the sitting in sitting_dir (`only`: those named
    there, the others kept); returns (rendered, kept)."""
    with open(page) as f:
        text = f.read()
    render = sitting_renderer(sitting_dir, page)
    if only is not None:
        unknown = sorted(set(only) - {name for name, _, _ in docgen.blocks(text)})
        if unknown:
            raise harness.HarnessError(f"{page}: no generated block named {', '.join(unknown)}")
        render_all = render

        def render(name):
            return render_all(name) if name in only else None
    new, rendered, kept = docgen.regenerate(text, render)
    if kept and strict:
        raise harness.HarnessError(f"{page}: blocks for steps the sitting did not run: {', '.join(kept)}")
    with open(page, "w") as f:
        f.write(new)
    print(f"{page}: {len(rendered)} generated block(s) rewritten" +
          (f"; kept as they were (not in this sitting): {', '.join(kept)}" if kept else ""), file=sys.stderr)
    return rendered, kept


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("results", help="a results.json, or the results/<benchmark>-<UTC time>/ directory holding it "
                   "(a sitting's folder with --update-doc)")
    p.add_argument("--plot", metavar="PNG", help="also write the benchmark's plot here")
    p.add_argument("--update-doc", metavar="PAGE", help="rewrite PAGE's generated blocks from the sitting in RESULTS")
    p.add_argument("--strict", action="store_true", help="with --update-doc: fail on a block the sitting did not run")
    p.add_argument("--blocks", metavar="NAME,...",
                   help="with --update-doc: rewrite only these blocks (e.g. a sitting of some steps: "
                        "sitting@hierarchical,hierarchical-4x2)")
    args = p.parse_args(argv)
    try:
        if args.update_doc:
            update_doc(args.update_doc, args.results, args.strict,
                       args.blocks.split(",") if args.blocks else None)
            return 0
        sitting_json = os.path.join(args.results, "sitting.json")
        doc = harness.read(sitting_json if os.path.isfile(sitting_json) else args.results)
        if doc.get("refused"):
            print(f"report: {args.results}: the run was refused: {doc['refused']}", file=sys.stderr)
            return 2
        print(render(doc))
        if args.plot:
            plot(doc, args.plot)
            print(f"\nplot: {args.plot}")
    except (harness.HarnessError, docgen.DocError, OSError, ValueError) as e:
        print(f"report: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
