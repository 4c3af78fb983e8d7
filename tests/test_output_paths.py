"""What an output may replace (issue 30): `-o -` is stdout; an existing target that is not a
regular file (device, FIFO, socket, a symlink to one) is refused with one line before the trace
is read; a symlink to a file is followed (the file written, the link kept); a read-only file is
refused unless --force. Every target here is made by the test in tmp_path."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat

import pytest
from tests.conftest import CliRunner

from stepscope.cli import app
from tests.conftest import FIXTURES, need, sha256

EAGER = FIXTURES / "llama8b_decode_b1_eager.sqlite"
NCU_RAW = FIXTURES / "ncu" / "smoke_ncu_raw.csv"


@pytest.fixture
def trace(tmp_path):
    p = tmp_path / "t.sqlite"
    shutil.copy(need(EAGER), p)
    return p


def invoke(*args):
    return CliRunner().invoke(app, list(map(str, args)))


def one_line_2(r, *needles):
    assert r.exit_code == 2, r.output
    assert len(r.output.strip().splitlines()) == 1 and "Traceback" not in r.output, r.output
    for n in needles:
        assert n in r.output, r.output


COMMANDS = [
    lambda t, o: ["export", t, "-o", o],
    lambda t, o: ["report", t, "-o", o],
    lambda t, o: ["cells", "import", need(NCU_RAW), "-o", o],
]


def _special(tmp_path, kind):
    """A target of `kind` made here, named so every command's extension check passes."""
    if kind == "fifo":
        p = tmp_path / "x.md"
        os.mkfifo(p)
    elif kind == "socket":
        p = tmp_path / "s.md"
        old = os.getcwd()
        os.chdir(tmp_path)  # a socket's path is limited to ~100 bytes: bind the short relative name
        try:
            s = socket.socket(socket.AF_UNIX)
            s.bind("s.md")
        finally:
            os.chdir(old)
    elif kind == "link-to-fifo":
        os.mkfifo(tmp_path / "fifo")
        p = tmp_path / "x.md"
        p.symlink_to(tmp_path / "fifo")
    else:  # a folder
        p = tmp_path / "x.md"
        p.mkdir()
    return p


@pytest.mark.parametrize("kind,says", [("fifo", "FIFO"), ("socket", "socket"),
                                       ("link-to-fifo", "FIFO (named pipe) (through its symlink)"),
                                       ("dir", "directory")])
@pytest.mark.parametrize("command", [0, 1])
def test_a_target_that_is_not_a_regular_file_is_refused(trace, tmp_path, kind, says, command):
    p = _special(tmp_path, kind)
    before = os.lstat(p)
    r = invoke(*COMMANDS[command](trace, p))
    one_line_2(r, says)
    after = os.lstat(p)
    assert (after.st_mode, after.st_ino) == (before.st_mode, before.st_ino)  # not replaced


def test_cells_import_refuses_a_fifo_as_its_parquet(tmp_path):
    os.mkfifo(tmp_path / "c.parquet")
    r = invoke("cells", "import", need(NCU_RAW), "-o", tmp_path / "c.parquet")
    one_line_2(r, "FIFO")
    assert stat.S_ISFIFO(os.lstat(tmp_path / "c.parquet").st_mode)
    assert not (tmp_path / "c.csv").exists()


def test_a_symlink_is_followed_and_kept(trace, tmp_path):
    real = tmp_path / "real.json"
    real.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to("real.json")
    r = invoke("export", trace, "-o", link)
    assert r.exit_code == 0, r.output
    assert link.is_symlink() and os.readlink(link) == "real.json"
    assert json.loads(real.read_text())["traceEvents"]  # the target holds the export


def test_a_dangling_symlink_is_refused(trace, tmp_path):
    link = tmp_path / "link.md"
    link.symlink_to(tmp_path / "nowhere" / "r.md")
    one_line_2(invoke("report", trace, "-o", link), "symlink", "does not exist")
    assert link.is_symlink()


@pytest.mark.parametrize("command", [0, 1, 2])
def test_a_read_only_target_needs_force(trace, tmp_path, command):
    # the tests run as root, for whom access() says every file is writable: the mode bits decide
    out = tmp_path / ("c.parquet" if command == 2 else "x.md")
    out.write_text("keep")
    out.chmod(0o444)
    r = invoke(*COMMANDS[command](trace, out))
    one_line_2(r, "read-only", "--force")
    assert out.read_text() == "keep"
    r = invoke(*COMMANDS[command](trace, out), "--force")
    assert r.exit_code == 0, r.output
    assert out.read_bytes() != b"keep"


def test_a_read_only_target_behind_a_symlink(trace, tmp_path):
    (tmp_path / "real.md").write_text("keep")
    (tmp_path / "real.md").chmod(0o444)
    (tmp_path / "x.md").symlink_to("real.md")
    one_line_2(invoke("report", trace, "-o", tmp_path / "x.md"), "read-only")
    assert (tmp_path / "real.md").read_text() == "keep"


def test_dash_writes_to_stdout(trace, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(app, ["export", str(trace), "-o", "-"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    kernels = [e for e in doc["traceEvents"] if e.get("cat") not in (None, "cuda_api") and e.get("ph") == "X"]
    assert kernels
    r = CliRunner().invoke(app, ["report", str(trace), "-o", "-", "--format", "md"])
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith("## stepscope: t.sqlite")
    r = CliRunner().invoke(app, ["report", str(trace), "-o", "-"])
    assert r.exit_code == 0 and r.stdout.startswith("<!DOCTYPE html>"), r.output[:200]
    assert not (tmp_path / "-").exists()
    one_line_2(invoke("cells", "import", need(NCU_RAW), "-o", "-"), "two files")


def test_the_input_is_untouched(trace, tmp_path):
    before = sha256(trace)
    os.mkfifo(tmp_path / "f.json")
    invoke("export", trace, "-o", tmp_path / "f.json")
    assert sha256(trace) == before
