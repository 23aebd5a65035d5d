"""``python -m tests.infra.cli_surface MODULE...``: the command-line surface of each module
run as ``python -m MODULE``, as JSON on stdout: its options and, for a command with
subcommands, each subcommand's, as the module's own parser declares them.

Each module is run as ``__main__`` with ``--help``, in this process, with argparse's
``parse_args`` / ``parse_known_args`` and the commands of typer (its bundled click) made
to stop at the first call and hand back the parser or command instead: nothing past the
argument parsing runs. A module that finishes without parsing its arguments is reported
as ``{"parser": null}``. Run in a process of its own (test_docs_commands.py) so that the
patches and the imports stay out of the test session.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import runpy
import sys
import warnings


class _Parsed(Exception):
    def __init__(self, parser) -> None:
        super().__init__()
        self.parser = parser


def _stop(self, *args, **kwargs):
    raise _Parsed(self)


def _argparse_surface(parser: argparse.ArgumentParser) -> dict:
    options: list[str] = []
    commands: dict[str, dict] | None = None
    for action in parser._actions:
        options += action.option_strings
        if isinstance(action, argparse._SubParsersAction):
            commands = {name: _argparse_surface(sub) for name, sub in action.choices.items()}
    return {"options": sorted(set(options)), "commands": commands}


def _click_surface(command) -> dict:
    options = {"--help"}
    for param in command.params:
        if getattr(param, "param_type_name", "") == "option":
            options.update(param.opts)
            options.update(param.secondary_opts)
    commands = getattr(command, "commands", None)
    return {
        "options": sorted(options),
        "commands": None if commands is None else {name: _click_surface(sub) for name, sub in commands.items()},
    }


def surface(module: str) -> dict:
    from typer._click import core as click_core  # typer's own copy of click

    saved = (argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args,
             click_core.Command.__call__, click_core.Command.main, sys.argv)
    argparse.ArgumentParser.parse_args = argparse.ArgumentParser.parse_known_args = _stop
    click_core.Command.__call__ = click_core.Command.main = _stop
    sys.argv = [module, "--help"]
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore", RuntimeWarning)  # runpy: "found in sys.modules after import"
            runpy.run_module(module, run_name="__main__", alter_sys=True)
    except _Parsed as parsed:
        if isinstance(parsed.parser, argparse.ArgumentParser):
            return {"parser": "argparse", **_argparse_surface(parsed.parser)}
        return {"parser": "typer", **_click_surface(parsed.parser)}
    finally:
        (argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args,
         click_core.Command.__call__, click_core.Command.main, sys.argv) = saved
    return {"parser": None, "options": [], "commands": None}


def main() -> None:
    result = {}
    for module in sys.argv[1:]:
        try:
            result[module] = surface(module)
        except BaseException as error:  # noqa: BLE001 - reported to the test, which names the module
            result[module] = {"error": f"{type(error).__name__}: {error}"}
    sys.stdout.write(json.dumps(result))


if __name__ == "__main__":
    main()
