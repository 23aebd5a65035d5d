"""Every relative link of README.md and docs/ resolves: the file or folder it names exists,
and an anchor (``page.md#a-heading``, or ``#a-heading`` on the same page) is one GitHub
makes of a heading of that page. Links to the web (``https:``, ``mailto:``) are not
followed: the tests run with no network."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote

import pytest

from tests import ROOT
from tests.infra.markdown import DOCS, README, anchors, headings, links, pages, rel, slug


def _problem(link) -> str | None:
    target = link.target
    if not target or "://" in target or target.split(":", 1)[0] in ("mailto", "tel", "data"):
        return None
    path_part, _, anchor = target.partition("#")
    path = link.page if not path_part else (link.page.parent / unquote(path_part)).resolve()
    if not path.exists():
        return f"{path_part!r} does not exist"
    try:
        path.relative_to(ROOT)
    except ValueError:
        return f"{path_part!r} is outside the repository"
    if anchor:
        if path.suffix != ".md" or path.is_dir():
            return f"#{anchor} on {path_part!r}, which is not a Markdown page"
        if anchor not in anchors(path):
            near = sorted(a for a in anchors(path) if anchor[:6] in a)[:5]
            return f"{rel(path)} has no heading with the anchor #{anchor}" + (f" (close: {near})" if near else "")
    return None


@pytest.mark.parametrize("page", pages(), ids=rel)
def test_every_relative_link_and_anchor_resolves(page: Path):
    broken = [f"{rel(link.page)}:{link.line}: ({link.target}): {problem}"
              for link in links(page) if (problem := _problem(link))]
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_anchors_are_github_s():
    """The slug rules the link check relies on, on headings of this repository."""
    assert slug("The definition (`core/workflow.py`)") == "the-definition-coreworkflowpy"
    assert slug("The target: $10 per million orders at 1,000 orders/s") == (
        "the-target-10-per-million-orders-at-1000-orderss")
    assert slug("The deployment's shape (Bicep parameters)") == "the-deployments-shape-bicep-parameters"
    assert slug("Light-load latency, hop by hop") == "light-load-latency-hop-by-hop"
    assert slug("Ordre é 42 → done") == "ordre-é-42--done"


def test_every_docs_page_is_reachable_from_the_readme():
    """The front door's table of pages names every page of the manual, so a newcomer who
    starts at the README can reach each (docs/ pages may also link to each other)."""
    linked = {(README.parent / link.target.partition("#")[0]).resolve()
              for link in links(README) if link.target.startswith("docs/")}
    missing = [rel(page) for page in sorted(DOCS.glob("*.md")) if page.resolve() not in linked]
    assert not missing, f"README.md links to none of these docs pages: {missing}"


def test_each_page_has_one_title():
    untitled = [rel(page) for page in pages() if not headings(page) or headings(page)[0].level != 1
                or sum(h.level == 1 for h in headings(page)) != 1]
    assert not untitled, f"pages without exactly one '# Title' first: {untitled}"


def test_the_readme_is_a_short_front_door():
    """Issue 37: at most 250 lines, with the sections a newcomer reads in order, and the
    names of the project's card in view; the manual is in docs/."""
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250, f"README.md has {len(text.splitlines())} lines; the manual goes to docs/"
    sections = [h.text for h in headings(README) if h.level == 2]
    assert sections == ["Two commands", "Send one order and watch it", "Where to go next", "Headline figures",
                        "Layout"], sections
    for name in ("function_app.py", "host.json", "requirements.txt", "scheduler", "agents", "supervisor",
                 "infra", "tests"):
        assert f"`{name}" in text, f"README.md no longer names `{name}`"
