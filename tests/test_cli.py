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


# --- one --steps grammar on every command that selects steps -------------------------------

import json  # noqa: E402
import statistics  # noqa: E402

import pytest  # noqa: E402
from tests.conftest import CliRunner  # noqa: E402

from stepscope.cli import app  # noqa: E402
from tests.conftest import EXTERNAL, FIXTURES, need  # noqa: E402

EAGER = FIXTURES / "llama8b_decode_b1_eager.sqlite"
EAGER_TP2 = FIXTURES / "llama8b_decode_b1_eager_tp2.sqlite"
GRAPH_TP2 = FIXTURES / "llama8b_decode_b1_graph_tp2.sqlite"
CLOVER = EXTERNAL / "pipit_cloverleaf.sqlite"  # 10 steps of slightly different lengths
CELLS = FIXTURES / "ncu" / "h200_llama8b_sweep.parquet"


def invoke(*args) -> tuple[int, str]:
    r = CliRunner().invoke(app, [str(a) for a in args])
    return r.exit_code, r.output


def step_times(path) -> dict[int, int]:
    code, out = invoke("analyze", path, "--json")
    assert code == 0, out
    return {s["index"]: s["step_time_ns"] for s in json.loads(out)["steps"]}


@pytest.mark.parametrize("cmd", [["analyze"], ["export", "-o", "x.json"], ["report", "-o", "x.html"],
                                 ["budget", "--cells", "c.parquet"], ["compare", "/nonexistent/b.sqlite"],
                                 ["tp"]])
def test_a_bad_selection_fails_first_on_every_command(cmd):
    """The grammar is checked before any file is read: the message is about --steps, not the
    missing trace."""
    code, out = invoke(cmd[0], "/nonexistent/a.sqlite", *cmd[1:], "--steps", "2-")
    assert code == 2 and "--steps takes all, first, last, N, N-M (ASCII step numbers)" in out, out


def test_compare_medians_over_the_selected_steps():
    times = step_times(need(CLOVER))
    code, out = invoke("compare", CLOVER, CLOVER, "--steps", "2-3", "--steps-b", "7", "--json")
    assert code == 0, out
    doc = json.loads(out)
    assert doc["a"]["steps"] == 2 and doc["b"]["steps"] == 1
    # compare quotes one real step of each selection, its representative: the median by step
    # time (of two, the lower one), never a median of figures
    rep = sorted([2, 3], key=lambda i: times[i])[0]
    assert doc["a"]["step"] == rep and doc["a"]["step_time_ns"] == times[rep]
    assert doc["b"]["step"] == 7 and doc["b"]["step_time_ns"] == times[7]
    assert doc["speedup"] == round(doc["a"]["step_time_ns"] / times[7], 4)


def test_one_ranks_step_selects_its_whole_tp_step():
    """In the TP=2 captures step 0 is rank 0's and step 1 rank 1's: either selects the TP step."""
    every = json.loads(invoke("compare", need(EAGER_TP2), need(GRAPH_TP2), "--json")[1])
    tp = json.loads(invoke("tp", EAGER_TP2, "--json")[1])
    assert every["a"]["steps"] == 1 and every["a"]["rank"]["rank"] == 1  # rank 1's host binds
    for s in ("0", "1"):
        assert json.loads(invoke("compare", EAGER_TP2, GRAPH_TP2, "--json", "--steps", s)[1]) == every
        assert json.loads(invoke("tp", EAGER_TP2, "--json", "--steps", s)[1]) == tp


def test_report_draws_the_typical_step_of_a_selection(tmp_path):
    times = step_times(need(CLOVER))
    sel = [4, 5, 6]  # 31.742, 31.693, 31.607 ms: the median is step 5
    want = sorted(sel, key=lambda i: times[i])[1]
    code, out = invoke("report", CLOVER, "--steps", "4-6", "-o", tmp_path / "r.md")
    assert code == 0 and f"step {want} of" in out, out
    md = (tmp_path / "r.md").read_text()
    assert "a typical step among the 3 selected by --steps 4-6" in md
    # the old flag is an alias: one step, as asked
    code, out = invoke("report", CLOVER, "--step", "7", "-o", tmp_path / "s.md")
    assert code == 0 and "step 7 of" in out and "as asked (--steps 7)" in (tmp_path / "s.md").read_text()


def test_budget_takes_the_grammar_and_keeps_step(tmp_path):
    need(CELLS)
    base = invoke("budget", need(EAGER), "--cells", CELLS, "--json")
    assert base[0] == 0, base[1]
    for flag, value in (("--steps", "0"), ("--step", "0"), ("--steps", "first"), ("--steps", "0-3")):
        assert invoke("budget", EAGER, "--cells", CELLS, "--json", flag, value) == base
    code, out = invoke("budget", EAGER, "--cells", CELLS, "--steps", "3")
    assert code == 2 and "no step 3 in this trace (it has steps 0–0)" in out


# --- progress on stderr, and what the cache wrote ----------------------------------------------

import os  # noqa: E402
import pty  # noqa: E402
import shutil  # noqa: E402

from stepscope.render import progress  # noqa: E402
from tests.conftest import ro  # noqa: E402

# the real entry point with the progress delay taken away, so a fast fixture shows its stages
NO_DELAY = "import stepscope.render.progress as p; p.DELAY_S = 0; from stepscope.cli import main; main()"


def on_a_terminal(*args) -> tuple[int, str, str]:
    """Run the CLI with stderr on a pseudo-terminal and stdout on a pipe: (rc, stdout, what the
    terminal received)."""
    main_fd, sub_fd = pty.openpty()
    p = subprocess.Popen([sys.executable, "-c", NO_DELAY, *map(str, args)], stdout=subprocess.PIPE,
                         stderr=sub_fd, stdin=subprocess.DEVNULL)
    os.close(sub_fd)
    seen = b""
    while True:
        try:
            chunk = os.read(main_fd, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    out = p.stdout.read().decode()
    rc = p.wait(timeout=120)
    os.close(main_fd)
    return rc, out, seen.decode(errors="replace")


def test_progress_shows_the_stages_on_a_terminal_only():
    kernels = ro(need(EAGER)).execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    rc, out, tty = on_a_terminal("analyze", EAGER)
    assert rc == 0 and "launch-bound" in out
    assert "reading llama8b_decode_b1_eager.sqlite" in tty
    assert f"analyzing {kernels} kernels of llama8b_decode_b1_eager.sqlite" in tty
    assert "finding gaps, launch overhead and floors" in tty
    # transient: the line is erased (cursor back, line cleared) and stdout is what a pipe gets
    assert tty.rstrip().endswith("\x1b[2K")
    piped = subprocess.run([sys.executable, "-c", NO_DELAY, "analyze", str(EAGER)], capture_output=True,
                           text=True, timeout=120)
    assert piped.stderr == "" and piped.stdout == out
    # --json documents are for programs: nothing on the terminal either
    rc, out, tty = on_a_terminal("analyze", EAGER, "--json")
    assert rc == 0 and json.loads(out)["steps"][0]["n_kernels"] == kernels and tty == ""


def test_progress_waits_before_showing(monkeypatch, capsys):
    """Work shorter than DELAY_S draws nothing, even on a terminal."""
    monkeypatch.setattr(progress, "_stderr_is_terminal", lambda: True)
    monkeypatch.setattr(progress, "DELAY_S", 0.5)
    with progress.shown():
        progress.stage("reading something quick")
    assert capsys.readouterr().err == ""


def test_a_cache_written_is_announced_with_its_place(tmp_path, monkeypatch):
    from stepscope.ingest import cache

    monkeypatch.setattr(cache, "MIN_KERNELS", 100)  # the fixture has 420 kernels
    p = tmp_path / "trace.sqlite"
    shutil.copy(need(EAGER), p)
    runner = CliRunner()
    r = runner.invoke(app, ["analyze", str(p), "--json", "--no-cache"])
    assert r.exit_code == 0 and r.stderr == ""
    r = runner.invoke(app, ["analyze", str(p), "--json"])
    entry = next((tmp_path / ".stepscope-cache").iterdir())
    assert r.exit_code == 0 and r.stderr == (
        f"stepscope: cached trace.sqlite's frames in {entry} (the next read of this export skips SQLite; "
        "--no-cache reads without it)\n")
    again = runner.invoke(app, ["analyze", str(p), "--json"])  # read from the cache: nothing new written
    assert again.stderr == "" and again.stdout == r.stdout
