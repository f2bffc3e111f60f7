#!/usr/bin/env python3
"""Lists every case of a PyTorch distributed_test.py run (the log of
//tests/torch_backend:pytorch_distributed_suite_test) with its outcome and skip reason.

  tools/suite_skips.py LOG [--title TEXT] > results/pytorch_suite_<torch>.md

Prints a markdown page: the totals, one row per skip reason (how many cases, why, which
cases), and the cases that passed. The "why" column comes from WHY below; a reason not in
it is printed as "(not classified)" so that a new kind of skip is noticed.
"""
import argparse
import collections
import re
import sys

# Why each reason the suite (or our driver) prints applies to gossipcc here. Matched as
# prefixes of the printed reason.
WHY = [
    ("Need at least", "no GPU on the test machine (the suite's multi-GPU cases)"),
    ("CUDA is not available", "no GPU on the test machine"),
    ("Only Nccl supports CUDA", "a CUDA case (no GPU here)"),
    ("Only NCCL supports CUDA", "a CUDA case (no GPU here)"),
    ("Only Nccl backend supports", "a multi-GPU case (no GPU here)"),
    ("Only Gloo and Nccl backend supports CUDA", "a CUDA case (no GPU here)"),
    ("NCCL Batch Send Recv Only", "a CUDA case (NCCL send/recv; no GPU here)"),
    ("NCCL Send Recv Only", "a CUDA case (NCCL send/recv; no GPU here)"),
    ("Only Gloo and NCCL backends will have CUDA", "a CUDA case (no GPU here)"),
    ("Only NCCL backend supports high priority stream", "a CUDA case (no GPU here)"),
    ("The gossipcc backend does not support DDP communication hook on CUDA", "a CUDA case (no GPU here)"),
    ("Only Nccl & Gloo backend support DistributedDataParallel", "a CUDA DDP case (no GPU here)"),
    ("Test requires backend", "the suite reserves these for the named backends; those reserved for gloo run (our driver)"),
    ("torch's monitored_barrier()", "Gloo's own monitored barrier (our driver)"),
    ("the case builds its model only", "the case cannot run under any other backend name (our driver)"),
    ("re-initialises the default group", "needs the suite's own env:// set-up (our driver)"),
    ("Test is failing", "disabled by PyTorch itself (any backend)"),
    ("the case expects pickle's message", "a Python 3.13 change, any backend (our driver)"),
    ("Coalescing manager currently tests with NCCL only", "the suite's allow-list (NCCL only)"),
    ("Test skipped at subprocess level", "a rank skipped the case itself; torch 2.x does not pass the reason up"),
    ("no torchvision", "torchvision is not installed (Debian has no package for this torch)"),
    ("Skipped due to small world size", "run at WORLD_SIZE=2 to keep CI short (WORLD_SIZE=4 runs them)"),
    ("Test requires world size of", "run at WORLD_SIZE=2 to keep CI short (WORLD_SIZE=4 runs them)"),
    ("Only MPI supports", "the suite's allow-list; gossipcc's own tests cover all-to-all"),
    ("GLOO Batch Send Recv CPU", "the suite's allow-list; gossipcc's own tests cover batched send/recv"),
    ("get_future is only supported on", "the suite's allow-list; collectives_test covers gossipcc's get_future"),
    ("Only gloo backend supports timeouts", "the suite's allow-list"),
    ("Only Gloo backend support sparse", "gossipcc has no sparse all-reduce"),
    ("Only Nccl supports", "the suite's allow-list (NCCL-only variants)"),
    ("torch 1.13 on Python 3.11", "a torch 1.13 bug on Python 3.11 that fails these with any backend (our driver)"),
    ("torch 2.x reports", "cannot pass for any plugin backend (our driver)"),
]

NAME = re.compile(r"^(test_\w+) \(__main__\.\w+\.\w+\)")
SKIP = re.compile(r"""skipped (?:'(.*)'|"(.*)")\s*$""")
OK = re.compile(r"(\.\.\. |^)ok\s*$")
FAIL = re.compile(r"(\.\.\. |^)(FAIL|ERROR)\s*$")


def why(reason):
    for prefix, text in WHY:
        if reason.startswith(prefix):
            return text
    return "(not classified)"


def parse(lines):
    outcome = collections.OrderedDict()
    current = None
    for line in lines:
        m = NAME.match(line)
        if m:
            current = m.group(1)
            outcome.setdefault(current, None)
        if current is None or outcome.get(current) is not None:
            continue
        if (s := SKIP.search(line)):
            outcome[current] = ("skipped", s.group(1) if s.group(1) is not None else s.group(2))
        elif OK.search(line):
            outcome[current] = ("ok", "")
        elif FAIL.search(line):
            outcome[current] = ("fail", "")
    return outcome


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("log")
    ap.add_argument("--title", default="PyTorch's distributed_test.py with BACKEND=gossipcc")
    args = ap.parse_args()
    with open(args.log, errors="replace") as f:
        lines = f.read().splitlines()
    outcome = parse(lines)
    summary = next((l for l in reversed(lines) if l.startswith("Ran ")), "")
    verdict = next((l for l in reversed(lines) if l.startswith(("OK", "FAILED"))), "")
    counts = collections.Counter(o[0] if o else "unknown" for o in outcome.values())
    by_reason = collections.defaultdict(list)
    for name, o in outcome.items():
        if o and o[0] == "skipped":
            by_reason[o[1]].append(name)
    out = [f"# {args.title}", "",
           f"Made by `tools/suite_skips.py` from the test log. {summary}; {verdict}.", "",
           f"{len(outcome)} cases: {counts['ok']} pass, {counts['skipped']} skipped, "
           f"{counts['fail']} fail" + (f", {counts['unknown']} without an outcome in the log" if counts["unknown"] else "") + ".",
           "", "| cases | reason (as printed) | why | which |", "|---|---|---|---|"]
    for reason, names in sorted(by_reason.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        out.append(f"| {len(names)} | {reason.replace('|', '/')} | {why(reason)} | {', '.join(f'`{n}`' for n in names)} |")
    passed = [n for n, o in outcome.items() if o and o[0] == "ok"]
    out += ["", f"Passed ({len(passed)}): " + ", ".join(f"`{n}`" for n in passed) + "."]
    failed = [n for n, o in outcome.items() if o and o[0] == "fail"]
    if failed:
        out += ["", f"Failed ({len(failed)}): " + ", ".join(f"`{n}`" for n in failed) + "."]
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
