"""nsys's columnar exports (issue 31): `nsys export --type=arrow` and `--type=parquetdir`.

fixtures/columnar/ holds ONE report exported by nsys 2025.3.1 on the H200 three ways (sqlite,
arrow, parquetdir; the commands in fixtures/README.md, "Seventh device round"): every frame the
columnar reader gives must equal the SQLite reader's on it, and its counts plain SQL's.

The other tests convert a committed SQLite export to the two layouts themselves (`to_arrow`,
`to_parquetdir` below: our own conversion, NOT nsys's output) to reach what the real export
does not: a step whose name records no phase (grid/block read again for phase evidence), and
damaged files.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest
from polars.testing import assert_frame_equal

from conftest import FIXTURES, ro
from stepscope.errors import InputError
from stepscope.ingest import read_trace
from stepscope.ingest.nsys_columnar import read_nsys_columnar
from stepscope.ingest.nsys_sqlite import read_nsys_sqlite

_STEM = FIXTURES / "columnar" / "llama-3.2-1b_decode_b1_eager"


class _Real:
    """The real export's three files (the stem holds dots: with_suffix would cut it)."""

    @staticmethod
    def with_suffix(ext: str) -> Path:
        return _STEM.with_name(_STEM.name + ext)


REAL = _Real()


@pytest.fixture
def cli():
    from stepscope.cli import app
    from tests.conftest import CliRunner

    runner = CliRunner()
    return lambda args: runner.invoke(app, args, env={"COLUMNS": "300"})
FRAMES = ("kernels", "memops", "api", "nvtx", "strings", "gpus", "processes", "threads")
SCALARS = ("nsys_version", "schema_version", "graph_level_launches", "profiler_overhead_count",
           "profiler_overhead_ns", "warnings")
BARE = FIXTURES / "round5" / "llama8b_decode_b1_bare.sqlite"


def same_trace(a, b) -> None:
    for f in FRAMES:
        assert_frame_equal(getattr(a, f), getattr(b, f), check_exact=True)
    for s in SCALARS:
        assert getattr(a, s) == getattr(b, s), s


@pytest.mark.parametrize("ext,fmt", [(".arrow", "nsys-arrow"), (".parquetdir", "nsys-parquet")])
@pytest.mark.parametrize("launch_config", [True, False])
def test_real_export_frames_equal_sqlite(ext, fmt, launch_config):
    sqlite_trace = read_nsys_sqlite(REAL.with_suffix(".sqlite"), launch_config)
    col = read_trace(REAL.with_suffix(ext), launch_config=launch_config, cache=False)
    assert col.format == fmt
    same_trace(sqlite_trace, col)
    con = ro(REAL.with_suffix(".sqlite"))
    n_kernels, = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
    n_calls, = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId "
                           "WHERE s.value LIKE 'cudaLaunch%' OR s.value LIKE 'cuLaunch%'").fetchone()
    n_ranges, = con.execute("SELECT count(*) FROM NVTX_EVENTS WHERE eventType IN (59, 60) AND end IS NOT NULL").fetchone()
    assert col.kernels.height == n_kernels == 180
    launches = col.api.join(col.strings, left_on="name_id", right_on="id").filter(
        pl.col("value").str.starts_with("cudaLaunch") | pl.col("value").str.starts_with("cuLaunch"))
    assert launches.height == n_calls
    assert col.nvtx.height == n_ranges
    if launch_config:
        grid_sum, = con.execute("SELECT sum(gridX * gridY * gridZ) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
        assert col.kernels.select((pl.col("grid_x") * pl.col("grid_y") * pl.col("grid_z")).sum()).item() == grid_sum


def test_real_export_arrow_is_ipc_streams_one_per_table():
    """What nsys 2025.3.1 writes for --type=arrow: IPC streams back to back, each named."""
    src = pa.memory_map(str(REAL.with_suffix(".arrow")))
    names = []
    while src.tell() < src.size():
        names.append(ipc.open_stream(src).read_all().schema.metadata[b"table_name"].decode())
    assert {"CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "StringIds", "NVTX_EVENTS"} <= set(names)
    assert sorted(names) == sorted(p.stem for p in REAL.with_suffix(".parquetdir").glob("*.parquet"))


@pytest.mark.parametrize("ext", [".arrow", ".parquetdir"])
def test_cli_analyze_json_same_as_sqlite(cli, ext):
    docs = []
    for e in (".sqlite", ext):
        r = cli(["analyze", str(REAL.with_suffix(e)), "--json", "--steps", "all", "--no-cache"])
        assert r.exit_code == 0, r.output
        doc = json.loads(r.stdout)
        doc["trace"].pop("path")
        docs.append(doc)
    assert docs[0] == docs[1]


# --- our own conversions of a committed SQLite export (not nsys's output) --------------------------

_TYPES = {"INTEGER": pa.int64(), "TEXT": pa.large_string(), "REAL": pa.float64()}


def _tables(path: Path):
    con = ro(path)
    for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall():
        info = con.execute(f"PRAGMA table_info('{name}')").fetchall()
        cols = [r[1] for r in info]
        rows = con.execute(f"SELECT * FROM {name} ORDER BY rowid").fetchall()
        arrays = [pa.array([r[i] for r in rows], type=_TYPES.get(info[i][2].upper(), pa.int64()))
                  for i in range(len(cols))]
        yield pa.Table.from_arrays(arrays, names=cols).replace_schema_metadata({"table_name": name})


def to_arrow(src: Path, dst: Path) -> Path:
    with open(dst, "wb") as f:
        for t in _tables(src):
            with ipc.new_stream(f, t.schema) as w:
                w.write_table(t)
    return dst


def to_parquetdir(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for t in _tables(src):
        pq.write_table(t, dst / f"{t.schema.metadata[b'table_name'].decode()}.parquet")
    return dst


@pytest.fixture(scope="module")
def bare_columnar(tmp_path_factory):
    d = tmp_path_factory.mktemp("bare")
    # the untraced sidecar the capture wrote beside the export, as `stepscope trace` writes it
    shutil.copy(BARE.with_name("llama8b_decode_b1_bare.stepscope.json"), d / "bare.stepscope.json")
    return to_arrow(BARE, d / "bare.arrow"), to_parquetdir(BARE, d / "bare.parquetdir")


def test_converted_bare_phase_evidence_same_as_sqlite(cli, bare_columnar):
    """A step named just 'step': its phase comes from the attention kernel's grid, read again from
    the columnar export (ColumnarLaunchConfig) as from the SQLite one."""
    want = cli(["analyze", str(BARE), "--json", "--steps", "all", "--no-cache"])
    assert want.exit_code == 0
    want_doc = json.loads(want.stdout)
    assert {s["phase_evidence"]["by"] if isinstance(s.get("phase_evidence"), dict) else s.get("phase_by")
            for s in want_doc["steps"]} != {None}
    for path in bare_columnar:
        r = cli(["analyze", str(path), "--json", "--steps", "all", "--no-cache"])
        assert r.exit_code == 0, r.output
        doc = json.loads(r.stdout)
        doc["trace"].pop("path")
        ref = dict(want_doc, trace={k: v for k, v in want_doc["trace"].items() if k != "path"})
        assert doc == ref


def test_converted_launch_config_reader_matches_sqlite(bare_columnar):
    from stepscope.launch_config import ColumnarLaunchConfig, NsysLaunchConfig

    con = ro(BARE)
    ids = [r[0] for r in con.execute("SELECT DISTINCT shortName FROM CUPTI_ACTIVITY_KIND_KERNEL LIMIT 3")]
    want = NsysLaunchConfig(BARE)(ids, ("grid_x", "block_y"))
    (n,) = con.execute(f"SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE shortName IN "
                       f"({','.join(map(str, ids))})").fetchone()
    assert want.height == n > 0
    lo, hi = con.execute("SELECT min(start), max(start) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
    for path, kind in zip(bare_columnar, ("arrow", "parquetdir")):
        reader = ColumnarLaunchConfig(path, kind)
        assert_frame_equal(reader(ids, ("grid_x", "block_y")), want)
        assert_frame_equal(reader.window([0], lo, (lo + hi) // 2), NsysLaunchConfig(BARE).window([0], lo, (lo + hi) // 2))


def test_converted_wrong_typed_column_left_out_and_counted(tmp_path):
    """A kernel start that is text in the Arrow schema: every such row left out, with the SQLite
    reader's words ('not an integer'), never cast."""
    src = to_arrow(BARE, tmp_path / "a.arrow")
    out = tmp_path / "b.arrow"
    with pa.memory_map(str(src)) as m, open(out, "wb") as f:
        while m.tell() < m.size():
            t = ipc.open_stream(m).read_all()
            if t.schema.metadata[b"table_name"] == b"CUPTI_ACTIVITY_KIND_MEMSET":
                i = t.schema.get_field_index("bytes")
                t = t.set_column(i, pa.field("bytes", pa.float64()), t.column(i).cast(pa.float64())).replace_schema_metadata(
                    t.schema.metadata)
            with ipc.new_stream(f, t.schema) as w:
                w.write_table(t)
    trace = read_nsys_columnar(out)
    (n,) = ro(BARE).execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMSET").fetchone()
    assert n > 0 and trace.memops.filter(pl.col("kind") == "memset").height == 0
    assert any(f"{n:,} of {n:,} rows left out (bytes not an integer in {n:,})" in w for w in trace.warnings)


def test_truncated_arrow_is_one_line(cli, tmp_path):
    data = REAL.with_suffix(".arrow").read_bytes()
    bad = tmp_path / "cut.arrow"
    bad.write_bytes(data[: len(data) // 2])
    r = cli(["analyze", str(bad), "--json"])
    assert r.exit_code != 0
    assert "Traceback" not in r.output and "not a readable Arrow export" in r.output


def test_parquetdir_without_kernel_table_is_one_line(cli, tmp_path):
    d = tmp_path / "x.parquetdir"
    shutil.copytree(REAL.with_suffix(".parquetdir"), d)
    (d / "CUPTI_ACTIVITY_KIND_KERNEL.parquet").unlink()
    r = cli(["analyze", str(d), "--json"])
    assert r.exit_code != 0 and "has no kernel table" in r.output and "Traceback" not in r.output


def test_input_never_written(cli, tmp_path):
    d = tmp_path / "ro.parquetdir"
    shutil.copytree(REAL.with_suffix(".parquetdir"), d)
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    assert cli(["analyze", str(d), "--json"]).exit_code == 0
    assert {p.name: p.read_bytes() for p in d.iterdir()} == before


# --- a .nsys-rep given directly; the Arrow export beside a capture's SQLite one ------------------

FAKE_NSYS = """#!/bin/sh
# a stand-in for nsys: `export --help` names the types; `export ... -o OUT REP` copies the
# known SQLite export ($FAKE_EXPORT) to OUT and logs its arguments
if [ "$1" = export ] && [ "$2" = --help ]; then
  echo "	-t, --type="
  echo "           Possible values are: sqlite, hdf, text, json, info, arrow,"
  echo "           arrowdir, and parquetdir."
  exit 0
fi
echo "$@" >> "$FAKE_LOG"
out=""
while [ $# -gt 1 ]; do
  if [ "$1" = -o ]; then out="$2"; fi
  shift
done
[ -n "$FAIL" ] && { echo "Fatal error: cannot read the report" >&2; exit 2; }
cp "$FAKE_EXPORT" "$out"
"""


@pytest.fixture
def fake_nsys(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "nsys"
    exe.write_text(FAKE_NSYS)
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ.get('PATH', '')}")
    monkeypatch.delenv("NSYS", raising=False)
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "nsys.log"))
    monkeypatch.setenv("FAKE_EXPORT", str(REAL.with_suffix(".sqlite")))
    monkeypatch.setenv("STEPSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path


def _report(tmp_path: Path) -> Path:
    d = tmp_path / "ro"
    d.mkdir()
    rep = d / "run.nsys-rep"
    rep.write_bytes(b"not SQLite: a report nsys would read\n")
    d.chmod(0o555)  # a folder the user cannot write: nothing may be written beside the report
    return rep


def test_nsys_rep_exported_to_cache_with_users_nsys(cli, fake_nsys):
    rep = _report(fake_nsys)
    try:
        r = cli(["analyze", str(rep), "--json", "--steps", "all", "--no-cache"])
        assert r.exit_code == 0, r.output
        assert sorted(p.name for p in rep.parent.iterdir()) == ["run.nsys-rep"]
        want = cli(["analyze", str(REAL.with_suffix(".sqlite")), "--json", "--steps", "all", "--no-cache"])
        got, ref = json.loads(r.stdout), json.loads(want.stdout)
        assert Path(got["trace"].pop("path")).is_relative_to(fake_nsys / "cache" / "reports")
        ref["trace"].pop("path")
        assert got == ref
        calls = (fake_nsys / "nsys.log").read_text().splitlines()
        assert len(calls) == 1 and calls[0].startswith("export --type=sqlite") and calls[0].endswith(str(rep))
        # the second analysis of the same report reuses the export
        assert cli(["analyze", str(rep), "--json", "--no-cache"]).exit_code == 0
        assert len((fake_nsys / "nsys.log").read_text().splitlines()) == 1
    finally:
        rep.parent.chmod(0o755)


def test_nsys_rep_export_failure_is_one_line(cli, fake_nsys, monkeypatch):
    monkeypatch.setenv("FAIL", "1")
    rep = _report(fake_nsys)
    try:
        r = cli(["analyze", str(rep), "--json"])
        assert r.exit_code != 0 and "Traceback" not in r.output
        assert "failed (exit 2: Fatal error: cannot read the report)" in r.output
        assert "nsys export --type sqlite" in r.output
        assert not list((fake_nsys / "cache").rglob("*.sqlite"))  # nothing half-written left to reuse
    finally:
        rep.parent.chmod(0o755)


def test_nsys_rep_without_nsys_is_the_hint(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("NSYS", raising=False)
    import stepscope.ingest.report as report

    monkeypatch.setattr(report, "find_nsys", lambda: None)
    rep = tmp_path / "x.nsys-rep"
    rep.write_bytes(b"report")
    r = cli(["analyze", str(rep)])
    assert r.exit_code != 0
    assert f"is an nsys report, not its SQLite export; run: nsys export --type sqlite {rep}" in r.output


def test_export_command_and_types():
    from stepscope.capture.nsys import export_command

    assert export_command("/n/nsys", "/r/a.nsys-rep", "/r/a.arrow", "arrow") == [
        "/n/nsys", "export", "--type=arrow", "--force-overwrite=true", "--quiet=true", "-o", "/r/a.arrow",
        "/r/a.nsys-rep"]


def test_export_arrow_beside_sqlite(fake_nsys, monkeypatch):
    """What `stepscope trace` runs after a capture: the Arrow export when nsys lists the type."""
    from stepscope.capture.nsys import export_arrow, export_types

    exe = fake_nsys / "bin" / "nsys"
    assert {"sqlite", "arrow", "parquetdir"} <= export_types(exe)
    monkeypatch.setenv("FAKE_EXPORT", str(REAL.with_suffix(".arrow")))
    out = fake_nsys / "run.arrow"
    assert export_arrow(exe, fake_nsys / "run.nsys-rep", out) is None
    assert out.read_bytes() == REAL.with_suffix(".arrow").read_bytes()
    old = fake_nsys / "old-nsys"
    old.write_text("#!/bin/sh\necho 'Possible values are: sqlite, hdf, text, json, info.'\n")
    old.chmod(0o755)
    assert "no --type=arrow" in export_arrow(old, fake_nsys / "run.nsys-rep", fake_nsys / "x.arrow")
    assert not (fake_nsys / "x.arrow").exists()
