"""Paths given to stepscope: inputs are regular files (a FIFO would block forever once opened),
outputs never replace an input, and every output appears whole (temp file, then rename)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys

import pytest
from tests.conftest import CliRunner

from stepscope.cli import app
from tests.conftest import FIXTURES, eager_copy, need, sha256

EAGER = FIXTURES / "llama8b_decode_b1_eager.sqlite"
NCU_RAW = FIXTURES / "ncu" / "smoke_ncu_raw.csv"
CELLS = FIXTURES / "ncu" / "h200_llama8b_sweep.parquet"


def cli(*args, timeout=60):
    """The real entry point (main()'s error boundary included), in a subprocess with a time
    limit: a command that opened a FIFO would block until killed."""
    p = subprocess.run([sys.executable, "-m", "stepscope", *map(os.fsdecode, args)], capture_output=True,
                       text=True, errors="replace", timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def inproc(*args):
    """The same command line through main()'s error boundary in this process (argv decoded as
    the interpreter decodes it: os.fsdecode), where no input could block: an exception past the
    boundary fails the test."""
    r = CliRunner().invoke(app, [*map(os.fsdecode, args)])
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    return r.exit_code, r.stdout, r.stderr


def one_line_exit_2(code, err, *needles):
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for n in needles:
        assert n in err, err


@pytest.fixture
def fifo(tmp_path):
    f = tmp_path / "pipe.sqlite"
    os.mkfifo(f)
    return f


@pytest.mark.parametrize("args", [
    lambda f: ["analyze", f],
    lambda f: ["analyze", EAGER, "--rules", f],
    lambda f: ["budget", EAGER, "--cells", f],
    lambda f: ["cells", "show", f],
    lambda f: ["cells", "import", f, "-o", f.parent / "out.parquet"],
    lambda f: ["report", EAGER, "--compare", f, "-o", f.parent / "r.md"],
    lambda f: ["export", f, "-o", f.parent / "x.json"],
    lambda f: ["compare", EAGER, f],
    lambda f: ["tp", f],
])
def test_a_fifo_is_refused_before_it_is_opened(fifo, args):
    code, out, err = cli(*args(fifo), timeout=60)
    one_line_exit_2(code, err, "FIFO", "regular file")


def test_a_socket_and_a_device_are_refused(tmp_path):
    path = tmp_path / "s.sqlite"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    try:
        one_line_exit_2(*_code_err(cli("analyze", path)), "socket")
    finally:
        s.close()
    one_line_exit_2(*_code_err(cli("analyze", "/dev/zero")), "character device")
    one_line_exit_2(*_code_err(cli("analyze", EAGER, "--rules", "/dev/zero")), "character device")


def _code_err(res):
    code, _, err = res
    return code, err


def test_directories_and_overlong_names_one_line(tmp_path):
    one_line_exit_2(*_code_err(cli("analyze", tmp_path)), "is a directory")
    one_line_exit_2(*_code_err(inproc("analyze", EAGER, "--rules", tmp_path)), "is a directory")
    one_line_exit_2(*_code_err(inproc("cells", "show", tmp_path)), "is a directory")
    long = tmp_path / ("a" * 300 + ".sqlite")
    one_line_exit_2(*_code_err(inproc("analyze", long)), "name too long")
    one_line_exit_2(*_code_err(inproc("export", EAGER, "-o", tmp_path / ("b" * 300 + ".json"))), "name too long")
    # a folder on the way that is a file
    one_line_exit_2(*_code_err(inproc("analyze", EAGER.parent / "README.md" / "x.sqlite")), "Not a directory")


def test_names_that_are_not_utf8_work(tmp_path):
    raw = os.fsencode(tmp_path) + b"/\xff\xfe.sqlite"
    shutil.copy(need(EAGER), raw)
    before = sha256(EAGER)
    code, out, err = cli("analyze", raw, "--json")
    assert code == 0, err
    import json

    assert json.loads(out)["trace"]["path"].endswith("\ufffd\ufffd.sqlite")  # shown, not raw bytes
    code, out, err = cli("report", raw, "-o", os.fsencode(tmp_path) + b"/\xff.md")
    assert code == 0, err
    assert os.path.exists(os.fsencode(tmp_path) + b"/\xff.md")
    code, out, err = cli("compare", raw, EAGER, "--json")
    assert code == 0 and json.loads(out)["speedup"] == 1.0, err
    missing = os.fsencode(tmp_path) + b"/\xfe-missing.sqlite"
    one_line_exit_2(*_code_err(cli("analyze", missing)), "no such file", "\ufffd-missing.sqlite")
    assert sha256(EAGER) == before


# --- never overwrite an input --------------------------------------------------------------

@pytest.fixture
def trace(tmp_path):
    return eager_copy(tmp_path)


def _refused(args, *inputs):
    before = [sha256(p) for p in inputs]
    r = CliRunner().invoke(app, list(map(str, args)))
    assert r.exit_code == 2 and "never overwrites its input" in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1
    assert [sha256(p) for p in inputs] == before


def test_export_and_report_refuse_to_overwrite_their_trace(trace, tmp_path):
    _refused(["export", trace, "-o", trace], trace)
    link = tmp_path / "link.json"
    link.symlink_to(trace)
    _refused(["export", trace, "-o", link], trace)  # a symlink to the trace
    hard = tmp_path / "hard.html"
    os.link(trace, hard)
    _refused(["report", trace, "-o", hard], trace)  # the same inode under another name
    other = tmp_path / "other.md"
    shutil.copy(trace, other)
    _refused(["report", trace, "--compare", other, "-o", other], trace, other)
    # a relative spelling of the same file
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        _refused(["export", "t.sqlite", "-o", "./sub/../t.sqlite"], trace)
    finally:
        os.chdir(cwd)


def test_report_refuses_its_cells_and_rules_file(trace, tmp_path):
    cells = tmp_path / "cells.md"
    shutil.copy(need(CELLS), cells)
    _refused(["report", trace, "--cells", cells, "-o", cells], cells)


def test_cells_import_refuses_to_overwrite_its_csv(tmp_path):
    raw = tmp_path / "raw.csv"
    shutil.copy(need(NCU_RAW), raw)
    _refused(["cells", "import", raw, "-o", raw], raw)
    # -o raw.parquet writes raw.csv beside it: the input
    _refused(["cells", "import", raw, "-o", tmp_path / "raw.parquet"], raw)
    _refused(["cells", "import", raw, "-o", tmp_path / "raw"], raw)
    assert not (tmp_path / "raw.parquet").exists()


def test_cells_import_writes_whole_files_atomically(tmp_path, monkeypatch):
    import polars as pl

    raw = tmp_path / "raw.csv"
    shutil.copy(need(NCU_RAW), raw)
    out = tmp_path / "cells.parquet"
    r = CliRunner().invoke(app, ["cells", "import", str(raw), "-o", str(out)])
    assert r.exit_code == 0, r.output
    good = pl.read_parquet(out)
    assert good.height == 8 and pl.read_csv(tmp_path / "cells.csv").height == 8
    # a writer that fails half-way leaves the old file whole and no temp file behind
    from stepscope.bytes import cells

    def broken(self, path, *a, **k):
        with open(path, "wb") as f:
            f.write(b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pl.DataFrame, "write_parquet", broken)
    with pytest.raises(Exception, match="No space left"):
        cells.write_cells(good, out)
    assert pl.read_parquet(out).equals(good)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cells.csv", "cells.parquet", "raw.csv"]


def test_an_unwritable_output_is_one_line(trace, tmp_path):
    r = CliRunner().invoke(app, ["export", str(trace), "-o", str(tmp_path / "no" / "x.json")])
    assert r.exit_code == 2 and "does not exist" in r.output
    r = CliRunner().invoke(app, ["cells", "import", str(need(NCU_RAW)), "-o", str(trace / "x.parquet")])
    assert r.exit_code == 2 and "cannot write" in r.output and len(r.output.strip().splitlines()) == 1


def test_a_folder_that_cannot_be_searched(trace, monkeypatch):
    """As root every folder can be searched, so the EACCES that stat() meets under a folder
    without x permission is raised by hand, where paths.input_file meets it."""
    import pathlib

    real = pathlib.Path.stat

    def stat(self, *a, **k):
        if self.name == "t.sqlite":
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *a, **k)

    monkeypatch.setattr(pathlib.Path, "stat", stat)
    r = CliRunner().invoke(app, ["analyze", str(trace)])
    assert r.exit_code == 2 and "cannot be opened (Permission denied)" in r.output
    assert len(r.output.strip().splitlines()) == 1
