"""The harness every benchmark in tools/bench runs on: repeated trials, methods interleaved in a
rotating order, the machine's load recorded per trial, medians with their spread, per-trial
ratios against a baseline, and the raw results as JSON.

A benchmark compares methods (gossipcc against gloo, PyTorch's hooks, ...). It runs --trials
trials; in trial t the methods run in the order rotation(methods, t) (trial t starts with method
t mod m, so drift of the machine hits every method alike), and a benchmark that repeats the
methods several times within a trial rotates further per repetition (trial_order). A trial
yields one sample per (cell, method, metric): a cell is one configuration of the benchmark (a
size, a network, a world size), a metric one measured quantity (time, bytes sent). Then:

- each figure is the median over the trials of its samples, with its min-max spread
  (stats); a figure from a single trial is marked as such wherever it is shown (cell_text);
- a ratio against the baseline is computed within each trial (method / baseline from the same
  trial) and the median of those per-trial ratios is reported, not the ratio of the medians
  (ratio_stats);
- the machine's load is recorded around every trial (LoadProbe): /proc/loadavg before and after,
  and, from /proc/stat, the CPU time that processes other than the benchmark's own used during
  the trial, in cores. A trial whose other processes used more than --max-load cores is
  flagged; when more than half the trials are flagged the run is refused (non-zero exit, the
  reason on stderr) unless --allow-load is given;
- the raw results go to results/<benchmark>-<UTC time>/results.json (Run.finish): the commit
  (and whether the tree was dirty), the command line, the machine, every trial's order, load
  and samples, and the summary; report.py renders that file into the tables and plots.
"""
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

FORMAT = 1
DEFAULT_TRIALS = 5
# Other processes' CPU during a trial, in cores, above which the trial is flagged. A quarter of
# this 2-core machine: a trial sharing that much of it with other work is not one to quote.
DEFAULT_MAX_LOAD = 0.5
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
ROOT_PID_ENV = "GOSSIPCC_BENCH_ROOT_PID"


class HarnessError(Exception):
    """Bad input to the harness (a message naming what was wrong)."""


def add_arguments(parser):
    """The flags every benchmark takes: --trials, --max-load, --allow-load, --results-dir."""
    parser.add_argument("--trials", type=int, default=DEFAULT_TRIALS,
                        help=f"trials (default {DEFAULT_TRIALS}); each figure is the median over them with its "
                        "min-max; 1 is for smoke tests and is marked as a single sample in the tables")
    parser.add_argument("--max-load", type=float, default=DEFAULT_MAX_LOAD,
                        help="flag a trial during which processes other than the benchmark's own used more than "
                        f"this many cores on average (from /proc/stat; default {DEFAULT_MAX_LOAD})")
    parser.add_argument("--allow-load", action="store_true",
                        help="report even when more than half the trials are flagged (otherwise the run is refused)")
    parser.add_argument("--results-dir", default=os.path.join(REPO, "results"),
                        help="where results/<benchmark>-<UTC time>/ is created (default: the repository's results/)")


def check_arguments(args):
    """HarnessError unless the harness's flags make sense."""
    if args.trials < 1:
        raise HarnessError(f"--trials must be at least 1, got {args.trials}")
    if not args.max_load >= 0:
        raise HarnessError(f"--max-load must be a number of cores >= 0, got {args.max_load}")


def rotation(methods, start):
    """methods in the order that starts at methods[start mod m] and wraps around."""
    methods = list(methods)
    if not methods:
        raise HarnessError("rotation of no methods")
    k = start % len(methods)
    return methods[k:] + methods[:k]


def trial_order(methods, trial, repetition=0):
    """The order of the methods in repetition `repetition` of trial `trial`: trial t starts at
    method t mod m; each repetition within the trial starts one method further."""
    return rotation(methods, trial + repetition)


# ---- load -------------------------------------------------------------------------------------

def _cpu_ticks():
    """(busy, total) CPU ticks of the whole machine from /proc/stat's first line. Busy is user,
    nice, system and steal (guest time is inside user); irq and softirq are left out: the kernel's
    interrupt work is mostly the benchmark's own network traffic (veths, bridge, shaper), which
    no process is charged with."""
    with open("/proc/stat") as f:
        fields = f.readline().split()
    if fields[0] != "cpu":
        raise HarnessError(f"/proc/stat: unexpected first line {' '.join(fields)!r}")
    v = [int(x) for x in fields[1:]] + [0] * 10
    user, nice, system, idle, iowait, irq, softirq, steal = v[:8]
    return user + nice + system + steal, sum(v[:8])


def _stat_of(pid):
    """(ppid, utime + stime + cutime + cstime in ticks) of a process, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    rest = text[text.rindex(")") + 2:].split()  # fields from the state on (the name may hold spaces)
    # rest[0] is field 3 (state): ppid is field 4, utime..cstime fields 14-17.
    return int(rest[1]), sum(int(x) for x in rest[11:15])


def tree_ticks(root):
    """CPU ticks of `root` and every live descendant, each with its reaped children's
    (cutime, cstime): a descendant that exits and is waited for moves its ticks into its
    parent's, so the sum only grows by what the tree computes."""
    stats = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            s = _stat_of(int(name))
            if s is not None:
                stats[int(name)] = s
    children = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            total += stats[pid][1]
        todo.extend(children.get(pid, []))
    return total


def loadavg():
    """/proc/loadavg's 1, 5 and 15 minute averages."""
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


def root_pid():
    """The process whose tree is the benchmark: the driver's pid, which run_ranks passes to the
    ranks in GOSSIPCC_BENCH_ROOT_PID, or this process."""
    return int(os.environ.get(ROOT_PID_ENV, os.getpid()))


class LoadProbe:
    """Around one trial: start(), then stop() returns the trial's load record:
    loadavg_before/after (/proc/loadavg), wall_s, busy_cores (the machine's busy CPU over the
    trial, in cores), own_cores (the benchmark's process tree, rooted at `root`) and
    other_cores = busy - own (what other processes took)."""

    def __init__(self, root=None):
        self.root = root_pid() if root is None else root
        self.tick = os.sysconf("SC_CLK_TCK")
        self.started = None

    def start(self):
        self.started = (time.monotonic(), _cpu_ticks()[0], tree_ticks(self.root), loadavg())

    def stop(self):
        if self.started is None:
            raise HarnessError("LoadProbe.stop() without start()")
        t1, busy1, own1, load1 = time.monotonic(), _cpu_ticks()[0], tree_ticks(self.root), loadavg()
        t0, busy0, own0, load0 = self.started
        self.started = None
        wall = max(t1 - t0, 1e-9)
        busy = (busy1 - busy0) / self.tick / wall
        own = (own1 - own0) / self.tick / wall
        return {"loadavg_before": load0, "loadavg_after": load1, "wall_s": wall,
                "busy_cores": busy, "own_cores": own, "other_cores": busy - own}


# ---- statistics -------------------------------------------------------------------------------

def stats(values):
    """{"median", "min", "max", "n"} of the values (None values left out); None when there are none."""
    xs = [x for x in values if x is not None]
    if not xs:
        return None
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def samples_of(trials, cell, method, metric):
    """The samples of (cell, method, metric), one per trial that has it, in trial order."""
    return [t["samples"][cell][method].get(metric) for t in trials
            if cell in t["samples"] and method in t["samples"][cell]]


def ratio_stats(trials, cell, method, reference, metric):
    """stats() of method / reference for `metric`, each ratio within one trial."""
    ratios = []
    for t in trials:
        s = t["samples"].get(cell, {})
        if method in s and reference in s:
            a, b = s[method].get(metric), s[reference].get(metric)
            if a is not None and b:
                ratios.append(a / b)
    return stats(ratios)


def summarize(trials, cells, methods, baseline, metric):
    """Per cell: every method's stats per metric over the trials, and per method other than the
    baseline the per-trial ratios method / baseline ("ratios") and baseline / method
    ("speedups") of `metric`."""
    out = {}
    for cell in cells:
        present = [m for m in methods if any(cell in t["samples"] and m in t["samples"][cell] for t in trials)]
        metrics = []
        for t in trials:
            for m in present:
                for k in t["samples"].get(cell, {}).get(m, {}):
                    if k not in metrics:
                        metrics.append(k)
        entry = {"methods": {m: {k: stats(samples_of(trials, cell, m, k)) for k in metrics} for m in present},
                 "ratios": {}, "speedups": {}}
        if baseline in present:
            for m in present:
                if m != baseline:
                    entry["ratios"][m] = ratio_stats(trials, cell, m, baseline, metric)
                    entry["speedups"][m] = ratio_stats(trials, cell, baseline, m, metric)
        out[cell] = entry
    return out


def load_verdict(trials, max_load):
    """(flagged count, refusal reason or None): a run is refused when more than half its trials
    were flagged (other processes above max_load cores)."""
    flagged = [t for t in trials if t["load"]["other_cores"] > max_load]
    if 2 * len(flagged) > len(trials):
        worst = max(t["load"]["other_cores"] for t in flagged)
        return len(flagged), (f"{len(flagged)} of {len(trials)} trials ran while other processes used more than "
                              f"--max-load {max_load:g} cores (up to {worst:.2f}); rerun on a quieter machine, "
                              f"or pass --allow-load to report them flagged")
    return len(flagged), None


# ---- formatting -------------------------------------------------------------------------------

def cell_text(s, scale=1.0, digits=1, suffix=""):
    """A figure as text: "median (min-max)" with `digits` decimals after multiplying by `scale`,
    "median (1 sample)" from a single trial, "-" for none."""
    if s is None:
        return "-"
    f = f"{{:.{digits}f}}"
    med = f.format(s["median"] * scale) + suffix
    if s["n"] == 1:
        return f"{med} (1 sample)"
    return f"{med} ({f.format(s['min'] * scale)}-{f.format(s['max'] * scale)})"


def markdown_table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def trials_table(doc):
    """One row per trial: its group (where the benchmark has several), the methods' order,
    /proc/loadavg before and after, the other processes' and the benchmark's CPU in cores, and
    whether it was flagged."""
    groups = any(t.get("group") for t in doc["trials"])
    rows = []
    for t in doc["trials"]:
        ld = t["load"]
        rows.append([t["index"] + 1] + ([t.get("group") or ""] if groups else []) + [", ".join(t["order"]),
                    f"{ld['loadavg_before'][0]:.2f} -> {ld['loadavg_after'][0]:.2f}",
                    f"{ld['other_cores']:.2f}", f"{ld['own_cores']:.2f}", f"{ld['wall_s']:.1f}",
                    "**flagged**" if t["flagged"] else ""])
    return markdown_table(["trial"] + (["group"] if groups else []) + [
        "order", "1-min load average", "other processes (cores)", "benchmark (cores)", "seconds",
        f"other > {doc['max_load']:g} cores?"], rows)


def preamble(doc):
    """The lines above a report's tables: what the figures are, the commit, and the load."""
    s = doc["summary"]
    commit = doc["commit"]
    head = commit.get("head") or f"unknown ({commit.get('error')})"
    dirty = " (working tree dirty)" if commit.get("dirty") else ""
    n = doc["args"]["trials"]
    lines = [f"{doc['benchmark']}, {doc['created_utc']}, commit {head[:12]}{dirty}; "
             f"{doc['machine']['nproc']} cores, kernel {doc['machine']['kernel']}, torch {doc['machine']['torch']}",
             f"Each figure: the median of {n} trials (min-max)" + (" - **a single sample**, for a smoke test only"
                                                                   if n == 1 else "")
             + "; methods interleaved in a rotating order; each ratio is the median of the per-trial ratios.",
             f"Trials with other processes above {doc['max_load']:g} cores: {s['flagged']} of {s['trials']}"
             + (" (--allow-load)" if s["flagged"] and doc["allow_load"] else "")]
    if doc.get("refused"):
        lines.append(f"REFUSED: {doc['refused']}")
    return "\n".join(lines)


# ---- the run ----------------------------------------------------------------------------------

def _git(*argv):
    return subprocess.run(["git", "-C", REPO] + list(argv), capture_output=True, text=True, timeout=60)


def commit_info():
    """{"head", "dirty"} of the repository the harness lives in ({"head": None, "error"} outside git)."""
    try:
        head = _git("rev-parse", "HEAD")
        if head.returncode != 0:
            return {"head": None, "dirty": None, "error": head.stderr.strip()}
        status = _git("status", "--porcelain", "--untracked-files=no")
        return {"head": head.stdout.strip(), "dirty": bool(status.stdout.strip())}
    except (OSError, subprocess.SubprocessError) as e:
        return {"head": None, "dirty": None, "error": str(e)}


def machine_info():
    try:
        from importlib import metadata
        torch_version = metadata.version("torch")
    except Exception:  # noqa: BLE001 (no distribution metadata: ask the module)
        try:
            import torch
            torch_version = torch.__version__
        except ImportError:
            torch_version = None
    u = platform.uname()
    return {"nproc": os.cpu_count(), "kernel": f"{u.system} {u.release}", "kernel_version": u.version,
            "machine": u.machine, "python": platform.python_version(), "torch": torch_version}


class Run:
    """One benchmark run: add_trial() per trial, then finish() writes the JSON and applies the
    load verdict. `methods` in their canonical order, `baseline` one of them, `metric` the
    metric the ratios are of."""

    def __init__(self, benchmark, args, methods, baseline, metric, argv=None):
        check_arguments(args)
        if baseline not in methods:
            raise HarnessError(f"baseline {baseline!r} is not one of the methods {list(methods)}")
        self.benchmark, self.args = benchmark, args
        self.methods, self.baseline, self.metric = list(methods), baseline, metric
        self.argv = list(sys.argv if argv is None else argv)
        self.cells = {}
        self.trials = []
        self.info = {}
        self.started = datetime.datetime.now(datetime.timezone.utc)

    def cell(self, name, **info):
        """Declares a cell (in table order) with what describes it (size, network, bound...)."""
        self.cells.setdefault(name, {}).update(info)
        return name

    def add_trial(self, samples, load, order, group=None, detail=None):
        """samples: {cell: {method: {metric: value}}} of one trial; load: LoadProbe.stop()'s record;
        order: the methods in the order they ran."""
        for cell, per_method in samples.items():
            if cell not in self.cells:
                raise HarnessError(f"trial sample for undeclared cell {cell!r}")
            for m in per_method:
                if m not in self.methods:
                    raise HarnessError(f"trial sample for unknown method {m!r} (methods: {self.methods})")
        index = len(self.trials)
        self.trials.append({"index": index, "group": group, "order": list(order), "load": load,
                            "flagged": load["other_cores"] > self.args.max_load,
                            "samples": samples, "detail": detail})

    def document(self):
        flagged, refused = load_verdict(self.trials, self.args.max_load)
        if not self.trials:
            refused = "no trials ran"
        summary = summarize(self.trials, list(self.cells), self.methods, self.baseline, self.metric)
        return {"format": FORMAT, "benchmark": self.benchmark,
                "created_utc": self.started.strftime("%Y-%m-%dT%H:%M:%SZ"),
                "commit": commit_info(), "command": self.argv, "args": vars(self.args),
                "machine": machine_info(), "methods": self.methods, "baseline": self.baseline,
                "metric": self.metric, "max_load": self.args.max_load, "allow_load": self.args.allow_load,
                "cells": self.cells, "info": self.info, "trials": self.trials,
                "summary": {"cells": summary, "trials": len(self.trials), "flagged": flagged},
                "refused": None if self.args.allow_load and self.trials else refused}

    def finish(self, render=None):
        """Writes results/<benchmark>-<UTC>/results.json (and report.md: render(doc)'s text),
        prints the report and where the files are; exits 3 with the reason when the run is refused.
        Returns the document."""
        doc = self.document()
        path = write(doc, self.args.results_dir)
        text = render(doc) if render else preamble(doc)
        with open(os.path.join(os.path.dirname(path), "report.md"), "w") as f:
            f.write(text + "\n")
        print(text)
        print(f"\nresults: {path}", flush=True)
        if doc["refused"]:
            print(f"{self.benchmark}: refused: {doc['refused']}", file=sys.stderr)
            sys.exit(3)
        return doc


def write(doc, results_dir):
    """Writes doc to <results_dir>/<benchmark>-<UTC time>/results.json (a suffix when that
    directory exists); returns the file's path."""
    stamp = doc["created_utc"].replace("-", "").replace(":", "")
    base = os.path.join(results_dir, f"{doc['benchmark']}-{stamp}")
    out, k = base, 1
    while True:
        try:
            os.makedirs(out)
            break
        except FileExistsError:
            k += 1
            out = f"{base}-{k}"
    path = os.path.join(out, "results.json")
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    return path


def read(path):
    """A results document from its file (or the directory holding results.json)."""
    if os.path.isdir(path):
        path = os.path.join(path, "results.json")
    with open(path) as f:
        doc = json.load(f)
    if doc.get("format") != FORMAT or "benchmark" not in doc:
        raise HarnessError(f"{path}: not a results file of tools/bench/harness.py (format {FORMAT})")
    return doc
