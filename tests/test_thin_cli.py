"""The command line stays thin (issue 32): a command function reads its options and hands them to
the library (capture/run.py's trace_request, bytes/cells_run.py's run_cells, ...); what it does
lives there. Read with ast: every function a Typer app registers (those stepscope/commands/__init__.py's
COMMANDS lists, and the subcommands decorated on their group), its body after the docstring."""

from __future__ import annotations

import ast
from pathlib import Path

COMMANDS = Path(__file__).resolve().parent.parent / "stepscope" / "commands"
MAX_BODY = 25  # lines of a command function's body


def _commands():
    from stepscope.commands import COMMANDS as LISTED

    listed = {spec.replace(":", ".py:") for _, spec in LISTED}
    for path in sorted(COMMANDS.glob("*.py")):
        for n in ast.walk(ast.parse(path.read_text())):
            if isinstance(n, ast.FunctionDef) and (f"{path.name}:{n.name}" in listed or any(
                    "command" in ast.unparse(d) or "callback" in ast.unparse(d) for d in n.decorator_list)):
                body = n.body[1:] if isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant) else n.body
                yield f"{path.name}:{n.name}", body[-1].end_lineno - body[0].lineno + 1 if body else 0


def test_the_reader_finds_the_commands():
    names = {name for name, _ in _commands()}
    assert {"capture.py:trace", "cells.py:run_cmd", "cells.py:show_cmd", "analyze.py:analyze", "budget.py:budget_cmd",
            "calibrate.py:calibrate", "verdicts.py:compare", "report.py:report"} <= names


def test_no_command_function_is_long():
    long = {name: n for name, n in _commands() if n > MAX_BODY}
    assert not long, f"command functions over {MAX_BODY} lines (move the work into the library): {long}"
