"""Every command of the CLI, listed once (memray's `_COMMANDS`): the order here is the order
`stepscope --help` lists them. A command module defines plain functions (its options as typer
annotations) and registers nothing itself; `register(app)` puts them on the app (cli.py does,
once). A new command is a function in a module and one line here.
"""

from __future__ import annotations

from importlib import import_module

# (command name, "module:function") of stepscope/commands/
COMMANDS: tuple[tuple[str, str], ...] = (
    ("analyze", "analyze:analyze"),
    ("compare", "verdicts:compare"),
    ("tp", "verdicts:tp"),
    ("trace", "capture:trace"),
    ("models", "capture:models"),
    ("doctor", "capture:doctor"),
    ("budget", "budget:budget_cmd"),
    ("report", "report:report"),
    ("export", "report:export"),
    ("calibrate", "calibrate:calibrate"),
)
# (group name, "module:typer app") of the commands with subcommands (listed after the commands)
GROUPS: tuple[tuple[str, str], ...] = (
    ("cells", "cells:cells_app"),
)


def _target(spec: str):
    module, _, name = spec.partition(":")
    return getattr(import_module(f"stepscope.commands.{module}"), name)


def register(app) -> None:
    """Every command of COMMANDS and GROUPS on the Typer `app`, in their order (once per app)."""
    if getattr(app, "stepscope_registered", False):
        return
    for name, spec in COMMANDS:
        app.command(name)(_target(spec))
    for name, spec in GROUPS:
        app.add_typer(_target(spec), name=name)
    app.stepscope_registered = True
