"""tools/bench/sitting.py, report.py --update-doc and docgen.py: a page's generated blocks are
rewritten from a sitting's results (fixtures/sitting: a small sitting on 1 host x 2 local ranks,
three steps) and nothing outside them changes; a block for a step the sitting did not run is
kept (an error with --strict); malformed blocks are named; one reduced sitting (--quick, one
benchmark, 2 local ranks) runs and fills a page."""
import json
import os
import shutil
import subprocess
import sys

import pytest

import bench_script

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "sitting")
REPORT = os.path.join(bench_script.TOOLS, "bench", "report.py")

PAGE = """# A page

Prose before, kept byte for byte.   Trailing spaces too.

<!-- generated:sitting -->
stale record
<!-- /generated -->

Between the blocks.

<!-- generated:quantized_allreduce-1x2 -->
old table
| a | b |
<!-- /generated -->

<!-- generated:plot:gossip_vs_allreduce-1x2 -->
<!-- /generated -->
<!-- generated:digits-1x2 -->
<!-- /generated -->

<!-- generated:model_shapes-4x2 -->
a block of a step this sitting did not run
<!-- /generated -->
The end, no newline after it."""


def docgen():
    return bench_script.load("docgen")


def outside(text):
    """The text outside the generated blocks, as a list of pieces."""
    pieces, at = [], 0
    for _, start, end in docgen().blocks(text):
        pieces.append(text[at:start])
        at = end
    return pieces + [text[at:]]


def update(tmp_path, *extra):
    sitting = tmp_path / "sitting"
    shutil.copytree(FIXTURE, sitting)
    page = tmp_path / "docs" / "page.md"
    page.parent.mkdir()
    page.write_text(PAGE)
    out = subprocess.run([sys.executable, REPORT, str(sitting), "--update-doc", str(page)] + list(extra),
                         capture_output=True, text=True, timeout=300)
    return out, page


def test_blocks_are_filled_from_the_sitting_and_nothing_outside_them_changes(tmp_path):
    out, page = update(tmp_path)
    assert out.returncode == 0, out.stderr
    text = page.read_text()
    assert outside(text) == outside(PAGE)
    blocks = {name: text[a:b] for name, a, b in docgen().blocks(text)}
    assert list(blocks) == ["sitting", "quantized_allreduce-1x2", "plot:gossip_vs_allreduce-1x2", "digits-1x2",
                            "model_shapes-4x2"]
    assert "stale record" not in blocks["sitting"]
    assert "| quantized_allreduce-1x2 | `" in blocks["sitting"] and "| digits-1x2 | `" in blocks["sitting"]
    assert "commit 94d2428abbd7" in blocks["sitting"]
    q = blocks["quantized_allreduce-1x2"]
    assert "old table" not in q
    assert "| variant | time (ms) | speed-up vs exact | vs gloo | MB sent/rank/op | MB sent/host/op |" in q
    assert "| quantized 4 bits |" in q and "1 hosts x 2 ranks" in q
    assert "| allreduce-gloo |" in blocks["digits-1x2"] and "MB sent/host/step" in blocks["digits-1x2"]
    assert "![gossip_vs_allreduce-1x2](img/sitting/gossip_vs_allreduce-1x2.png)" in blocks[
        "plot:gossip_vs_allreduce-1x2"]
    png = page.parent / "img" / "sitting" / "gossip_vs_allreduce-1x2.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert blocks["model_shapes-4x2"] == "a block of a step this sitting did not run\n"
    assert "not in this sitting): model_shapes-4x2" in out.stderr
    # Regenerating again changes nothing.
    again = subprocess.run([sys.executable, REPORT, str(tmp_path / "sitting"), "--update-doc", str(page)],
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and page.read_text() == text


def test_strict_refuses_a_block_of_a_step_the_sitting_did_not_run(tmp_path):
    out, page = update(tmp_path, "--strict")
    assert out.returncode == 2 and "model_shapes-4x2" in out.stderr
    assert page.read_text() == PAGE


def test_blocks_rewrites_only_the_named_blocks(tmp_path):
    """--blocks: a sitting of some steps fills its own blocks ("sitting@WHAT" takes the sitting's
    record too) and leaves every other block as it was; an unknown block name is refused."""
    out, page = update(tmp_path, "--blocks", "quantized_allreduce-1x2")
    assert out.returncode == 0, out.stderr
    text = page.read_text()
    blocks = {name: text[a:b] for name, a, b in docgen().blocks(text)}
    assert "old table" not in blocks["quantized_allreduce-1x2"]
    assert blocks["sitting"] == "stale record\n" and blocks["digits-1x2"] == ""
    assert outside(text) == outside(PAGE)
    named = PAGE.replace("<!-- generated:sitting -->", "<!-- generated:sitting@some -->")
    page.write_text(named)
    out = subprocess.run([sys.executable, REPORT, str(tmp_path / "sitting"), "--update-doc", str(page),
                          "--blocks", "sitting@some"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    blocks = {name: page.read_text()[a:b] for name, a, b in docgen().blocks(page.read_text())}
    assert "commit 94d2428abbd7" in blocks["sitting@some"] and "old table" in blocks["quantized_allreduce-1x2"]
    out = subprocess.run([sys.executable, REPORT, str(tmp_path / "sitting"), "--update-doc", str(page),
                          "--blocks", "nonesuch"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "no generated block named nonesuch" in out.stderr


def test_a_refused_or_failed_step_and_a_moved_head_are_said(tmp_path):
    sitting = tmp_path / "sitting"
    shutil.copytree(FIXTURE, sitting)
    record = json.loads((sitting / "sitting.json").read_text())
    q = next(s for s in record["steps"] if s["name"] == "quantized_allreduce-1x2")
    path = sitting / q["results"]
    doc = json.loads(path.read_text())
    doc["refused"] = "2 of 2 trials ran while other processes used more than --max-load 0.5 cores"
    path.write_text(json.dumps(doc))
    d = next(s for s in record["steps"] if s["name"] == "digits-1x2")
    d["error"] = "exit status 1"
    record["commit_at_end"] = dict(record["commit"], head="f" * 40)
    (sitting / "sitting.json").write_text(json.dumps(record))
    page = tmp_path / "page.md"
    page.write_text(PAGE)
    out = subprocess.run([sys.executable, REPORT, str(sitting), "--update-doc", str(page)], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    blocks = {name: page.read_text()[a:b] for name, a, b in docgen().blocks(page.read_text())}
    assert "quantized_allreduce-1x2 was refused: 2 of 2 trials" in blocks["quantized_allreduce-1x2"]
    assert "digits-1x2 failed (exit status 1)" in blocks["digits-1x2"]
    assert "HEAD moved during the sitting, to ffffffffffff" in blocks["sitting"]


@pytest.mark.parametrize("text, words", [
    ("a\n<!-- generated:x -->\nb\n", "line 2: <!-- generated:x --> has no <!-- /generated -->"),
    ("a\n<!-- /generated -->\n", "line 2: <!-- /generated --> without an opening"),
    ("<!-- generated:x -->\n<!-- generated:y -->\n<!-- /generated -->\n", "line 2: a generated block inside"),
    ("<!-- generated:a b -->\n<!-- /generated -->\n", "bad block name"),
    ("<!-- generated:x --> text\n<!-- /generated -->\n", "must end its line"),
])
def test_malformed_blocks_are_named(text, words):
    g = docgen()
    with pytest.raises(g.DocError, match=words.replace("(", r"\(")):
        g.regenerate(text, lambda name: "new")


def test_regenerate_keeps_what_render_declines():
    g = docgen()
    text = "x\n<!-- generated:a -->\nold a\n<!-- /generated -->\ny\n<!-- generated:b -->\nold b\n<!-- /generated -->\n"
    new, rendered, kept = g.regenerate(text, lambda name: "new a" if name == "a" else None)
    assert new == "x\n<!-- generated:a -->\nnew a\n<!-- /generated -->\ny\n<!-- generated:b -->\nold b\n<!-- /generated -->\n"
    assert rendered == ["a"] and kept == ["b"]


def test_layouts_and_steps_are_checked():
    s = bench_script.load("sitting")
    assert s.parse_layouts("4x2,4x1") == [(4, 2), (4, 1)]
    for bad in ("4", "4x", "x2", "4x0", "4by2"):
        with pytest.raises(ValueError, match="HOSTSxRANKS_PER_HOST"):
            s.parse_layouts(bad)
    for argv, words in ((["--only", "nope"], "unknown step(s) nope"), (["--layouts", "3"], "--layouts"),
                        (["--network", "fast"], "network 'fast'"), (["--trials", "0"], "--trials")):
        out = subprocess.run([sys.executable, os.path.join(bench_script.TOOLS, "bench", "sitting.py")] + argv,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and words in out.stderr, (argv, out.stderr)


def test_a_quick_sitting_runs_its_steps_and_fills_the_page(tmp_path):
    """One benchmark of a --quick sitting on 1 host x 2 local ranks (seconds): its step's results,
    the sitting's record and the page's blocks."""
    page = tmp_path / "page.md"
    page.write_text("intro\n<!-- generated:sitting -->\n<!-- /generated -->\n"
                    "<!-- generated:quantized_allreduce-1x2 -->\n<!-- /generated -->\nend\n")
    out = subprocess.run([sys.executable, os.path.join(bench_script.TOOLS, "bench", "sitting.py"), "--quick",
                          "--network", "local", "--layouts", "1x2", "--only", "quantized_allreduce", "--allow-load",
                          "--results-dir", str(tmp_path / "results"), "--doc", str(page)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (folder,) = os.listdir(tmp_path / "results")
    record = json.loads((tmp_path / "results" / folder / "sitting.json").read_text())
    (step,) = record["steps"]
    assert step["name"] == "quantized_allreduce-1x2" and step["rc"] == 0 and step["error"] is None
    assert ["--hosts", "1", "--ranks-per-host", "2"] == step["command"][1:5]
    doc = json.loads((tmp_path / "results" / folder / step["results"]).read_text())
    assert doc["args"]["hosts"] == 1 and doc["args"]["ranks_per_host"] == 2 and doc["args"]["trials"] == 2
    text = page.read_text()
    assert text.startswith("intro\n<!-- generated:sitting -->\n") and text.endswith("<!-- /generated -->\nend\n")
    assert "| quantized_allreduce-1x2 |" in text and "| quantized 8 bits |" in text
