#!/usr/bin/env python3
"""One sitting: every benchmark of tools/bench and both workloads of the main job, on one commit,
in a fixed order, at each host layout on one network; then docs/benchmarks.md's generated blocks
are rewritten from the results (report.py --update-doc: nothing typed by hand).

    tools/bench/sitting.sh [--quick] [--layouts 4x2,4x1] [--network rate=100mbit,delay=25ms] [--trials N]
                           [--only NAME,...] [--allow-load] [--max-load 0.5] [--results-dir results]
                           [--doc docs/benchmarks.md | --no-doc] [--step-timeout 3600]

Order: for each step of STEPS in turn, each layout of --layouts (HxG: H hosts of G ranks, the
cluster flags every benchmark takes) one after the other, so that a step's layouts are measured
side by side. Each step runs its benchmark with the harness flags (--trials, --max-load,
--allow-load) and writes its results under results/sitting-<UTC time>/<step>/ (step names are
<benchmark>-<H>x<G>); the main job's workloads ("digits": tools/train/train.py, one run per
method; "lm": tools/train/lm_job.py with --trials) are wrapped into results.json by
main_job.wrap(). The sitting itself is recorded in results/sitting-<UTC>/sitting.json: the
commit at its start (and at its end, where another commit landed meanwhile), the machine, the command, and per step its command, exit status, seconds and load
(harness.LoadProbe around the step: /proc/loadavg before and after, other processes' cores).
A step that fails or is refused (more than half its trials above --max-load, without
--allow-load) is recorded as such and the sitting goes on; the page's block for it then says so.

--quick: a reduced sitting (2 trials unless --trials, small sizes and models, few steps), for tests
and for a first look on a busy machine. --only runs the named benchmarks only (names of STEPS).
"""
import argparse
import datetime
import glob
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import common  # noqa: E402
import harness  # noqa: E402
import main_job  # noqa: E402

TOOLS = os.path.dirname(HERE)
DEFAULT_NETWORK = "rate=100mbit,delay=25ms"
DEFAULT_LAYOUTS = "4x2,4x1"
MB = 1 << 20

# (name, script under tools/, how it takes the network, full flags, --quick flags). "networks":
# the benchmark sweeps networks (--networks); "digits"/"lm": a main-job workload (--results DIR).
STEPS = (
    ("allreduce_backends", "bench/allreduce_backends.py", "networks",
     ["--min-bytes", "4096", "--max-bytes", str(16 * MB)], ["--min-bytes", "4096", "--max-bytes", str(256 << 10),
                                                            "--iterations", "1"]),
    ("quantized_allreduce", "bench/quantized_allreduce.py", "network",
     ["--bytes", str(16 * MB)], ["--bytes", str(MB)]),
    ("gossip_vs_allreduce", "bench/gossip_vs_allreduce.py", "network",
     ["--bytes", str(16 * MB)], ["--bytes", str(MB)]),
    ("hierarchical", "bench/hierarchical.py", "network",
     ["--bytes", str(16 * MB)], ["--bytes", str(MB)]),
    ("p2p_segments", "bench/p2p_segments.py", "network",
     ["--bytes", str(16 * MB), "--segments", f"{16 * MB},{MB},{256 << 10}"],
     ["--bytes", str(MB), "--segments", f"{MB},{256 << 10},{64 << 10}"]),
    ("model_shapes", "bench/model_shapes.py", "network", ["--scale", "0.1"], ["--scale", "0.002"]),
    ("powersgd_overlap", "bench/powersgd_overlap.py", "network", [],
     ["--width", "64", "--layers", "4", "--steps", "3", "--start-iter", "2"]),
    ("powersgd_vs_torch", "bench/powersgd_vs_torch.py", "networks", [],
     ["--ranks-psgd", "1", "--steps", "14", "--hidden", "128"]),
    ("digits", "train/train.py", "digits", [],
     ["--steps", "40", "--eval-every", "10", "--target", "0.85", "--methods",
      "allreduce-gloo,allreduce,powersgd-r1,sgp"]),
    ("lm", "train/lm_job.py", "lm", [],
     ["--smoke", "--methods", "allreduce-gloo,allreduce,torch-diloco,diloco"]),
)
NAMES = tuple(s[0] for s in STEPS)


def parse_layouts(text):
    """"4x2,4x1" -> [(4, 2), (4, 1)]; ValueError naming a bad entry."""
    out = []
    for part in text.split(","):
        h, sep, g = part.partition("x")
        if not sep or not h.isdigit() or not g.isdigit() or int(h) < 1 or int(g) < 1:
            raise ValueError(f"--layouts: {part!r} is not HOSTSxRANKS_PER_HOST (e.g. 4x2)")
        out.append((int(h), int(g)))
    return out


def step_name(name, hosts, per_host):
    return f"{name}-{hosts}x{per_host}"


def step_command(step, hosts, per_host, args, folder):
    """The argv of one step (python, script, flags) writing under folder."""
    name, script, how, full, quick = step
    argv = [sys.executable, os.path.join(TOOLS, script), "--hosts", str(hosts), "--ranks-per-host", str(per_host)]
    argv += ["--networks" if how == "networks" else "--network", args.network]
    argv += quick if args.quick else full
    if how == "digits":
        return argv + ["--results", folder, "--no-plot"]
    if how == "lm":
        return argv + ["--results", folder, "--no-plot", "--trials", str(args.trials)]
    argv += ["--trials", str(args.trials), "--max-load", repr(args.max_load), "--results-dir", folder]
    return argv + (["--allow-load"] if args.allow_load else [])


def bench_results(folder):
    """The one results.json a benchmark wrote under folder (None when it wrote none)."""
    found = sorted(glob.glob(os.path.join(folder, "*", "results.json")))
    return found[-1] if found else None


def run_step(step, hosts, per_host, args, sitting_dir):
    """Runs one step; returns its record for sitting.json."""
    name = step_name(step[0], hosts, per_host)
    folder = os.path.join(sitting_dir, name)
    os.makedirs(folder, exist_ok=True)
    argv = step_command(step, hosts, per_host, args, folder)
    probe = harness.LoadProbe()
    print(f"[sitting] {name}: {' '.join(argv[1:])}   (load {' '.join(map(str, harness.loadavg()))})", flush=True)
    probe.start()
    with open(os.path.join(folder, "output.log"), "w") as log:
        try:
            rc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, timeout=args.step_timeout,
                                env=dict(os.environ, PYTHONUNBUFFERED="1")).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    load = probe.stop()
    results, error = None, None
    try:
        if step[2] in ("digits", "lm"):
            results = main_job.wrap(step[2], folder, argv)
        else:
            results = bench_results(folder)
    except harness.HarnessError as e:
        error = str(e)
    if results is None and error is None:
        error = "the benchmark wrote no results"
    if rc != 0 and error is None and step[2] in ("digits", "lm"):
        error = f"exit status {rc}"
    with open(os.path.join(folder, "output.log")) as f:
        tail = f.read().splitlines()[-15:]
    print(f"[sitting] {name}: exit {rc}, {load['wall_s']:.0f} s" + (f", {error}" if error else ""), flush=True)
    return {"name": name, "benchmark": step[0], "hosts": hosts, "ranks_per_host": per_host,
            "command": argv[1:], "rc": rc, "load": load, "error": error, "output_tail": tail if error else None,
            "results": os.path.relpath(results, sitting_dir) if results else None}


# ---- the sitting's own report ----------------------------------------------------------------

def step_result(doc, step):
    if step["error"]:
        return f"failed: {step['error']}"
    return "refused (load)" if step["rc"] == 3 else "ok" if step["rc"] == 0 else f"exit {step['rc']}"


def report(doc):
    """The sitting's record as markdown: what ran, on which commit and machine, and per step its
    command, seconds, load and outcome."""
    commit = doc["commit"]
    head = (commit.get("head") or f"unknown ({commit.get('error')})")[:12]
    m = doc["machine"]
    a = doc["args"]
    lines = [f"Sitting {doc['created_utc']} - {doc['finished_utc']}, commit {head}"
             + (" (working tree dirty)" if commit.get("dirty") else "")
             + f"; {m['nproc']} cores, kernel {m['kernel']}, torch {m['torch']}; network {a['network']}, layouts "
             f"{a['layouts']} (hosts x ranks per host); {a['trials']} trials per figure"
             + (", --quick" if a["quick"] else "") + (", --allow-load" if a["allow_load"] else "") + ".",
             "", f"Command: `{' '.join(doc['command'])}`", ""]
    end = doc.get("commit_at_end") or commit
    if end.get("head") != commit.get("head"):
        lines[-1:-1] = [f"The repository's HEAD moved during the sitting, to {(end.get('head') or 'unknown')[:12]}: "
                        "each step's own results name the commit it ran on.", ""]
    rows = []
    for s in doc["steps"]:
        ld = s["load"]
        rows.append([s["name"], f"`{' '.join(os.path.relpath(x, harness.REPO) if x.startswith(harness.REPO) else x for x in s['command'])}`",
                     f"{ld['wall_s']:.0f}", f"{ld['loadavg_before'][0]:.2f} -> {ld['loadavg_after'][0]:.2f}",
                     f"{ld['other_cores']:.2f}", step_result(doc, s)])
    lines.append(harness.markdown_table(["step", "command", "seconds", "1-min load average",
                                         "other processes (cores)", "result"], rows))
    return "\n".join(lines)


def read(sitting_dir):
    """The sitting document of a results/sitting-<UTC>/ folder (or its sitting.json)."""
    path = sitting_dir if sitting_dir.endswith(".json") else os.path.join(sitting_dir, "sitting.json")
    doc = harness.read(path)
    if doc["benchmark"] != "sitting":
        raise harness.HarnessError(f"{path}: a results file of {doc['benchmark']!r}, not of a sitting")
    return doc, os.path.dirname(os.path.abspath(path))


# ---- the command ------------------------------------------------------------------------------

def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="a reduced sitting: 2 trials, small sizes, few steps")
    p.add_argument("--layouts", default=DEFAULT_LAYOUTS, help=f"HxG,... (default {DEFAULT_LAYOUTS})")
    p.add_argument("--network", default=DEFAULT_NETWORK,
                   help=f"a preset or link spec of tools/emulated_cluster.py, or local (default {DEFAULT_NETWORK})")
    p.add_argument("--trials", type=int, default=None, help=f"trials per figure (default {harness.DEFAULT_TRIALS}; "
                   "2 with --quick)")
    p.add_argument("--only", default=None, help="comma list of steps to run (of: " + ", ".join(NAMES) + ")")
    p.add_argument("--max-load", type=float, default=harness.DEFAULT_MAX_LOAD, help="harness's --max-load")
    p.add_argument("--allow-load", action="store_true", help="harness's --allow-load, for every benchmark")
    p.add_argument("--results-dir", default=os.path.join(harness.REPO, "results"))
    p.add_argument("--doc", default=os.path.join(harness.REPO, "docs", "benchmarks.md"),
                   help="the page whose generated blocks are rewritten (default docs/benchmarks.md)")
    p.add_argument("--no-doc", action="store_true", help="leave the page alone")
    p.add_argument("--step-timeout", type=float, default=3600, help="seconds before a step is stopped")
    args = p.parse_args(argv)
    try:
        args.layout_list = parse_layouts(args.layouts)
        if args.network != "local":
            common.emulated_cluster.parse_link(args.network)
        args.only_list = NAMES if args.only is None else args.only.split(",")
        unknown = [n for n in args.only_list if n not in NAMES]
        if unknown:
            raise ValueError(f"--only: unknown step(s) {', '.join(unknown)} (known: {', '.join(NAMES)})")
        if args.trials is None:
            args.trials = 2 if args.quick else harness.DEFAULT_TRIALS
        if args.trials < 1:
            raise ValueError(f"--trials must be at least 1, got {args.trials}")
    except ValueError as e:
        p.error(str(e))
    return args


def main(argv=None):
    args = parse(argv)
    started = datetime.datetime.now(datetime.timezone.utc)
    commit = harness.commit_info()
    sitting_dir = os.path.join(args.results_dir, "sitting-" + started.strftime("%Y%m%dT%H%M%SZ"))
    os.makedirs(sitting_dir)
    print(f"[sitting] {sitting_dir}; machine {os.cpu_count()} cores, load {' '.join(map(str, harness.loadavg()))}",
          flush=True)
    steps = []
    for step in STEPS:
        if step[0] in args.only_list:
            for hosts, per_host in args.layout_list:
                steps.append(run_step(step, hosts, per_host, args, sitting_dir))
    record = {"format": harness.FORMAT, "benchmark": "sitting", "created_utc": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
              "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": commit,
              "commit_at_end": harness.commit_info(),
              "command": ["tools/bench/sitting.sh"] + list(sys.argv[1:] if argv is None else argv),
              "machine": harness.machine_info(),
              "args": {"quick": args.quick, "layouts": args.layouts, "network": args.network, "trials": args.trials,
                       "only": args.only, "max_load": args.max_load, "allow_load": args.allow_load},
              "steps": steps, "refused": None}
    with open(os.path.join(sitting_dir, "sitting.json"), "w") as f:
        json.dump(record, f, indent=1)
    print("\n" + report(record) + f"\n\nsitting: {sitting_dir}/sitting.json", flush=True)
    if not args.no_doc:
        import report as report_module
        try:
            report_module.update_doc(args.doc, sitting_dir)
        except (harness.HarnessError, ValueError, OSError) as e:
            print(f"sitting: {args.doc}: {e}", file=sys.stderr)
            return 2
    return 1 if any(s["error"] or s["rc"] not in (0, 3) for s in steps) else 0


if __name__ == "__main__":
    sys.exit(main())
