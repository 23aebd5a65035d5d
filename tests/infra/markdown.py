"""Reading the project's Markdown as GitHub renders it: its pages (README.md and docs/),
their headings and the anchors GitHub makes of them, their links, their sections, their
tables, their code blocks and inline code. Used by the tests that keep the docs true
(test_docs_links.py, test_docs_commands.py, test_docs_tables.py) and by the tests that
read a section of a page (test_message_id_rule.py, ...)."""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from tests import ROOT

#: The pages the docs tests keep true: the front door and the manual.
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


@dataclass(frozen=True)
class Line:
    number: int  # 1-based
    text: str
    fence: str | None  # the info string of the fenced block the line is in ("" for none given), else None


FENCE = re.compile(r"^\s*(```+|~~~+)\s*([^`\s]*)")


@cache
def lines(path: Path) -> tuple[Line, ...]:
    """Every line, with the fenced code block it is in (the fence lines themselves are in
    none). Fences may be indented (inside a list item)."""
    out: list[Line] = []
    fence: tuple[str, str] | None = None
    for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        match = FENCE.match(text)
        if fence is None and match:
            fence = (match[1], match[2].lower())
            out.append(Line(number, text, None))
        elif fence is not None and match and match[1].startswith(fence[0]) and not match[2]:
            fence = None
            out.append(Line(number, text, None))
        else:
            out.append(Line(number, text, fence[1] if fence else None))
    return tuple(out)


def prose(path: Path) -> list[Line]:
    """The lines outside fenced code blocks (the fence lines left out)."""
    return [line for line in lines(path) if line.fence is None and not FENCE.match(line.text)]


HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading (github-slugger): the rendered text, lower case,
    without what is not a letter, mark, number, connector, hyphen or space; spaces become
    hyphens."""
    text = LINK.sub(lambda m: m[1], heading)
    text = INLINE_CODE.sub(lambda m: m[2], text).replace("*", "")
    kept = "".join(c for c in text.lower() if c in "- " or unicodedata.category(c)[0] in "LMN" or c == "_")
    return kept.replace(" ", "-")


@dataclass(frozen=True)
class Heading:
    level: int
    text: str
    line: int
    anchor: str


@cache
def headings(path: Path) -> tuple[Heading, ...]:
    found: list[Heading] = []
    seen: dict[str, int] = {}
    for line in prose(path):
        match = HEADING.match(line.text)
        if not match:
            continue
        base = slug(match[2])
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.append(Heading(len(match[1]), match[2], line.number, base if count == 0 else f"{base}-{count}"))
    return tuple(found)


@cache
def anchors(path: Path) -> frozenset[str]:
    html = re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", path.read_text(encoding="utf-8"))
    return frozenset([h.anchor for h in headings(path)] + html)


def section(path: Path, anchor_or_heading: str) -> str:
    """The text of a section, from its heading to the next heading of the same or a higher
    level (its subsections included), found by its anchor or its heading's text."""
    all_lines = path.read_text(encoding="utf-8").splitlines()
    hs = headings(path)
    for n, h in enumerate(hs):
        if anchor_or_heading in (h.anchor, h.text):
            end = next((later.line for later in hs[n + 1:] if later.level <= h.level), len(all_lines) + 1)
            return "\n".join(all_lines[h.line - 1 : end - 1])
    raise KeyError(f"{rel(path)} has no section {anchor_or_heading!r}; its headings: {[h.text for h in hs]}")


@dataclass(frozen=True)
class Link:
    page: Path
    line: int
    target: str


def links(path: Path) -> list[Link]:
    """The links and images of a page's prose (not those in code)."""
    found = []
    for line in prose(path):
        text = INLINE_CODE.sub(lambda m: "code", line.text)
        found += [Link(path, line.number, m[2]) for m in LINK.finditer(text)]
        found += [Link(path, line.number, m[1]) for m in re.finditer(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", text)]
    return found


def inline_code(path: Path) -> list[tuple[int, str]]:
    """Each inline code span of a page's prose, with its line."""
    return [(line.number, m[2].strip()) for line in prose(path) for m in INLINE_CODE.finditer(line.text)]


def table(text: str) -> list[list[str]]:
    """The rows of the first Markdown table in ``text`` (header and separator left out),
    each as its cells; a ``\\|`` stays inside its cell."""
    rows: list[list[str]] = []
    started = False
    for raw in text.splitlines():
        line = raw.strip()
        if not line.startswith("|"):
            if started:
                break
            continue
        started = True
        cells = [cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", line.strip("|"))]
        rows.append(cells)
    if len(rows) >= 2 and set("".join(rows[1])) <= set("-: "):
        rows = rows[2:]
    return rows
