"""What `azd deploy` / `func azure functionapp publish` ship is enough to run the app:
no first-party module function_app.py imports is left out by .funcignore."""

from __future__ import annotations

import fnmatch
import json
import subprocess
import sys
from pathlib import Path

from tests.infra.conftest import ROOT

_LIST_IMPORTS = (
    "import json, sys, function_app; "
    "print(json.dumps(sorted({getattr(m, '__file__', None) or '' for m in list(sys.modules.values())})))"
)


def ignored(relative: Path, patterns: list[str]) -> bool:
    parts = relative.parts
    for pattern in patterns:
        pattern = pattern.rstrip("/")
        if any(fnmatch.fnmatch(part, pattern) for part in parts) or fnmatch.fnmatch(str(relative), pattern):
            return True
    return False


def test_funcignore_keeps_everything_function_app_imports():
    lines = (ROOT / ".funcignore").read_text().splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    result = subprocess.run(
        [sys.executable, "-c", _LIST_IMPORTS], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    files = [Path(f) for f in json.loads(result.stdout.splitlines()[-1]) if f]
    first_party = [f.relative_to(ROOT) for f in files if f.is_relative_to(ROOT) and ".venv" not in f.parts]
    assert Path("function_app.py") in first_party
    shipped_out = [str(f) for f in first_party if ignored(f, patterns)]
    assert not shipped_out, f".funcignore leaves out modules the app imports: {shipped_out}"
    for needed in ("function_app.py", "host.json", "requirements.txt"):
        assert not ignored(Path(needed), patterns), needed
