"""The command line: arguments, settings files, and how a broken app or function is reported."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tools.funchost.cli import build_parser
from tools.funchost.testing import IMPORT_ROOT, MODULE

from .support import APP_DIR, eventually, only, records


def run_host(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", MODULE, *args],
        check=False,
        cwd=IMPORT_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_help_names_the_options():
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["--help"])
    assert exit_info.value.code == 0
    usage = build_parser().format_help()
    for option in ("--app-dir", "--settings", "--functions", "--drain-timeout"):
        assert option in usage


def test_an_app_dir_without_function_app_is_a_usage_error(tmp_path):
    result = run_host("--app-dir", str(tmp_path))
    assert result.returncode == 2
    assert "no function_app.py" in result.stderr


def test_an_app_that_fails_to_import_stops_the_host_with_the_reason(tmp_path):
    (tmp_path / "function_app.py").write_text(
        "import azure.functions as func\nraise RuntimeError('broken on import')\n"
    )
    result = run_host("--app-dir", str(tmp_path))
    assert result.returncode == 1
    assert "the worker could not load the app: RuntimeError: broken on import" in result.stderr


def test_an_app_the_runtime_refuses_to_index_stops_the_host_with_the_runtime_s_reason(tmp_path):
    # Microsoft's runtime checks every function's parameters against its bindings when it indexes
    # the app; one function it refuses and no function runs (the worker's init fails, as in Azure).
    (tmp_path / "function_app.py").write_text(
        "import azure.functions as func\napp = func.FunctionApp()\n"
        "@app.queue_trigger(arg_name='msg', queue_name='q', connection='AzureWebJobsStorage')\n"
        "def handler(msg: int) -> None: ...\n"
    )
    result = run_host("--app-dir", str(tmp_path))
    assert result.returncode == 1
    assert "the worker could not load the app: FunctionLoadError: cannot load the handler function: " in result.stderr
    assert "do not match the corresponding function parameter's Python type annotation int" in result.stderr


def test_settings_file_values_apply_and_environment_variables_win(funchost, tmp_path):
    from_file, from_env = tmp_path / "from-file", tmp_path / "from-env"
    from_file.mkdir()
    from_env.mkdir()
    settings = tmp_path / "custom.settings.json"
    settings.write_text(
        json.dumps(
            {"IsEncrypted": False, "Values": {"FH_RECORD_DIR": str(from_file), "FH_TIMER_SCHEDULE": "*/1 * * * * *"}}
        )
    )

    funchost.start(APP_DIR, settings=settings, env={"FH_RECORD_DIR": str(from_env), **only("tick")})

    eventually(lambda: records(from_env, "tick"), what="a tick recorded where the environment says")
    assert records(from_file) == []


def test_an_unresolved_setting_puts_that_function_in_error_and_the_others_run(funchost, tmp_path):
    (host,) = funchost.start(
        APP_DIR, env={"FH_RECORD_DIR": str(tmp_path), **only("tick", "tick_on_startup")}, allow_errors=True
    )
    assert (host.functions, host.errors) == (1, 1)
    assert "Function tick is in error" in host.log_text()
    assert "'%FH_TIMER_SCHEDULE%' does not resolve to a value" in host.log_text()
    eventually(lambda: records(tmp_path, "tick_on_startup"), what="the other function to run")


def test_functions_option_runs_only_the_named_functions(funchost, tmp_path):
    (host,) = funchost.start(
        APP_DIR, env={"FH_RECORD_DIR": str(tmp_path), "FH_TIMER_SCHEDULE": "0 0 0 1 1 *"}, functions=["tick_on_startup"]
    )
    assert host.functions == 1
    assert "Function tick_on_startup:" in host.log_text() and "Function tick:" not in host.log_text()
