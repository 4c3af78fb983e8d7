"""The README documents every command, and its first two commands are the ones that work."""

from __future__ import annotations

import re

import typer.main

from stepscope.cli import app
from tests.conftest import ROOT


def _commands(group, prefix=""):
    click_group = typer.main.get_command(group) if not hasattr(group, "commands") else group
    for name, cmd in click_group.commands.items():
        yield f"{prefix}{name}"
        if hasattr(cmd, "commands"):
            yield from _commands(cmd, f"{prefix}{name} ")


def test_every_command_is_in_the_readme():
    readme = (ROOT / "README.md").read_text()
    names = list(_commands(app))
    assert {"analyze", "compare", "tp", "trace", "budget", "report", "export", "cells import"} <= set(names)
    missing = [n for n in names if f"stepscope {n}" not in readme]
    assert missing == []


def test_readme_starts_with_the_two_commands():
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", readme, re.S).group(1).splitlines()
    assert block[0].startswith("pip install -e . && stepscope analyze")
    assert "python -m pytest -q" in block[1]
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python -m pytest -q" in ci
