"""``ordersctl cancel``'s input is checked before anything is read or written: a bad order
id or reason is refused with exit code 1 and the reason, with no connection at all (the
cancel itself, recorded and refused, runs against the local stack in tests/e2e/test_cancel.py)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from ordersctl.cli import app


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["cancel", "bad id"], "order_id"),
        (["cancel", "o-1", "--reason", ""], "reason"),
        (["cancel", "o-1", "--reason", "x" * 501], "reason"),
        (["cancel", "o-1", "--reason", "a\tb"], "control characters"),
    ],
)
def test_a_bad_cancel_is_refused_before_any_connection(args, words, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # no local.settings.json to read
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1, result.output
    assert "invalid cancel" in result.output and words in result.output
