"""The README's headline figures link to where they are measured, and say what it says.

Each row of the README's "Headline figures" table links (in any cell) to at least one
section of a page: a heading of BENCHMARKS.md (written by ``make bench``) or of docs/ (the
capacity model's generated tables and the prose around them in docs/scale.md). Every
number of the row's figure cell must appear in the text of a section it links to, so a
figure that is measured again and changes there fails here until the README quotes the new
one."""

from __future__ import annotations

import re
from urllib.parse import unquote

from tests.infra.markdown import LINK, README, rel, section, table

NUMBER = re.compile(r"\d+(?:[.,]\d+)*")


def headline_rows() -> list[list[str]]:
    rows = table(section(README, "Headline figures"))
    assert rows, "README.md has no table under '## Headline figures'"
    return rows


def _sections(row: list[str]) -> list[tuple[str, str]]:
    found = []
    for cell in row:
        for match in LINK.finditer(cell):
            path_part, _, anchor = match[2].partition("#")
            if "://" in match[2] or not path_part or not anchor:
                continue
            path = (README.parent / unquote(path_part)).resolve()
            found.append((f"{rel(path)}#{anchor}", section(path, anchor)))
    return found


def numbers(text: str) -> list[str]:
    return NUMBER.findall(LINK.sub(lambda m: m[1], text))


def appears(number: str, text: str) -> bool:
    return re.search(rf"(?<![\d.,]){re.escape(number)}(?!\d|[.,]\d)", text) is not None


def test_every_headline_figure_links_to_a_section_that_measures_it():
    problems = []
    for row in headline_rows():
        what, figure = row[0], row[1]
        sections = _sections(row)
        if not sections:
            problems.append(f"{what!r}: links to no section of a page (page.md#heading)")
            continue
        text = "\n".join(body for _, body in sections)
        missing = [n for n in numbers(figure) if not appears(n, text)]
        if missing:
            problems.append(f"{what!r}: {missing} not found in {[where for where, _ in sections]}")
    assert not problems, "README.md, Headline figures:\n" + "\n".join(problems)


def test_the_headline_figures_cover_scale_cost_and_the_comparison_with_temporal():
    linked = {where.split("#")[0] for row in headline_rows() for where, _ in _sections(row)}
    assert {"docs/scale.md", "BENCHMARKS.md"} <= linked, linked
    assert any("Temporal" in row[0] for row in headline_rows())


def test_the_number_check_is_strict():
    text = "about 57 orders/s; $9.18 per million; 0.77, 0.80; 3,260 orders/s; 2026-11-28"
    assert appears("57", text) and appears("9.18", text) and appears("3,260", text) and appears("0.80", text)
    assert not appears("5", text) and not appears("9.1", text) and not appears("260", text)
    assert numbers("37.0-41.4 against 48.1-51.9 (0.77-0.80 ×)") == ["37.0", "41.4", "48.1", "51.9", "0.77", "0.80"]

