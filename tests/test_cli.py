"""The command line's shared experience: --version, one --steps grammar, progress, cache notices."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version

from tests.conftest import ROOT


def test_version_is_the_installed_one():
    p = subprocess.run([sys.executable, "-m", "stepscope", "--version"], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0 and p.stderr == ""
    assert p.stdout == f"stepscope {version('stepscope')}\n"
    assert f'version = "{version("stepscope")}"' in (ROOT / "pyproject.toml").read_text()
