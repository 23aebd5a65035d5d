"""What `azd deploy` ships is exactly the app: function_app.py, host.json,
requirements.txt and the app's packages, and nothing else (no tools, tests, docs,
benchmarks, virtualenvs of any name, caches).

The package is built here the way azd builds it (``createDeployableZip`` in
azure-dev's ``pkg/project/project_utils.go``): walk the project folder; leave out
``.azure/``, ``.funcignore`` and ``local.settings.json``; leave out whatever the
``.funcignore`` patterns ignore, a folder with everything below it. Once a
``.funcignore`` exists azd applies no default exclusion of its own (no ``.venv``,
no ``__pycache__``): the file must say everything.

azd matches the patterns with go-gitignore (denormal/go-gitignore), which reads a few
patterns differently from git: an anchored name such as ``/*`` is matched against the
whole relative path with an fnmatch whose ``*`` crosses ``/``, so it also matches
``core/models.py``. Both readings are checked: git's (what the patterns mean, and what
any other gitignore-style tool does) and go-gitignore's (what azd does).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import ROOT

#: The app: what the Functions host needs, and nothing else.
APP_FILES = ("function_app.py", "host.json", "requirements.txt")
APP_FOLDERS = ("core", "adapters", "scheduler", "agents", "supervisor", "api")
#: Files and folders azd leaves out whatever the ignore file says.
AZD_ALWAYS_OUT = {("local.settings.json", False), (".funcignore", False), (".azure", True)}
FLAVOURS = ("git", "azd")

_LIST_IMPORTS = (
    "import json, sys, function_app; "
    "print(json.dumps(sorted({getattr(m, '__file__', None) or '' for m in list(sys.modules.values())})))"
)


# --- the ignore file ------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    line: str
    negated: bool
    #: Started with ``/``.
    anchored: bool
    #: Ended with ``/``: matches folders only.
    directory: bool
    #: The pattern without ``!``, the leading and the trailing ``/``.
    glob: str


def parse(text: str) -> list[Rule]:
    rules = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        glob = line
        negated = glob.startswith("!")
        glob = glob[1:] if negated else glob
        anchored = glob.startswith("/")
        glob = glob[1:] if anchored else glob
        directory = glob.endswith("/")
        glob = glob[:-1] if directory else glob
        rules.append(Rule(line, negated, anchored, directory, glob))
    return rules


def _translate(glob: str, *, pathname: bool) -> str:
    """An fnmatch pattern as a regular expression. With ``pathname`` (FNM_PATHNAME)
    no wildcard matches ``/``; without it ``*`` matches any text, ``/`` included."""
    star, one, no_slash = ("[^/]*", "[^/]", "(?!/)") if pathname else (".*", ".", "")
    out, i = [], 0
    while i < len(glob):
        c = glob[i]
        if c == "*":
            while i + 1 < len(glob) and glob[i + 1] == "*":
                i += 1
            out.append(star)
        elif c == "?":
            out.append(one)
        elif c == "[":
            j = i + 1
            if j < len(glob) and glob[j] in "!^":
                j += 1
            if j < len(glob) and glob[j] == "]":
                j += 1
            while j < len(glob) and glob[j] != "]":
                j += 1
            if j >= len(glob):
                out.append(re.escape(c))
            else:
                body = glob[i + 1 : j]
                body = "^" + body[1:] if body[0] in "!^" else body
                out.append(no_slash + "[" + body.replace("\\", "\\\\") + "]")
                i = j
        elif c == "\\" and i + 1 < len(glob):
            i += 1
            out.append(re.escape(glob[i]))
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def _fnmatch(glob: str, text: str, *, pathname: bool) -> bool:
    return re.fullmatch(_translate(glob, pathname=pathname), text, re.DOTALL) is not None


def _git_matches(rule: Rule, path: str) -> bool:
    """gitignore(5): a pattern with no ``/`` but at its end matches a name at any depth;
    otherwise it matches the path from the top, ``*`` never crossing ``/``; ``**`` as a
    whole component matches any number of folders."""
    if not rule.anchored and "/" not in rule.glob:
        return _fnmatch(rule.glob, path.rsplit("/", 1)[-1], pathname=True)
    segments = rule.glob.split("/")
    regex = ""
    for index, segment in enumerate(segments):
        last = index == len(segments) - 1
        if segment == "**":
            regex += ".+" if last else "(?:[^/]+/)*"
        else:
            regex += _translate(segment, pathname=True) + ("" if last else "/")
    return re.fullmatch(regex, path, re.DOTALL) is not None


def _azd_matches(rule: Rule, path: str) -> bool:
    """go-gitignore (pattern.go): a pattern with ``**`` matches component by component;
    one with an inner ``/`` matches the whole path (FNM_PATHNAME); a plain name matches
    the last component, or, anchored, the whole path with an fnmatch whose ``*`` crosses ``/``."""
    if "**" in rule.glob:
        return _match_components(path.split("/"), [t for t in rule.glob.split("/") if t])
    if "/" in rule.glob:
        return _fnmatch(rule.glob, path, pathname=True)
    if rule.anchored:
        return _fnmatch(rule.glob, path, pathname=False)
    return _fnmatch(rule.glob, path.rsplit("/", 1)[-1], pathname=False)


def _match_components(parts: list[str], tokens: list[str]) -> bool:
    if not tokens:
        return not parts
    if tokens[0] == "**":
        return _match_components(parts, tokens[1:]) or (bool(parts) and _match_components(parts[1:], tokens))
    return bool(parts) and _fnmatch(tokens[0], parts[0], pathname=True) and _match_components(parts[1:], tokens[1:])


def ignored(rules: list[Rule], path: str, is_dir: bool, flavour: str) -> bool:
    """The last rule that matches decides (both readings agree on that)."""
    matches = _git_matches if flavour == "git" else _azd_matches
    for rule in reversed(rules):
        if rule.directory and not is_dir:
            continue
        if matches(rule, path):
            return not rule.negated
    return False


def package(root: Path, flavour: str) -> set[str]:
    """The files azd would put in the zip, as paths relative to ``root``."""
    rules = parse((root / ".funcignore").read_text(encoding="utf-8"))

    def walk(folder: Path, prefix: str) -> Iterator[str]:
        for entry in sorted(os.scandir(folder), key=lambda e: e.name):
            is_dir = entry.is_dir()  # follows symlinks, as azd does
            path = prefix + entry.name
            if (entry.name, is_dir) in AZD_ALWAYS_OUT or ignored(rules, path, is_dir, flavour):
                continue
            if is_dir:
                yield from walk(Path(entry.path), path + "/")
            else:
                yield path

    return set(walk(root, ""))


def is_app(path: str) -> bool:
    return path in APP_FILES or path.split("/", 1)[0] in APP_FOLDERS


def tracked_files() -> list[str]:
    result = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, f"git ls-files failed (the test needs a git checkout): {result.stderr}"
    return [path for path in result.stdout.split("\0") if path and (ROOT / path).is_file()]


# --- the matcher itself ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "path", "is_dir", "git", "azd"),
    [
        ("/*", "core", True, True, True),
        ("/*", "core/models.py", False, False, True),  # go-gitignore's anchored-name reading
        ("__pycache__/", "core/__pycache__", True, True, True),
        ("__pycache__/", "core/__pycache__", False, False, False),
        ("*.pyc", "core/__pycache__/models.cpython-313.pyc", False, True, True),
        ("/core/**", "core/models.py", False, True, True),
        ("/core/**", "core", True, False, True),
        ("docs/*.md", "docs/deploy.md", False, True, True),
        ("docs/*.md", "docs/x/deploy.md", False, False, False),
        ("**/venv", "a/b/venv", True, True, True),
        ("*venv*", "myenv", True, False, False),
        ("*env*", "myenv", True, True, True),
    ],
)
def test_pattern_readings(line, path, is_dir, git, azd):
    rules = parse(line)
    assert ignored(rules, path, is_dir, "git") is git
    assert ignored(rules, path, is_dir, "azd") is azd


# --- the package ----------------------------------------------------------------------


def test_the_package_is_exactly_the_app(tmp_path):
    """In a copy of every tracked file, with a virtualenv under another name, caches and
    local output beside them: the package holds exactly the app's tracked files."""
    copy = tmp_path / "repo"
    tracked = tracked_files()
    junk = [
        "myenv/pyvenv.cfg", "myenv/lib/python3.13/site-packages/requests/__init__.py", "myenv/bin/python",
        ".venv/pyvenv.cfg", ".venv/lib/python3.13/site-packages/azure/functions/__init__.py",
        "core/__pycache__/models.cpython-313.pyc", "adapters/__pycache__/store.cpython-313.pyc",
        "scheduler/dispatch.pyc", "__pycache__/function_app.cpython-313.pyc",
        "demo-output/run.png", "local.settings.json", ".azure/dev/.env", ".pytest_cache/README.md",
        "node_modules/azurite/package.json", "notes.txt",
    ]
    for path in [*tracked, *junk]:
        target = copy / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.touch()
    (copy / ".funcignore").write_text((ROOT / ".funcignore").read_text(encoding="utf-8"), encoding="utf-8")
    expected = {path for path in tracked if is_app(path)}
    assert set(APP_FILES) <= expected, f"an app file is not tracked: {set(APP_FILES) - expected}"
    assert {path.split("/", 1)[0] for path in expected} >= set(APP_FOLDERS)
    for flavour in FLAVOURS:
        shipped = package(copy, flavour)
        assert not shipped - expected, f"{flavour}: .funcignore ships what is not the app: {sorted(shipped - expected)}"
        assert not expected - shipped, f"{flavour}: .funcignore leaves out the app's files: {sorted(expected - shipped)}"


def test_funcignore_keeps_everything_function_app_imports():
    """In the working tree as it is: the package holds only the app, all its tracked
    files, and every first-party module that importing function_app loads."""
    result = subprocess.run(
        [sys.executable, "-c", _LIST_IMPORTS], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    files = [Path(f) for f in json.loads(result.stdout.splitlines()[-1]) if f]
    first_party = {
        f.relative_to(ROOT).as_posix() for f in files
        if f.is_relative_to(ROOT) and not {".venv", "site-packages"} & set(f.relative_to(ROOT).parts)
    }
    assert "function_app.py" in first_party
    not_app = sorted(path for path in first_party if not is_app(path))
    assert not not_app, f"function_app imports modules outside the app's folders: {not_app}"
    tracked_app = {path for path in tracked_files() if is_app(path)}
    for flavour in FLAVOURS:
        shipped = package(ROOT, flavour)
        assert all(is_app(path) for path in shipped), f"{flavour}: {sorted(p for p in shipped if not is_app(p))}"
        left_out = sorted(first_party - shipped)
        assert not left_out, f"{flavour}: .funcignore leaves out modules the app imports: {left_out}"
        assert not tracked_app - shipped, f"{flavour}: {sorted(tracked_app - shipped)}"


def test_the_operator_page_ships_with_the_app():
    """The page's HTML, script, style and chart library (api/static/, no .py among them) are
    read by the app at run time: the package must hold every one of them."""
    static = {path.relative_to(ROOT).as_posix() for path in (ROOT / "api" / "static").iterdir()}
    assert {"api/static/ops.html", "api/static/ops.js", "api/static/uPlot.iife.min.js"} <= static
    for flavour in FLAVOURS:
        shipped = package(ROOT, flavour)
        assert static <= shipped, f"{flavour}: .funcignore leaves out {sorted(static - shipped)}"
