"""Every fenced code block of README.md and docs/*.md is run, checked, or marked not runnable
with a reason; a docs edit that breaks an example fails here.

Each block is classified by its info string and by a marker, an HTML comment on the nearest
non-blank line above its opening fence:

  <!-- doc-test: skip (REASON) -->         not run; the reason (non-empty) says why.
  <!-- doc-test: python ranks=N setup=S -->  a Python block, run as N ranks (default 2), each a
                                           process with torch's launch variables (MASTER_ADDR,
                                           MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK); setup S
                                           (names of SETUPS below, comma-separated) runs
                                           first, for fragments.
  <!-- doc-test: sh -->                    a shell block, run with bash -e from a copy of a
                                           built clone (below).
  <!-- doc-test: output tol=T vary=W,... -->  the expected output of the nearest run block
                                           above it in the same file (rank 0's for Python);
                                           compared line by line, numbers within relative
                                           tolerance T (default 0: equal), numbers of lines
                                           starting with a word of W not compared; a line
                                           "..." stands for any number of lines, a line ending
                                           in "..." for any line that starts as it does.
  <!-- doc-test: output cmd=PATH ARGS -->   the expected output of a program of this
                                           repository's Bazel build (PATH relative to the
                                           runfiles, e.g. compression/examples/x), run here.
  <!-- doc-test: excerpt of=PATH -->        a C++ (or other) excerpt: each code line of the
                                           block (comments dropped, spaces normalised) occurs in
                                           PATH in the same order; PATH is a program that its
                                           own Bazel test builds and runs.
  <!-- doc-test: include of=PATH -->        the block is the whole file PATH, byte for byte.

Unmarked blocks: ```python runs as `python`, ```sh as `sh`; a block of another or no language
must be marked. Shell blocks run in a temporary directory that looks like a clone after
`bazel build //torch_backend:python_package` (the repository's files, and
bazel-bin/torch_backend holding the package this test depends on), with no PYTHONPATH of the
test's own, PET_MASTER_PORT set to a free port (torchrun's default --master-port), and a `bazel`
function that accepts `bazel build` of the targets this test depends on (BUILT) and refuses any
other bazel command. The test prints: N blocks, R run, S marked not runnable (each with its
reason), and the failures.
"""
import os
import re
import shlex
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

from emulated_cluster import free_port

DOC_FILES = ["README.md"] + sorted("docs/" + f for f in os.listdir("docs") if f.endswith(".md"))
BUILT = {"//torch_backend:python_package"}
PARALLEL_RUNS = 2  # blocks run two at a time: most of a run is process start-up and rendezvous

SETUPS = {
    # docs/algorithms.md: "Every snippet assumes" (that block, then a small task per rank).
    "algorithms": """
import torch, torch.distributed as dist, torch.nn.functional as F
import gossipcc
dist.init_process_group(backend="gossipcc")   # env:// under torchrun
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
_g = torch.Generator().manual_seed(dist.get_rank())
my_batches = [(torch.randn(16, 8, generator=_g), torch.randint(0, 3, (16,), generator=_g)) for _ in range(8)]
my_shard = my_batches[:6 + 2 * dist.get_rank()]   # shards of different lengths
steps = 8
def my_batch(step):
    return my_batches[step % len(my_batches)]
""",
    # The group, for fragments that use one.
    "init": """
import torch, torch.distributed as dist
import gossipcc
dist.init_process_group(backend="gossipcc")
""",
    # A model and data for fragments that use `model`/`module`, `batches`, `loss_fn`, `steps`.
    "model": """
import os, torch
torch.manual_seed(0)
model = module = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
_g = torch.Generator().manual_seed(int(os.environ["RANK"]))
batches = [(torch.randn(16, 8, generator=_g), torch.randint(0, 3, (16,), generator=_g)) for _ in range(8)]
loss_fn = torch.nn.functional.cross_entropy
steps = 4
""",
}

MARKER = re.compile(r"^\s*<!--\s*doc-test:\s*(\w+)(.*?)-->\s*$")
FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)")


class Block:
    def __init__(self, path, line, lang, text, marker):
        self.path, self.line, self.lang, self.text = path, line, lang, text
        self.kind, self.opts, self.reason = None, {}, None
        if marker is not None:
            self.kind = marker.group(1)
            rest = marker.group(2).strip()
            m = re.search(r"\((.*)\)\s*$", rest)
            if m:
                self.reason, rest = m.group(1).strip(), rest[:m.start()].strip()
            if self.kind == "output" and rest.startswith("cmd="):
                self.opts["cmd"] = rest[len("cmd="):]
            else:
                for item in shlex.split(rest):
                    key, _, value = item.partition("=")
                    self.opts[key] = value
        elif lang in ("python", "sh"):
            self.kind = lang

    @property
    def where(self):
        return f"{self.path}:{self.line}"


def blocks_of(path):
    lines = open(path, encoding="utf-8").read().split("\n")
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m.groups()
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            j += 1
        body = "\n".join(l[len(indent):] if l.startswith(indent) else l.lstrip() for l in lines[i + 1:j]) + "\n"
        k = i - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        marker = MARKER.match(lines[k]) if k >= 0 else None
        out.append(Block(path, i + 1, lang, body, marker))
        i = j + 1
    return out


def all_blocks():
    return [b for path in DOC_FILES for b in blocks_of(path)]


# ---- running ---------------------------------------------------------------------------------

def clone_dir():
    """A directory that looks like a built clone: the runfiles' top-level entries, and
    bazel-bin/torch_backend holding the package."""
    d = tempfile.mkdtemp(prefix="doc-test-")
    root = os.getcwd()
    for name in os.listdir(root):
        os.symlink(os.path.join(root, name), os.path.join(d, name))
    os.makedirs(os.path.join(d, "bazel-bin"))
    os.symlink(os.path.join(root, "torch_backend"), os.path.join(d, "bazel-bin", "torch_backend"))
    return d


def base_env():
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["OMP_NUM_THREADS"] = "1"
    return env


def run_sh(block):
    d = clone_dir()
    prelude = ("bazel() {\n"
               "  if [ \"$1\" = build ]; then shift; for t in \"$@\"; do case \"$t\" in %s) ;; *)"
               " echo \"doc-test: bazel build $t: not a dependency of the doc test\" >&2; return 97;; esac; done;"
               " return 0; fi\n"
               "  echo \"doc-test: cannot run bazel $*\" >&2; return 97\n}\n") % "|".join(sorted(BUILT))
    env = dict(base_env(), PET_MASTER_PORT=str(free_port()))
    timeout = float(block.opts.get("timeout", 240))
    p = subprocess.run(["bash", "-e", "-c", prelude + block.text], cwd=d, env=env, capture_output=True,
                       text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def run_python(block):
    ranks = int(block.opts.get("ranks", 2))
    setups = [SETUPS[name] for name in block.opts.get("setup", "").split(",") if name]
    code = "\n".join(setups + [block.text])
    d = tempfile.mkdtemp(prefix="doc-test-py-")
    port = str(free_port())
    procs = []
    for r in range(ranks):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(r), WORLD_SIZE=str(ranks),
                   LOCAL_RANK=str(r), OMP_NUM_THREADS="1")
        env["PYTHONPATH"] = os.path.join(os.getcwd(), "torch_backend") + os.pathsep + env.get("PYTHONPATH", "")
        procs.append(subprocess.Popen([sys.executable, "-c", code], cwd=d, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=180))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            return 124, "", "timed out after 180 s"
    rc = max(p.returncode for p in procs) if all(p.returncode >= 0 for p in procs) else 1
    err = "".join(f"--- rank {r} stderr:\n{e[-3000:]}" for r, (_, e) in enumerate(outs) if e.strip())
    return rc, outs[0][0], err


NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")


def line_matches(doc, actual, tol, vary):
    doc_text, act_text = NUMBER.sub("#", " ".join(doc.split())), NUMBER.sub("#", " ".join(actual.split()))
    if doc_text.endswith("...") and doc_text != "...":  # a line shown cut short
        doc_text = doc_text[:-3].rstrip()
        doc = doc.rstrip()[:-3]
        act_text = act_text[:len(doc_text)]
    if doc_text != act_text:
        return False
    if doc.split() and doc.split()[0] in vary:
        return True
    for a, b in zip(NUMBER.findall(doc), NUMBER.findall(actual)):
        x, y = float(a), float(b)
        if abs(x - y) > tol * max(abs(x), abs(y)) and not (tol == 0 and a == b):
            return False
    return True


def output_matches(expected, actual, tol, vary):
    """Whether `actual` (text) matches `expected` (the doc's lines; "..." any lines)."""
    exp = [l for l in expected.rstrip("\n").split("\n")]
    act = [l for l in actual.rstrip("\n").split("\n")]

    def match(i, j):
        if i == len(exp):
            return j == len(act)
        if exp[i].strip() == "...":
            return any(match(i + 1, k) for k in range(j, len(act) + 1))
        return j < len(act) and line_matches(exp[i], act[j], tol, vary) and match(i + 1, j + 1)
    return match(0, 0)


def code_lines(text):
    out = []
    for line in text.split("\n"):
        line = re.sub(r"\s+//.*$|^\s*//.*$|\s+#\s.*$", "", line)
        line = " ".join(line.split())
        if line and line not in ("...",) and not line.startswith("/*"):
            out.append(line)
    return out


def check_excerpt(block):
    path = block.opts["of"]
    source = " ".join(open(path, encoding="utf-8").read().split())
    pos = 0
    for line in code_lines(block.text):
        found = source.find(line, pos)
        if found < 0:
            return f"line not in {path} (after what matched before): {line!r}"
        pos = found + len(line)
    return None


def run_block(b):
    try:
        return run_python(b) if b.kind == "python" else run_sh(b)
    except Exception as e:  # noqa: BLE001 - reported with the block
        return 1, "", f"{type(e).__name__}: {e}"


def test_every_block_runs_or_is_marked(capsys):
    blocks = all_blocks()
    run, skipped, checked, failures = [], [], [], []
    last_run = {}
    # The setup of docs/algorithms.md's fragments begins with the block the page says they assume.
    prelude = SETUPS["algorithms"].strip().split("\n")[:3]
    if not any(b.path == "docs/algorithms.md" and b.text.strip().split("\n") == prelude for b in blocks):
        failures.append("docs/algorithms.md: no python block equal to the start of SETUPS['algorithms'] "
                        f"(the lines every snippet assumes): {prelude}")
    runnable = [b for b in blocks if b.kind in ("python", "sh")]
    with ThreadPoolExecutor(PARALLEL_RUNS) as pool:
        results = dict(zip(map(id, runnable), pool.map(run_block, runnable)))
    for b in blocks:
        try:
            if b.kind is None:
                failures.append(f"{b.where}: a ```{b.lang} block without a doc-test marker (see this test's docstring)")
            elif b.kind == "skip":
                if not b.reason:
                    failures.append(f"{b.where}: skip without a reason")
                skipped.append(b)
            elif b.kind in ("python", "sh"):
                rc, out, err = results[id(b)]
                run.append(b)
                last_run[b.path] = (b, out)
                if rc != 0:
                    failures.append(f"{b.where}: exit status {rc}\n--- block:\n{b.text}--- stdout:\n{out[-3000:]}\n"
                                    f"--- stderr:\n{err[-4000:]}")
            elif b.kind == "output":
                tol = float(b.opts.get("tol", 0))
                vary = set(filter(None, b.opts.get("vary", "").split(",")))
                if "cmd" in b.opts:
                    p = subprocess.run(shlex.split(b.opts["cmd"]), capture_output=True, text=True, timeout=240,
                                       env=base_env())
                    source, out = b.opts["cmd"], p.stdout
                    if p.returncode != 0:
                        failures.append(f"{b.where}: {source}: exit status {p.returncode}\n{p.stderr[-3000:]}")
                        continue
                elif b.path in last_run:
                    source, out = last_run[b.path][0].where, last_run[b.path][1]
                else:
                    failures.append(f"{b.where}: an output block with no run block above it in the file")
                    continue
                checked.append(b)
                if not output_matches(b.text, out, tol, vary):
                    failures.append(f"{b.where}: the output shown differs from the run of {source}\n"
                                    f"--- shown:\n{b.text}--- got:\n{out[-4000:]}")
            elif b.kind == "excerpt":
                checked.append(b)
                problem = check_excerpt(b)
                if problem:
                    failures.append(f"{b.where}: {problem}")
            elif b.kind == "include":
                checked.append(b)
                if open(b.opts["of"], encoding="utf-8").read() != b.text:
                    failures.append(f"{b.where}: the block differs from {b.opts['of']}")
            else:
                failures.append(f"{b.where}: unknown doc-test marker {b.kind!r}")
        except Exception as e:  # noqa: BLE001 - reported with the block
            failures.append(f"{b.where}: {type(e).__name__}: {e}")
    with capsys.disabled():
        print(f"\ndoc blocks: {len(blocks)} blocks in {len(DOC_FILES)} files, {len(run)} run, "
              f"{len(checked)} checked against a run or a source file, {len(skipped)} marked not runnable, "
              f"{len(failures)} failing")
        for b in skipped:
            print(f"  not run: {b.where}: {b.reason}")
        for f in failures:
            print(f"FAIL {f}")
    assert not failures, "\n\n".join(failures)


def test_output_comparison_catches_a_changed_number():
    shown = "method  loss\nsgp     1.3791\n...\n"
    assert output_matches(shown, "method  loss\nsgp     1.3791\nmore\n", 0, set())
    assert not output_matches(shown, "method  loss\nsgp     1.3792\n", 0, set())
    assert output_matches(shown, "method  loss\nsgp     1.3792\n", 1e-3, set())
    assert output_matches(shown, "method  loss\nsgp     9.0\n", 0, {"sgp"})
    assert not output_matches("a\nb\n", "a\nc\nb\n", 0, set())
    assert output_matches("keys: rank [int >= 1], ...\n", "keys: rank [int >= 1], start_iter [int >= 0]\n", 0, set())
    assert not output_matches("keys: rank [int >= 2], ...\n", "keys: rank [int >= 1], start_iter\n", 0, set())


# A command that runs a bare `python`/`python3` (found on PATH: under a pyenv or conda shell,
# an interpreter without torch) instead of the docs' one convention, `/usr/bin/python3`
# (docs/getting-started.md, "The interpreter"); a path before it (a venv's bin/python) is fine.
BARE_INTERPRETER = re.compile(r"(?<![/\w.-])python3?(?=\s+(?:-m\b|-c\b|\S+\.py\b))")
USER_FACING = DOC_FILES + sorted(
    os.path.join(d, f) for d in ("examples/getting_started", "torch_backend/python/examples")
    for f in os.listdir(d) if f.endswith(".py"))


def bare_interpreter_lines(paths):
    return [f"{path}:{i}: {line.strip()}" for path in paths
            for i, line in enumerate(open(path, encoding="utf-8"), 1) if BARE_INTERPRETER.search(line)]


def test_one_interpreter_convention():
    found = bare_interpreter_lines(USER_FACING)
    assert not found, ("commands with a bare python/python3 (write /usr/bin/python3, the docs' convention):\n"
                       + "\n".join(found))


def test_interpreter_check_catches_bare_python(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("python3 -m gossipcc.info\nPYTHONPATH=x python train.py\n/usr/bin/python3 -m gossipcc.info\n"
                    "~/venv/bin/python -m pip install .\nthe python3-torch package\n")
    assert [line.split(": ", 1)[1] for line in bare_interpreter_lines([str(page)])] == [
        "python3 -m gossipcc.info", "PYTHONPATH=x python train.py"]


def first_line_of(path, pattern):
    """1-based number of the first line of `path` matching `pattern`, or None."""
    for i, line in enumerate(open(path, encoding="utf-8"), 1):
        if re.search(pattern, line):
            return i
    return None


FIRST_SCREEN = 40  # lines a newcomer sees before scrolling


def test_a_newcomer_meets_usage_first():
    """The README links the getting-started page on its first screen, and docs/pytorch.md shows
    how to use the backend before how its wheel is built."""
    link = first_line_of("README.md", r"\(docs/getting-started\.md\)")
    assert link is not None and link <= FIRST_SCREEN, f"README.md links docs/getting-started.md at line {link}"
    usage = first_line_of("docs/pytorch.md", r"^```python")
    assert usage is not None and usage <= FIRST_SCREEN, (
        f"docs/pytorch.md's first Python example is at line {usage}, after {FIRST_SCREEN} lines of other matter")
