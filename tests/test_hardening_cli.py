"""main()'s error boundary and the options every command shares: bad values are one line and
exit 2, never a traceback, never a hang."""

from __future__ import annotations

import subprocess
import sys

import pytest
from typer.testing import CliRunner

from stepscope.cli import app
from tests.conftest import FIXTURES, need

EAGER = FIXTURES / "llama8b_decode_b1_eager.sqlite"

# main() with one library call replaced by a failure, in a fresh interpreter
_BOUNDARY = """
import sys
from polars.exceptions import PanicException
import stepscope.commands.analyze as a
def boom(*args, **kw):
    raise {exc}
a.load_inventory = boom
sys.argv = ["stepscope", "analyze", sys.argv[1]]
from stepscope.cli import main
main()
"""


@pytest.mark.parametrize("exc", ['PanicException("PyObject pointer is null")',
                                 'ValueError("first line\\nthe failing plan\\nmore")'])
def test_internal_errors_are_one_line_exit_3(exc):
    p = subprocess.run([sys.executable, "-c", _BOUNDARY.format(exc=exc), str(need(EAGER))],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 3, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr
    assert "internal error" in p.stderr and "STEPSCOPE_DEBUG" in p.stderr
