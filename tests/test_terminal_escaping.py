"""Control characters in trace-derived strings reach no terminal or pipe raw (issue 30): ESC
(clear screen, window title, OSC 8 links), CR, BEL, DEL and C1 are shown escaped (`\\x1b`),
whether stdout is a terminal or not."""

from __future__ import annotations

import re
import shutil
import sqlite3

import pytest
from rich.console import Console
from tests.conftest import CliRunner

from stepscope.cli import app
from stepscope.render.names import controls, term
from tests.conftest import FIXTURES, need

EAGER = FIXTURES / "llama8b_decode_b1_eager.sqlite"
ESCAPES = "\x1b[2J\x1b]0;pwned\x07\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\\r\x7f\x9b31m"
RAW = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # what may not appear (tab and newline are rich's own)


@pytest.fixture
def damaged(tmp_path):
    p = tmp_path / "t.sqlite"
    shutil.copy(need(EAGER), p)
    with sqlite3.connect(p) as c:
        c.execute("UPDATE NVTX_EVENTS SET text = text || ? WHERE text LIKE 'step %'", (ESCAPES,))
        c.execute("UPDATE StringIds SET value = value || ? WHERE id IN (SELECT shortName FROM CUPTI_ACTIVITY_KIND_KERNEL)",
                  (ESCAPES,))
        c.execute("UPDATE StringIds SET value = value || ? WHERE value = 'cuLaunchKernelEx'", (ESCAPES,))
        c.execute("UPDATE TARGET_INFO_GPU SET name = name || ?", (ESCAPES,))
    return p


@pytest.mark.parametrize("args", [["analyze"], ["tp"], ["analyze", "--no-cache"]])
def test_a_pipe_gets_no_raw_control_character(damaged, args):
    r = CliRunner().invoke(app, [args[0], str(damaged), *args[1:]])
    assert r.exit_code == 0, r.output
    assert not RAW.search(r.stdout), repr(RAW.search(r.stdout))
    if args[0] == "analyze":
        assert "\\x1b[2J\\x1b]0;pwned\\x07" in r.stdout  # shown, escaped


def test_a_terminal_gets_none_either(damaged, capsys):
    from stepscope.analysis.diagnosis import diagnose
    from stepscope.library import load
    from stepscope.pipeline import result_of
    from stepscope.render.terminal import render_steps

    inv = load(damaged)
    con = Console(force_terminal=True, color_system="truecolor", width=200, record=True)
    render_steps(result_of(diagnose(inv), views=True), console=con, kinds=True)
    text = con.export_text(styles=False)
    assert not RAW.search(text), repr(RAW.search(text))
    assert "\\x1b]8;;http://x" in text


def test_controls_and_term():
    assert controls("a\x1bb\rc\x9b\x7f\x00") == "a\\x1bb\\x0dc\\x9b\\x7f\\x00"
    assert controls("plain name ünïcode") == "plain name ünïcode"
    assert term("[red]x\x1b") == "\\[red]x\\x1b"
