"""The main job's two workloads as results documents of tools/bench/harness.py's format, so that
report.py and the sitting (sitting.py) render them like the benchmarks: "digits" (tools/train/
train.py, time to accuracy per method) and "lm" (tools/train/lm_job.py, the byte-level GPT).

Each workload writes its own folder (--results DIR: results.md, summary.json, every rank's log);
wrap(kind, folder, command) reads its summary.json and writes DIR/results.json:

    {"format", "benchmark": "digits" | "lm", "created_utc", "commit", "command", "machine",
     "args": the workload's flags, "summary": its summary.json, "refused": null}

report(doc) gives the tables the workload printed (the same functions render them from the
same summary), plot(doc, path) its plot (accuracy or validation loss against training time).
"""
import datetime
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

TRAIN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "train")
KINDS = ("digits", "lm")


def _modules():
    if TRAIN not in sys.path:
        sys.path.insert(0, TRAIN)
    import lm_job
    import train
    return train, lm_job


def wrap(kind, folder, command, created=None):
    """Writes folder/results.json from folder/summary.json (see the module's doc); returns its path.
    HarnessError when the workload left no summary (it failed before its table)."""
    if kind not in KINDS:
        raise harness.HarnessError(f"unknown main-job workload {kind!r} (known: {', '.join(KINDS)})")
    path = os.path.join(folder, "summary.json")
    try:
        with open(path) as f:
            summary = json.load(f)
    except (OSError, ValueError) as e:
        raise harness.HarnessError(f"{kind}: no summary to wrap ({path}: {e})") from None
    created = created or datetime.datetime.now(datetime.timezone.utc)
    doc = {"format": harness.FORMAT, "benchmark": kind, "created_utc": created.strftime("%Y-%m-%dT%H:%M:%SZ"),
           "commit": harness.commit_info(), "command": list(command), "machine": harness.machine_info(),
           "args": summary.get("args", {}), "summary": summary, "refused": None}
    out = os.path.join(folder, "results.json")
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
    return out


def _world(a):
    hosts, per_host = a.get("hosts", a.get("ranks")), a.get("ranks_per_host", 1)
    return f"{hosts * per_host} ranks ({hosts} hosts x {per_host} rank{'s' if per_host > 1 else ''})"


def _head(doc):
    commit = doc["commit"]
    head = (commit.get("head") or "unknown")[:12] + (" (working tree dirty)" if commit.get("dirty") else "")
    return f"{doc['benchmark']}, {doc['created_utc']}, commit {head}; {doc['machine']['nproc']} cores"


def report(doc):
    train, lm_job = _modules()
    s, a = doc["summary"], doc["summary"]["args"]
    if doc["benchmark"] == "digits":
        text = (f"{_world(a)}, network {a['network']}, {a['steps']} steps, batch {a['batch']}/rank, lr {a['lr']}, "
                f"MLP 64-{a['hidden']}-{a['hidden']}-10, target {a['target']}; one run per method, in turn (a "
                f"single sample per figure)\n\n" + train.format_table(s["rows"], a["target"], a["baseline"]))
    else:
        text = (f"{_world(a)}, network {a['network']}; targets {', '.join(lm_job.target_key(t) for t in s['targets'])}"
                "; load (1/5/15 min) per trial: " + "; ".join(f"{t['trial'] + 1}: {t.get('load_start')} -> "
                                                              f"{t.get('load_end')}" for t in s["trials"])
                + "\n\n" + lm_job.table_head(a["trials"], s["worker_args"]["eval_every"], s["equal_steps"],
                                             s["equal_time"], a["baseline"])
                + "\n\n" + lm_job.format_table(s["rows"], s["targets"], a["baseline"], s["equal_steps"],
                                               s["equal_time"]))
    return _head(doc) + "\n\n" + text


def plot(doc, path):
    train, lm_job = _modules()
    s, a = doc["summary"], doc["summary"]["args"]
    if doc["benchmark"] == "digits":
        train.plot(s["rows"], a["target"], path, f"digits MLP, {_world(a)}, network {a['network']}")
    else:
        lm_job.plot(s["rows"], s["targets"], path, f"byte-level GPT on fortunes, {_world(a)}, network {a['network']}")
