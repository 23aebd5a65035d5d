"""Where things are: the repository root, for the local stack, the demo and the benchmarks."""

from __future__ import annotations

from pathlib import Path

#: The repository root (the app's folder: ``function_app.py`` lives here).
ROOT = Path(__file__).resolve().parent.parent
