"""Messages that say what is wrong (issue 30): a gzip'd SQLite export is named as such (not "not a
PyTorch-profiler trace"); a WAL-mode export in a folder that cannot be written (a read-only bind
mount made by the test in a mount namespace of its own) says so, not "may be truncated"."""

from __future__ import annotations

import gzip
import os
import shutil
import sqlite3
import subprocess
import sys

import pytest
from tests.conftest import CliRunner

from stepscope.cli import app
from tests.conftest import FIXTURES, need, sha256

EAGER = FIXTURES / "llama8b_decode_b1_eager.sqlite"


def one_line_2(code, err, *needles):
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for n in needles:
        assert n in err, err


@pytest.mark.parametrize("name", ["t.sqlite", "t.sqlite.gz", "t.json.gz"])
@pytest.mark.parametrize("command", ["analyze", "tp", "export"])
def test_a_gzipped_export_says_gunzip_it(tmp_path, name, command):
    p = tmp_path / name
    p.write_bytes(gzip.compress(need(EAGER).read_bytes()[:1 << 20]))
    before = sha256(p)
    args = [command, str(p)] + (["-o", str(tmp_path / "x.json")] if command == "export" else [])
    r = CliRunner().invoke(app, args)
    one_line_2(r.exit_code, r.output, "gzip-compressed SQLite export", "gunzip it first")
    assert sha256(p) == before


def test_a_gzipped_json_trace_is_still_read_as_one(tmp_path):
    p = tmp_path / "t.json.gz"
    p.write_bytes(gzip.compress(b'{"traceEvents": 3'))
    r = CliRunner().invoke(app, ["analyze", str(p)])
    assert r.exit_code == 2 and "gzip-compressed SQLite" not in r.output and "JSON" in r.output, r.output


def test_a_wal_export_in_a_read_only_folder(tmp_path):
    if not shutil.which("unshare") or os.getuid() != 0:
        pytest.skip("needs root and unshare for a read-only bind mount")
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    src.mkdir(), mnt.mkdir()
    p = src / "w.sqlite"
    shutil.copy(need(EAGER), p)
    with sqlite3.connect(p) as c:
        assert c.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal"
    assert not (src / "w.sqlite-shm").exists()
    before = sha256(p)
    script = (f"mount --bind {src} {mnt} && mount -o remount,bind,ro {mnt} || exit 99; "
              f"exec {sys.executable} -m stepscope analyze --no-cache {mnt / 'w.sqlite'}")
    r = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=os.getcwd()))
    if r.returncode == 99:
        pytest.skip("no read-only bind mount here")
    one_line_2(r.returncode, r.stderr, "WAL-mode SQLite export", "cannot write", "copy it to a writable folder")
    assert "truncated" not in r.stderr
    assert sha256(p) == before
