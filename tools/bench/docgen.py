"""The generated parts of a markdown page (docs/benchmarks.md): blocks between

    <!-- generated:NAME -->
    ...
    <!-- /generated -->

are rewritten from results; everything outside them is kept byte for byte. NAME is a step of a
sitting (tools/bench/sitting.py: `quantized_allreduce-4x2`), `plot:STEP` (the step's plot,
an image under the page's img/sitting/), or `sitting` (the sitting's own record: commit, machine,
every step's command, time and load).

regenerate(text, render) returns the new text: render(name) gives a block's new content, or None
to leave the block as it is (a step this sitting did not run). DocError names a malformed block
(an opening without its closing, a closing without an opening, a block inside a block, a bad
name) with its line.
"""
import re

OPEN = re.compile(r"<!-- generated:([^\n]*?) -->")
CLOSE = "<!-- /generated -->"
NAME = re.compile(r"^(plot:)?[A-Za-z0-9_.@-]+$")


class DocError(ValueError):
    """A malformed generated block; the message names its line."""


def blocks(text):
    """[(name, start, end)]: each block's name and the character range of its content (between
    the end of the opening line and the start of the closing marker)."""
    out, pos, line_of = [], 0, lambda i: text.count("\n", 0, i) + 1
    while True:
        m = OPEN.search(text, pos)
        close = text.find(CLOSE, pos)
        if m is None:
            if close >= 0:
                raise DocError(f"line {line_of(close)}: {CLOSE} without an opening <!-- generated:NAME -->")
            return out
        if 0 <= close < m.start():
            raise DocError(f"line {line_of(close)}: {CLOSE} without an opening <!-- generated:NAME -->")
        name = m.group(1)
        if not NAME.match(name):
            raise DocError(f"line {line_of(m.start())}: bad block name {name!r} (letters, digits, _ . @ -; "
                           "plot:STEP for a plot)")
        start = text.find("\n", m.end())
        start = len(text) if start < 0 else start + 1
        if text[m.end():start].strip():
            raise DocError(f"line {line_of(m.start())}: <!-- generated:{name} --> must end its line")
        if close < 0:
            raise DocError(f"line {line_of(m.start())}: <!-- generated:{name} --> has no {CLOSE}")
        inner = OPEN.search(text, start, close)
        if inner:
            raise DocError(f"line {line_of(inner.start())}: a generated block inside generated:{name}")
        out.append((name, start, close))
        pos = close + len(CLOSE)


def regenerate(text, render):
    """The text with every block's content replaced by render(name) (None: kept); returns
    (new text, [names rendered], [names kept])."""
    parts, at, rendered, kept = [], 0, [], []
    for name, start, end in blocks(text):
        new = render(name)
        parts.append(text[at:start])
        if new is None:
            parts.append(text[start:end])
            kept.append(name)
        else:
            parts.append(new.rstrip("\n") + "\n")
            rendered.append(name)
        at = end
    parts.append(text[at:])
    return "".join(parts), rendered, kept
