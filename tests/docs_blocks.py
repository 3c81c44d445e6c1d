"""The examples of README.md and docs/*.md as the docs test runs them: fenced blocks,
their markers and the output their text promises. Pure (no processes).

Why a small extractor rather than a tool for executable Markdown: the tools that fit
(pytest-markdown-docs, phmdoctest, mktestdocs) run Python blocks, and phmdoctest also
shell sessions written as ``$ command`` + output; the examples here are mostly shell
commands against a running cluster (curl, the ``magnetar`` CLI, pipes), run as a script
with the cluster's ports, and Python blocks that share one process (one Spark JVM for
every Spark example). Adapting the docs to a tool's session format would change what a
reader copies; these rules are few and are written down in the docs themselves.

The rules (docs/glossary.md, "docs test"):

- A block fenced with ```` ```sh ````, ```` ```bash ```` or ```` ```python ```` is an
  example and is run. Blocks of any other language (``text``, diagrams without one) are
  not examples.
- ``<!-- docs-test: skip: REASON -->`` on the line right before a fence marks an example
  that cannot run in a test (Kubernetes, ``make`` itself, a long benchmark); the reason
  is required, and the test checks the count of such blocks per file, so an example
  cannot escape unnoticed.
- A comment line ``# → TEXT`` inside an example states output: the example's standard
  output holds TEXT (pieces separated by ``...`` in that order), after whatever the
  statements before it matched.
- ``<!-- docs-test: output -->`` right before a ``text`` block says it is the output of
  the example above it: each of its lines is found in the output, in order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

RUNNABLE = {"sh": "sh", "bash": "sh", "python": "python"}
SKIP_MARKER = re.compile(r"^<!-- docs-test: skip: (?P<reason>\S.*?) -->$")
OUTPUT_MARKER = "<!-- docs-test: output -->"
_ANY_MARKER = re.compile(r"^\s*<!--\s*docs-test")
_FENCE = re.compile(r"^(?P<fence>```+)(?P<info>[^`]*)$")
_EXPECTATION = re.compile(r"^\s*#\s*→\s?(?P<text>.*)$")


@dataclass
class Block:
    path: str
    line: int                       # 1-based line of the opening fence
    kind: str                       # "sh" or "python"
    code: str
    skip_reason: str | None = None
    expectations: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.path}:{self.line}"


class MarkdownError(ValueError):
    pass


def blocks_of(path: Path, root: Path) -> list[Block]:
    """The example blocks of one Markdown file, in order (skipped ones included)."""
    relative = str(path.relative_to(root))
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    index = 0
    while index < len(lines):
        match = _FENCE.match(lines[index])
        if not match:
            if _ANY_MARKER.search(lines[index]) and not (SKIP_MARKER.match(lines[index])
                                                         or lines[index] == OUTPUT_MARKER):
                raise MarkdownError(f"{relative}:{index + 1}: a docs-test marker not written as the rules say")
            index += 1
            continue
        fence, language = match.group("fence"), match.group("info").strip().split(" ")[0]
        end = index + 1
        while end < len(lines) and lines[end].rstrip() != fence:
            end += 1
        if end == len(lines):
            raise MarkdownError(f"{relative}:{index + 1}: a fence that is never closed")
        body = lines[index + 1:end]
        before = lines[index - 1] if index > 0 else ""
        skip = SKIP_MARKER.match(before)
        if language in RUNNABLE:
            block = Block(relative, index + 1, RUNNABLE[language], "\n".join(body) + "\n",
                          skip.group("reason") if skip else None)
            block.expectations = [m.group("text").strip() for m in map(_EXPECTATION.match, body) if m]
            found.append(block)
        elif before == OUTPUT_MARKER:
            if not found or found[-1].skip_reason is not None:
                raise MarkdownError(f"{relative}:{index + 1}: an output block after no example that runs")
            found[-1].expectations += [line.strip() for line in body if line.strip()]
        elif skip:
            raise MarkdownError(f"{relative}:{index + 1}: a skip marker before a block that is no example")
        index = end + 1
    return found


def documents(root: Path) -> list[Path]:
    """README.md, then docs/*.md by name: the order the docs test runs them in (later
    examples may use what earlier ones made, as a reader following them would)."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def find_in_order(output: str, expectations: list[str]) -> str | None:
    """None when every expectation is found in ``output`` in order (``...`` separates
    pieces of one expectation that may have anything between them); else the first
    one that is not."""
    position = 0
    for expectation in expectations:
        for piece in (part.strip() for part in expectation.split("...")):
            if not piece:
                continue
            found = output.find(piece, position)
            if found < 0:
                return expectation
            position = found + len(piece)
    return None


_LOCAL_ADDRESS = re.compile(r"\b(?P<host>127\.0\.0\.1|localhost):(?P<port>\d{2,5})\b")


def with_ports(code: str, ports: dict[int, int]) -> str:
    """``code`` with each documented loopback port replaced by the one the test's
    cluster listens on (nothing else changes; identity when they are the same)."""
    def replace(match: re.Match) -> str:
        port = int(match.group("port"))
        return f"{match.group('host')}:{ports.get(port, port)}"
    return _LOCAL_ADDRESS.sub(replace, code)
