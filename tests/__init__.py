"""The test suite."""

from pathlib import Path

#: The repository root.
ROOT = Path(__file__).resolve().parent.parent
