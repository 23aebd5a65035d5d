"""The reference tables of the manual match the code they describe:

- docs/settings.md lists every app setting the ``Settings`` class reads (and the
  per-remote and per-shard ones it collects), names none it does not (but for the few
  read by the platform or the SDKs, listed below with why), and gives each the default the
  code has;
- docs/dependencies.md lists exactly the packages pinned in requirements.txt,
  requirements-dev.txt and package.json, and marks ``(dev only)`` exactly those Azure
  does not install.

(The table of ``ordersctl`` commands in docs/operate.md is checked against the CLI by
test_docs_commands.py, with the other commands the docs show.)
"""

from __future__ import annotations

import json
import re

from adapters.settings import Settings
from core import names
from core.workflow import remotes
from tests import ROOT
from tests.infra.markdown import DOCS, table

SETTINGS_PAGE = DOCS / "settings.md"
DEPENDENCIES_PAGE = DOCS / "dependencies.md"

#: Settings the table may name that ``Settings`` does not read, and who reads them.
READ_ELSEWHERE = {
    names.WORKER_THREADS_SETTING: "Microsoft's Python worker (its thread pool)",
    "OTEL_TRACES_SAMPLER": "azure-monitor-opentelemetry (the sampler)",
    "OTEL_TRACES_SAMPLER_ARG": "azure-monitor-opentelemetry (the sampling ratio)",
}
#: Fields of ``Settings`` filled from several settings named after a remote or a shard.
COLLECTED = {
    "REQUESTS_QUEUES": [names.requests_queue_setting(remote) for remote in remotes()],
    "REMOTE_URLS": [names.remote_url_setting(remote) for remote in remotes()],
    "SCHEDULER_QUEUES": [names.scheduler_queue_setting(n) for n in range(names.SCHEDULER_QUEUE_SHARDS)],
}
#: Packages not installed by Azure whose files the app ships all the same: not "(dev only)".
VENDORED = {"uplot": "its build is vendored in api/static/, served with the operator page"}
NAME = re.compile(r"`([A-Za-z][A-Za-z0-9_]*)`")


def _aliases(field) -> list[str]:
    alias = field.validation_alias
    return [str(choice) for choice in getattr(alias, "choices", [alias]) if choice]


def code_settings() -> dict[str, object]:
    """App setting -> the ``Settings`` field that reads it (None for a collected one)."""
    found: dict[str, object] = {}
    for field in Settings.model_fields.values():
        for alias in _aliases(field):
            if alias in COLLECTED:
                found.update(dict.fromkeys(COLLECTED[alias]))
            else:
                found[alias] = field
    return found


def documented_rows() -> list[tuple[list[str], str]]:
    rows = table(SETTINGS_PAGE.read_text(encoding="utf-8"))
    assert rows, "docs/settings.md has no table of settings"
    documented = []
    for cells in rows:
        listed = NAME.findall(cells[0])
        if "SCHEDULER_QUEUE_0" in listed and "…" in cells[0]:
            listed += [names.scheduler_queue_setting(n) for n in range(names.SCHEDULER_QUEUE_SHARDS)]
        if "<REMOTE>_REQUESTS_QUEUE" in cells[0]:
            listed += [names.requests_queue_setting(remote) for remote in remotes()]
        documented.append((listed, cells[1]))
    return documented


def test_the_settings_table_lists_every_setting_the_code_reads_and_no_other():
    code = {name for name in code_settings() if "__" not in name}
    listed = {name for names_, _ in documented_rows() for name in names_}
    missing = sorted(code - listed)
    assert not missing, f"docs/settings.md does not list these settings that Settings reads: {missing}"
    unknown = sorted(listed - code - set(READ_ELSEWHERE))
    assert not unknown, f"docs/settings.md lists settings the code does not read: {unknown}"


def test_the_identity_based_forms_are_named():
    """The ``<connection>__<property>`` settings are described together under the table."""
    text = SETTINGS_PAGE.read_text(encoding="utf-8")
    suffixes = sorted({name.split("__", 1)[1] for name in code_settings() if "__" in name})
    unnamed = [suffix for suffix in suffixes if f"__{suffix}" not in text]
    assert not unnamed, f"docs/settings.md does not name the identity-based settings' __{unnamed}"


def _value(text: str) -> str | None:
    """The value a default cell gives, or None for '(required)' / '(none: ...)'."""
    text = text.strip()
    if text.startswith("("):
        return None
    match = re.match(r"`([^`]*)`|([^\s(,]+)", text)
    return match[1] if match[1] is not None else match[2]


def _same(documented: str | None, default) -> bool:
    default = getattr(default, "value", default)
    if documented is None:
        return default is None
    if isinstance(default, bool):
        return documented.lower() == str(default).lower()
    if isinstance(default, (int, float)):
        try:
            return float(documented) == float(default)
        except ValueError:
            return False
    return documented == default


def test_each_documented_default_is_the_code_s():
    settings = code_settings()
    wrong, checked = [], 0
    for listed, default_cell in documented_rows():
        parts = re.split(r" / |, (?=\(|`)", default_cell) if len(listed) > 1 else [default_cell]
        if len(parts) == 1 and default_cell.startswith("("):
            parts = parts * len(listed)  # "(none)" for every name of the row
        for n, name in enumerate(listed):
            field = settings.get(name)
            if field is None or field.is_required() or field.default_factory is not None:
                continue
            checked += 1
            if len(parts) == len(listed):
                if not _same(_value(parts[n]), field.default):
                    wrong.append(f"{name}: the page says {parts[n].strip()!r}, the code's default is {field.default!r}")
            elif f"`{field.default}`" not in default_cell:  # one cell for many names: each default named in it
                wrong.append(f"{name}: its default `{field.default}` is not among {default_cell!r}")
    assert checked >= 30, f"only {checked} defaults were compared: has the table's shape changed?"
    assert not wrong, "docs/settings.md gives other defaults than Settings:\n" + "\n".join(wrong)


# --- dependencies -----------------------------------------------------------------------------


def _pins(path) -> set[str]:
    found = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            found.add(re.split(r"[=<>!~\[; ]", line, maxsplit=1)[0].lower())
    return found


def test_the_dependencies_table_lists_every_pinned_package_and_marks_the_dev_ones():
    runtime = _pins(ROOT / "requirements.txt")
    dev = _pins(ROOT / "requirements-dev.txt") - runtime
    package = json.loads((ROOT / "package.json").read_text(encoding="utf-8"))
    npm = {name.lower() for key in ("dependencies", "devDependencies") for name in package.get(key, {})}

    documented: dict[str, tuple[bool, bool]] = {}  # package -> (npm, dev only)
    for cells in table(DEPENDENCIES_PAGE.read_text(encoding="utf-8")):
        for name in re.findall(r"`([^`]+)`", cells[0]):
            documented[name.lower()] = ("(npm)" in cells[0], "(dev only)" in cells[1])

    python_documented = {name for name, (is_npm, _) in documented.items() if not is_npm}
    npm_documented = {name for name, (is_npm, _) in documented.items() if is_npm}
    assert python_documented == runtime | dev, (
        f"docs/dependencies.md against requirements*.txt: missing {sorted((runtime | dev) - python_documented)}, "
        f"not pinned {sorted(python_documented - runtime - dev)}")
    assert npm_documented == npm, (
        f"docs/dependencies.md against package.json: missing {sorted(npm - npm_documented)}, "
        f"not in package.json {sorted(npm_documented - npm)}")
    marked_wrong = sorted(name for name, (is_npm, dev_only) in documented.items()
                          if dev_only != ((is_npm or name in dev) and name not in VENDORED))
    assert not marked_wrong, f"'(dev only)' should mark exactly what Azure does not install: {marked_wrong}"
