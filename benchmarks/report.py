"""The benchmark report: figures with their targets, tables of detail, and how both are
printed (a rich table on the terminal) and written (``BENCHMARKS.md``).

Every figure has a stable ``key`` (``"pipeline.throughput.1_host"``...), so tests and
readers can find a row whatever its wording.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table as RichTable


@dataclass
class Figure:
    key: str
    label: str
    value: float | int | str | None
    unit: str = ""
    #: The target as text ("≥ 0.5"), if there is one.
    target: str | None = None
    #: Whether the target is met (None: no target, or not measured).
    met: bool | None = None
    note: str = ""

    def shown(self) -> str:
        return format_value(self.value, self.unit)


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[Any]] = field(default_factory=list)
    note: str = ""


@dataclass
class Section:
    key: str
    title: str
    intro: str = ""
    figures: list[Figure] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: Seconds the phase took (shown in the run summary).
    seconds: float | None = None
    #: The machine's 1-minute load average when the phase started and ended.
    load: tuple[float, float] | None = None
    #: Cores kept busy by processes other than the benchmark's, on average over the phase.
    other_cores: float | None = None
    error: str | None = None
    #: A section kept from an earlier report (its Markdown under the heading): not measured in this run.
    kept: str | None = None
    #: Its rows of that report's Targets table.
    kept_targets: list[str] = field(default_factory=list)

    def figure(self, key: str, label: str, value, unit: str = "", **extra) -> Figure:
        fig = Figure(f"{self.key}.{key}", label, value, unit, **extra)
        self.figures.append(fig)
        return fig

    def table(self, title: str, columns: list[str], rows: list[list[Any]] | None = None, note: str = "") -> Table:
        table = Table(title, columns, rows or [], note)
        self.tables.append(table)
        return table


@dataclass
class Report:
    machine: dict[str, str]
    options: dict[str, Any]
    sections: list[Section] = field(default_factory=list)

    def section(self, key: str, title: str, intro: str = "") -> Section:
        section = Section(key, title, intro)
        self.sections.append(section)
        return section

    def figures(self) -> dict[str, Figure]:
        return {f.key: f for s in self.sections for f in s.figures}

    def _contention_warning(self) -> list[str]:
        busy = [s for s in self.sections if s.other_cores is not None and s.other_cores >= 0.25]
        if not busy:
            return []
        phases = ", ".join(f"{s.title} ({s.other_cores:.1f} cores)" for s in busy)
        warning = (
            f"Other work shared the machine during: {phases}. Timings of those phases are pessimistic, "
            "and ratios between phases measured under different load are skewed."
        )
        return [warning, ""]

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, default=str)

    # -- terminal ------------------------------------------------------------------------

    def print(self, console: Console) -> None:
        for section in self.sections:
            if section.error:
                console.print(f"[bold red]{section.title}: not measured[/bold red] ({section.error})")
                continue
            for table in section.tables:
                rich = RichTable(title=f"{section.title}: {table.title}", title_justify="left")
                for i, column in enumerate(table.columns):
                    rich.add_column(column, justify="left" if i == 0 else "right")
                for row in table.rows:
                    rich.add_row(*(format_cell(cell) for cell in row))
                console.print(rich)
        summary = RichTable(title="Benchmark figures", title_justify="left")
        for column in ("figure", "value", "target", "met"):
            summary.add_column(column, justify="right" if column != "figure" else "left")
        for section in self.sections:
            for fig in section.figures:
                met = "" if fig.met is None else ("[green]yes[/green]" if fig.met else "[red]no[/red]")
                summary.add_row(f"{section.title}: {fig.label}", fig.shown(), fig.target or "", met)
        console.print(summary)

    # -- BENCHMARKS.md -------------------------------------------------------------------

    def to_markdown(self) -> str:
        m = self.machine
        out = [
            "# Benchmarks",
            "",
            "Written by `make bench` (`python -m benchmarks`); how to run it and what each figure",
            "means: [docs/benchmarks.md](docs/benchmarks.md). Everything runs on one machine on the",
            "local stack (Azurite, the project's Service Bus emulator, the fake remote service and",
            "local Functions host processes), so the figures compare designs and catch regressions;",
            "they are not Azure's throughput.",
            "",
            "## Machine",
            "",
            "| | |",
            "| --- | --- |",
            f"| date | {m.get('date')} |",
            f"| CPU | {m.get('cpu')} |",
            f"| cores / memory | {m.get('cores')} / {m.get('memory')} |",
            f"| OS | {m.get('os')} |",
            f"| Python / Node.js | {m.get('python')} / {m.get('node')} |",
            f"| Azurite | {m.get('azurite')} |",
            "| SDKs | "
            + ", ".join(f"{name} {m[name]}" for name in m if name.startswith("azure-"))
            + " |",
            f"| options | `{' '.join(_option_words(self.options)) or '(defaults)'}` |",
            f"| run took | {m.get('duration', '?')}; 1-minute load average at the start {m.get('load', '?')} |",
            "",
            "## Targets",
            "",
            *self._contention_warning(),
            "| figure | measured | target | met |",
            "| --- | ---: | ---: | :---: |",
        ]
        for section in self.sections:
            out += section.kept_targets
            for fig in section.figures:
                if fig.target:
                    met = "–" if fig.met is None else ("yes" if fig.met else "**no**")
                    out.append(f"| {section.title}: {fig.label} | {fig.shown()} | {fig.target} | {met} |")
        for section in self.sections:
            out += ["", f"## {section.title}", ""]
            if section.kept is not None:
                out += [section.kept, ""]
                continue
            if section.intro:
                out += [section.intro, ""]
            if section.seconds is not None:
                load = f"; load average {section.load[0]:.1f} → {section.load[1]:.1f}" if section.load else ""
                other = (
                    f"; other processes on the machine kept {section.other_cores:.2f} cores busy"
                    if section.other_cores is not None else ""
                )
                out += [f"*Phase took {section.seconds:.0f} s{load}{other}.*", ""]
            if section.error:
                out += [f"Not measured in this run: {section.error}", ""]
                continue
            if section.figures:
                out += ["| figure | value | target | met |", "| --- | ---: | ---: | :---: |"]
                for fig in section.figures:
                    met = "" if fig.met is None else ("yes" if fig.met else "**no**")
                    label = fig.label + (f" ({fig.note})" if fig.note else "")
                    out.append(f"| {label} | {fig.shown()} | {fig.target or ''} | {met} |")
                out.append("")
            for table in section.tables:
                out += [f"**{table.title}**", ""]
                out.append("| " + " | ".join(table.columns) + " |")
                out.append("| " + " | ".join(["---"] + ["---:"] * (len(table.columns) - 1)) + " |")
                for row in table.rows:
                    out.append("| " + " | ".join(format_cell(cell) for cell in row) + " |")
                out.append("")
                if table.note:
                    out += [table.note, ""]
            for note in section.notes:
                out += [note, ""]
        return "\n".join(out).rstrip() + "\n"


def _option_words(options: dict[str, Any]) -> list[str]:
    words = []
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            words.append(flag)
        elif value not in (False, None):
            words.append(f"{flag} {value}")
    return words


def format_value(value, unit: str = "") -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        if math.isnan(value):
            return "n/a"
        text = _number(value)
    else:
        text = str(value)
    return f"{text} {unit}".strip() if unit else text


def _number(value: float) -> str:
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude >= 100:
        return f"{value:.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def format_cell(cell) -> str:
    if isinstance(cell, float):
        return format_value(cell)
    if cell is None:
        return "–"
    return str(cell)


# --- the sections of the phases not run: kept from the last report -------------------------

#: The line a kept section starts with, naming the run it was measured in.
_KEPT = re.compile(r"^\*Kept from an earlier run \(.*\): not run this time\.\*$")


def kept_sections(path: Path, titles: dict[str, str]) -> list[Section]:
    """The sections titled ``titles`` (key -> title) of an existing report, as they are,
    each with its rows of the report's Targets table; a section kept for the first time
    gets a line naming the run it comes from (its date and options)."""
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    for begin, end in _OWN_SECTIONS:  # the CPU notes', the soak's, the retention benchmark's: not phases
        own = _between(text, begin, end)
        if own:
            text = text.replace(own.rstrip("\n"), "")
    bodies: dict[str, str] = {}
    for chunk in re.split(r"^## ", text, flags=re.MULTILINE)[1:]:
        heading, _, body = chunk.partition("\n")
        bodies[heading.strip()] = body.strip()
    machine = bodies.get("Machine", "")
    date = re.search(r"^\| date \| (.*) \|$", machine, re.MULTILINE)
    options = re.search(r"^\| options \| (.*) \|$", machine, re.MULTILINE)
    run = f"{date[1] if date else 'date unknown'}, options {options[1] if options else 'unknown'}"
    targets = bodies.get("Targets", "").splitlines()
    kept = []
    for key, title in titles.items():
        body = bodies.get(title)
        if body is None:
            continue
        if not _KEPT.match(body.splitlines()[0] if body else ""):
            body = f"*Kept from an earlier run ({run}): not run this time.*\n\n{body}"
        rows = [line for line in targets if line.startswith(f"| {title}: ")]
        kept.append(Section(key, title, kept=body, kept_targets=rows))
    return kept


# --- the sections other commands write into BENCHMARKS.md ----------------------------------

#: ``make soak`` writes its results between these lines; ``make bench`` keeps them.
SOAK_BEGIN = "<!-- chaos soak results: written by make soak -->"
SOAK_END = "<!-- end of chaos soak results -->"
#: ``python -m benchmarks.retention --out BENCHMARKS.md`` writes its results between these; kept too.
RETENTION_BEGIN = "<!-- retention results: written by python -m benchmarks.retention -->"
RETENTION_END = "<!-- end of retention results -->"
#: The CPU profile's notes (benchmarks/hostcpu.py, written by hand from its runs); ``make bench`` keeps them.
CPU_BEGIN = "<!-- where the CPU goes: from python -m benchmarks.hostcpu, kept by make bench -->"
CPU_END = "<!-- end of where the CPU goes -->"
_OWN_SECTIONS = ((CPU_BEGIN, CPU_END), (SOAK_BEGIN, SOAK_END), (RETENTION_BEGIN, RETENTION_END))


def soak_section(path: Path) -> str:
    """The sections other commands wrote in an existing report (the CPU notes, the soak's, the retention
    benchmark's; markers included), or ``""``."""
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    return "".join(_between(text, begin, end) for begin, end in _OWN_SECTIONS)


def _between(text: str, begin_mark: str, end_mark: str) -> str:
    begin, end = text.find(begin_mark), text.find(end_mark)
    if begin < 0 or end < begin:
        return ""
    return text[begin : end + len(end_mark)] + "\n"


def _write_between(path: Path, begin_mark: str, end_mark: str, markdown: str) -> None:
    section = f"{begin_mark}\n{markdown.rstrip()}\n{end_mark}\n"
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    old = _between(text, begin_mark, end_mark)
    text = text.replace(old, section) if old else text.rstrip() + ("\n\n" if text.strip() else "") + section
    path.write_text(text, encoding="utf-8")


def write_soak_section(path: Path, markdown: str) -> None:
    """Put ``markdown`` in the report's soak section, replacing the last one or appending it."""
    _write_between(path, SOAK_BEGIN, SOAK_END, markdown)


def write_retention_section(path: Path, markdown: str) -> None:
    """Put ``markdown`` in the report's retention section, replacing the last one or appending it."""
    _write_between(path, RETENTION_BEGIN, RETENTION_END, markdown)


def cpu_section(path: Path) -> str:
    """The CPU profile's section of an existing report (markers included), or ``""``."""
    return _between(path.read_text(encoding="utf-8") if path.exists() else "", CPU_BEGIN, CPU_END)
