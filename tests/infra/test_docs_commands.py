"""Every command README.md and docs/ show is one the project has, with options it takes.

What counts as a command shown:

- in a fenced code block marked ``bash``, ``sh``, ``shell`` or ``console``: each simple
  command of each line (continuation lines joined; comments, a ``$`` prompt, leading
  ``NAME=value`` assignments and here-documents left out; ``;``, ``&&``, ``||``, ``|`` and
  ``$(...)`` split it) that starts with ``make``, ``python -m`` (also ``python3`` and
  ``.venv/bin/python``) or ``ordersctl``;
- in the prose, an inline code span that starts with ``make <target>``, ``python -m
  <module>``, ``ordersctl <subcommand or option>``, or that sets a variable the Makefile
  hands to a module (``DEMO_ARGS="--orders 500"``).

What is checked:

- ``make``: the target is a rule of the Makefile; a ``NAME=value`` on its line is a
  variable the Makefile reads, and when the Makefile passes it to ``python -m MODULE``
  (``$(PY) -m devtools.demo $(DEMO_ARGS)``), the options in its value are MODULE's;
- ``python -m MODULE``, for a module of this repository (``pytest``, ``pip`` and the
  like are not the project's, and are left alone): the module can be run that way, and
  every option shown (``--name``, ``-x``, ``--name=value``; brackets of an optional part
  ignored) is one its parser declares, for the subcommand shown where it has subcommands
  (``python -m ordersctl archive show``); ``ordersctl`` is ``python -m ordersctl``.
  Each module's parser is read once, without running the module past it
  (tests/infra/cli_surface.py, in one process of its own).

Commands of other tools (``az``, ``azd``, ``func``, ``curl``, ``jq``, ``npm``) are not
checked: their options are theirs.

Also: docs/operate.md's table of ``ordersctl`` commands names every command of the CLI, each
form it shows with options the CLI takes.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest

from tests import ROOT
from tests.infra.markdown import DOCS, inline_code, lines, pages, rel, section, table

SHELL_FENCES = {"bash", "sh", "shell", "console"}
PYTHONS = {"python", "python3", ".venv/bin/python", "$(PY)"}
SPLIT = {";", "&&", "||", "|", "(", ")", "$(", "&"}
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass
class Shown:
    page: Path
    line: int
    text: str
    words: list[str] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{rel(self.page)}:{self.line}: {self.text}"


# --- finding the commands ------------------------------------------------------------


def _words(text: str) -> list[str]:
    try:
        lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|()")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        return list(lexer)
    except ValueError:  # an unbalanced quote in prose: plain words
        return text.split()


def _simple_commands(words: list[str]) -> list[list[str]]:
    commands, current = [], []
    for word in words:
        if word in SPLIT or set(word) <= set(";&|()"):
            commands.append(current)
            current = []
        elif word.endswith("$") and word[:-1] and ASSIGNMENT.match(word):  # NAME=$( ... )
            commands.append(current)
            current = []
        else:
            current.append(word)
    commands.append(current)
    return [c for c in commands if c]


def _project_command(words: list[str]) -> list[str] | None:
    while words and ASSIGNMENT.match(words[0]):
        words = words[1:]
    if not words:
        return None
    head = words[0]
    if head == "make" and len(words) > 1:
        return words
    if head in PYTHONS and len(words) > 2 and words[1] == "-m":
        return ["python", *words[1:]]
    if head == "ordersctl" and len(words) > 1:
        return ["python", "-m", "ordersctl", *words[1:]]
    return None


def _fenced(page: Path) -> list[Shown]:
    shown: list[Shown] = []
    heredoc: str | None = None
    pending: tuple[int, str] | None = None
    for line in lines(page):
        if line.fence not in SHELL_FENCES:
            pending = None
            heredoc = None
            continue
        text = line.text
        if heredoc is not None:
            if text.strip() == heredoc:
                heredoc = None
            continue
        if pending is not None:
            start, text = pending[0], pending[1] + " " + text.strip()
        else:
            start = line.number
            text = re.sub(r"^\s*\$\s+", "", text)
        if text.rstrip().endswith("\\"):
            pending = (start, text.rstrip()[:-1])
            continue
        pending = None
        if match := re.search(r"<<-?\s*['\"]?(\w+)['\"]?", text):
            heredoc = match[1]
            text = text[: match.start()]
        for words in _simple_commands(_words(text)):
            if command := _project_command(words):
                shown.append(Shown(page, start, " ".join(command), command))
    return shown


def _inline(page: Path) -> list[Shown]:
    shown = []
    variables = make_module_variables()
    for number, code in inline_code(page):
        words = [w.strip("[]") for w in _words(code)]
        words = [w for w in words if w and w not in ("...", "…")]
        if not words:
            continue
        head = words[0]
        if head == "make" and len(words) > 1 and re.fullmatch(r"[a-z][a-z.-]*", words[1]):
            shown.append(Shown(page, number, code, words))
        elif head in PYTHONS and len(words) > 2 and words[1] == "-m":
            shown.append(Shown(page, number, code, ["python", *words[1:]]))
        elif head == "ordersctl" and len(words) > 1 and re.fullmatch(r"-{0,2}[a-z][a-z-]*", words[1]):
            shown.append(Shown(page, number, code, ["python", "-m", "ordersctl", *words[1:]]))
        elif (m := re.fullmatch(r"([A-Z_]+)=(.*)", code)) and m[1] in variables:
            shown.append(Shown(page, number, code, ["make", "?", *_words(code)]))
    return shown


@cache
def shown_commands() -> tuple[Shown, ...]:
    return tuple(command for page in pages() for command in (*_fenced(page), *_inline(page)))


# --- what the project has --------------------------------------------------------------

MAKEFILE = ROOT / "Makefile"


@cache
def make_targets() -> frozenset[str]:
    targets = set()
    for line in MAKEFILE.read_text(encoding="utf-8").splitlines():
        if line.startswith(("\t", "#", " ")) or re.match(r"^[A-Za-z_]+\s*[:?+]?=", line):
            continue
        if match := re.match(r"^([^:=#]+):(?!=)", line):
            targets.update(t for t in match[1].split() if "$" not in t and not t.startswith("."))
    return frozenset(targets)


@cache
def make_variables() -> frozenset[str]:
    text = MAKEFILE.read_text(encoding="utf-8")
    return frozenset(re.findall(r"\$\(([A-Z_]+)\)", text)) | frozenset(re.findall(r"^([A-Z_]+)\s*[?:]?=", text, re.M))


@cache
def make_module_variables() -> dict[str, tuple[str, str]]:
    """Variable -> (target, module) for each ``$(PY) -m MODULE ... $(VAR)`` recipe line."""
    found: dict[str, tuple[str, str]] = {}
    target = None
    for line in MAKEFILE.read_text(encoding="utf-8").splitlines():
        if match := re.match(r"^([a-z][a-z-]*):", line):
            target = match[1]
        elif line.startswith("\t") and target and (m := re.search(r"\$\(PY\) -m (\S+)", line)):
            for variable in re.findall(r"\$\(([A-Z_]+_ARGS)\)", line):
                found[variable] = (target, m[1])
    return found


def _is_project_module(module: str) -> bool:
    top = module.split(".")[0]
    return (ROOT / top).is_dir() or (ROOT / f"{top}.py").is_file()


@cache
def surfaces(modules: tuple[str, ...]) -> dict:
    run = subprocess.run([sys.executable, "-m", "tests.infra.cli_surface", *modules], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, f"tests/infra/cli_surface.py failed:\n{run.stderr[-3000:]}"
    return json.loads(run.stdout)


def _python_invocations() -> list[tuple[Shown, str, list[str]]]:
    """(where shown, module, its arguments) for each project module shown, the modules
    behind a make variable included."""
    found = []
    for shown in shown_commands():
        words = shown.words
        if words[0] == "python":
            if _is_project_module(words[2]):
                found.append((shown, words[2], words[3:]))
        else:
            for word in words[1:]:
                name, sep, value = word.partition("=")
                if sep and name in make_module_variables():
                    module = make_module_variables()[name][1]
                    if _is_project_module(module):
                        found.append((shown, module, _words(value)))
    return found


# --- checking a command line against a surface --------------------------------------------


def check_arguments(surface: dict, module: str, arguments: list[str]) -> list[str]:
    problems = []
    node, path, subcommand_taken = surface, f"python -m {module}", False
    for word in arguments:
        if re.match(r"^--?[A-Za-z]", word):
            option = word.split("=", 1)[0]
            if option not in node["options"]:
                problems.append(f"{path} has no option {option} (it has: {', '.join(node['options']) or 'none'})")
        elif node.get("commands") is not None and not subcommand_taken:
            if word in node["commands"]:
                node, path = node["commands"][word], f"{path} {word}"
                subcommand_taken = node.get("commands") is None
            else:
                problems.append(f"{path} has no command {word!r} (it has: {', '.join(node['commands'])})")
                break
    return problems


# --- the tests ------------------------------------------------------------------------------


def test_the_docs_show_commands():
    """The scope above finds the commands a newcomer runs first (if it found nothing, the
    checks below would pass on nothing)."""
    texts = {shown.text for shown in shown_commands() if shown.page.name == "README.md"}
    assert any(t.startswith("make demo") for t in texts) and any(t.startswith("make test") for t in texts)
    assert any("ordersctl send-order" in t for t in texts), texts


def test_every_make_command_is_a_target_with_variables_the_makefile_reads():
    problems = []
    for shown in shown_commands():
        if shown.words[0] != "make":
            continue
        for word in shown.words[1:]:
            name, sep, _ = word.partition("=")
            if sep:
                if name not in make_variables():
                    problems.append(f"{shown.where}\n    the Makefile reads no variable {name}")
            elif word != "?" and word not in make_targets():
                problems.append(f"{shown.where}\n    the Makefile has no target {word!r} "
                                f"(it has: {', '.join(sorted(make_targets()))})")
    assert not problems, "\n".join(problems)


def test_every_python_module_shown_runs_with_python_m():
    problems = []
    for shown in shown_commands():
        if shown.words[0] == "python" and _is_project_module(module := shown.words[2]):
            spec = importlib.util.find_spec(module)
            runnable = spec is not None and (
                spec.submodule_search_locations is None
                or importlib.util.find_spec(f"{module}.__main__") is not None)
            if not runnable:
                problems.append(f"{shown.where}\n    `python -m {module}` does not run: no such module or __main__")
    assert not problems, "\n".join(problems)


def _option_invocations() -> list[tuple[Shown, str, list[str]]]:
    """The invocations whose options or subcommands are checked (a module shown with no
    option at all is only checked to run: its parser is not read)."""
    return [(s, m, a) for s, m, a in _python_invocations() if any(w.startswith("-") for w in a) or m == "ordersctl"]


@cache
def project_surfaces() -> dict:
    """The surface of every module whose options the docs show, read in one process."""
    return surfaces(tuple(sorted({module for _, module, _ in _option_invocations()} | {"ordersctl"})))


def test_every_option_and_subcommand_shown_is_the_module_s():
    invocations = _option_invocations()
    found = project_surfaces()
    problems = []
    for shown, module, arguments in invocations:
        surface = found[module]
        if "error" in surface or not surface.get("parser"):
            problems.append(f"{shown.where}\n    could not read the options of {module}: "
                            f"{surface.get('error', 'it parses no arguments')}")
            continue
        problems += [f"{shown.where}\n    {p}" for p in check_arguments(surface, module, arguments)]
    assert not problems, "commands shown that the project does not have:\n" + "\n".join(problems)


def _leaf_commands(node: dict, prefix: str = "") -> list[str]:
    if node.get("commands") is None:
        return [prefix.strip()]
    return [leaf for name, sub in node["commands"].items() for leaf in _leaf_commands(sub, f"{prefix} {name}")]


def test_the_ordersctl_table_names_every_command_with_options_it_takes():
    """docs/operate.md's table of ordersctl commands: every command of the CLI is in it, and
    every form it shows (``status ORDER [--json]``) is one the CLI takes."""
    rows = table(section(DOCS / "operate.md", "ordersctl"))
    assert rows, "docs/operate.md has no table of ordersctl commands"
    surface = project_surfaces()["ordersctl"]
    problems, documented = [], set()
    for cells in rows:
        for form in re.findall(r"`([^`]+)`", cells[0]):
            words = [w.strip("[]") for w in _words(form) if w.strip("[]") not in ("", "...", "…")]
            problems += [f"docs/operate.md, `{form}`: {p}" for p in check_arguments(surface, "ordersctl", words)]
            node, path = surface, []
            for word in words:
                if node.get("commands") is None or word not in node["commands"]:
                    break
                node, path = node["commands"][word], [*path, word]
            documented.add(" ".join(path))
    missing = sorted(set(_leaf_commands(surface)) - documented)
    assert not missing, f"docs/operate.md's table does not name these ordersctl commands: {missing}"
    assert not problems, "\n".join(problems)


def test_the_option_check_catches_what_is_not_there():
    surface = {"options": ["--help"], "commands": {
        "status": {"options": ["--help", "--json"], "commands": None},
        "archive": {"options": ["--help"], "commands": {"show": {"options": ["--order"], "commands": None}}}}}
    assert check_arguments(surface, "m", ["status", "o-1", "--json"]) == []
    assert check_arguments(surface, "m", ["archive", "show", "2026-11-25", "--order", "o-1"]) == []
    assert check_arguments(surface, "m", ["archive", "show", "--full"]) == [
        "python -m m archive show has no option --full (it has: --order)"]
    assert check_arguments(surface, "m", ["statsu", "o-1"])[0].startswith("python -m m has no command 'statsu'")
    command = _project_command(_words("PROTOCOL_MODEL_EXAMPLES=2000 .venv/bin/python -m ordersctl list --state Error"))
    assert command == ["python", "-m", "ordersctl", "list", "--state", "Error"]
    assert _simple_commands(_words("X=$(python -m ordersctl stamp o-1) && make run RUN_ARGS='--hosts 2'")) == [
        ["python", "-m", "ordersctl", "stamp", "o-1"], ["make", "run", "RUN_ARGS=--hosts 2"]]


@pytest.mark.parametrize("variable", ["DEMO_ARGS", "RUN_ARGS", "BENCH_ARGS", "SOAK_ARGS"])
def test_the_makefile_hands_its_args_variables_to_a_module(variable):
    assert variable in make_module_variables(), f"the Makefile no longer passes ${variable} to a module"
