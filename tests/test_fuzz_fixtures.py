"""Property tests: the real fixtures, damaged at random (truncated, bytes flipped in pages,
values retyped, columns dropped, keys set to NULL, extreme values, rows moved to far rowids),
through every command.

Whatever the damage: exit 0 with figures that hold together, or exit 2 with one line; never
a traceback, a panic or exit 3; never a changed input (hashed before and after). Both read
paths are drawn: ADBC, and the sqlite3 fallback.

The default `stepscope-quick` profile (tests/conftest.py) keeps a developer's run short (10 examples a property, the
same ones every run); `.ci/run` runs these tests again with HYPOTHESIS_PROFILE=stepscope-ci (30,
the same ones every run: the full setting); HYPOTHESIS_PROFILE=stepscope-explore draws 500 fresh
ones.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import tempfile
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st
from tests.conftest import CliRunner

from stepscope.cli import app
from stepscope.ingest import nsys_sqlite
from tests.conftest import FIXTURES, PROFILE, copy_with, reads_for_itself, sha256

SOURCES = sorted(FIXTURES.glob("*.sqlite"))
CELLS = FIXTURES / "ncu" / "h200_llama8b_sweep.parquet"
K, R = "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME"
COLUMNS = {
    K: ["start", "end", "deviceId", "streamId", "correlationId", "globalPid", "shortName", "demangledName",
        "gridX", "blockX", "graphNodeId"],
    R: ["start", "end", "globalTid", "correlationId", "nameId", "eventClass"],
    "CUPTI_ACTIVITY_KIND_MEMSET": ["start", "end", "deviceId", "streamId", "correlationId", "globalPid", "bytes"],
    "NVTX_EVENTS": ["start", "end", "text", "textId", "globalTid", "eventType"],
    "StringIds": ["id", "value"],
    "TARGET_INFO_GPU": ["id", "name", "smCount", "memoryBandwidth", "totalMemory"],
    "PROCESSES": ["pid", "name"],
    "ThreadNames": ["nameId", "globalTid"],
    "META_DATA_EXPORT": ["name", "value"],
    "PROFILER_OVERHEAD": ["start", "end"],
}
TABLES = sorted(COLUMNS)

values = st.one_of(
    st.sampled_from([0, -1, 1, 2**31 - 1, 2**31, -(2**31) - 1, 2**39, 2**62, -(2**62), 2**63 - 1, -(2**63)]),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.binary(max_size=12),
    st.sampled_from([b"\xff\xfe", "step phase=decode", "x" * 5000, "NaN", "1e400", "[/]", "step [red"]),
    st.none(),
)
rows = st.tuples(st.integers(1, 60), st.integers(0, 59))  # rowid % m == r

retype = st.tuples(st.just("set"), st.sampled_from(TABLES), st.data(), values, rows)
drop = st.tuples(st.just("drop"), st.sampled_from(TABLES), st.data())
loosen = st.tuples(st.just("loosen"), st.sampled_from(TABLES))  # NOT NULL and PRIMARY KEY dropped
delete = st.tuples(st.just("delete"), st.sampled_from(TABLES), rows)
shift = st.tuples(st.just("shift"), st.sampled_from([K, R, "CUPTI_ACTIVITY_KIND_MEMSET"]),
                  st.sampled_from(["start", "end", "correlationId"]),
                  st.sampled_from([1, -1, 2**40, -(2**40), 2**61, 2**62 - 2**41]), rows)
# rows moved to other rowids (negative, or far past the rest: the readers size their slices by them)
renumber = st.tuples(st.just("renumber"), st.sampled_from([K, R, "CUPTI_ACTIVITY_KIND_MEMSET", "NVTX_EVENTS"]),
                     st.sampled_from([-(2**62), -(10**6), 10**6, 2**60]), rows)
# dropping a column refuses the file at once: drawn less often than the value damage
operations = st.lists(st.one_of(retype, retype, retype, loosen, shift, delete, renumber, drop), min_size=1,
                      max_size=6)


def _apply(con: sqlite3.Connection, op) -> None:
    kind, table = op[0], op[1]
    if kind == "set":
        _, _, data, value, (m, r) = op
        col = data.draw(st.sampled_from(COLUMNS[table]))
        con.execute(f"UPDATE {table} SET {col} = ? WHERE rowid % {m} = {r % m}", (value,))
    elif kind == "drop":
        col = op[2].draw(st.sampled_from(COLUMNS[table]))
        con.execute(f"ALTER TABLE {table} DROP COLUMN {col}")
    elif kind == "loosen":
        con.execute(f"CREATE TABLE _t AS SELECT * FROM {table}")
        con.execute(f"DROP TABLE {table}")
        con.execute(f"ALTER TABLE _t RENAME TO {table}")
    elif kind == "delete":
        m, r = op[2]
        con.execute(f"DELETE FROM {table} WHERE rowid % {m} = {r % m}")
    elif kind == "renumber":
        _, _, by, (m, r) = op
        con.execute(f"UPDATE {table} SET rowid = rowid + ({by}) WHERE rowid % {m} = {r % m}")
    elif kind == "shift":
        _, _, col, by, (m, r) = op
        con.execute(f"UPDATE {table} SET {col} = {col} + ({by}) WHERE rowid % {m} = {r % m} "
                    f"AND abs({col}) < {2**62}")


def _damaged(folder: Path, source: Path, ops) -> Path:
    # the damage a file cannot take: a missing table, a constraint, a value past 64 bits
    return copy_with(folder, source, ops, _apply, skip=(sqlite3.Error, OverflowError))


PATHS = st.sampled_from(["adbc", "sqlite3"])


@contextlib.contextmanager
def _read_path(kind: str):
    """adbc: the tables through ADBC; sqlite3: sqlite3 alone (ADBC absent)."""
    real = nsys_sqlite._attach_adbc
    if kind == "sqlite3":
        nsys_sqlite._attach_adbc = lambda con, path: None
    try:
        with reads_for_itself():  # the committed source too, through the path chosen
            yield
    finally:
        nsys_sqlite._attach_adbc = real


def _run(args, *inputs: Path):
    before = [sha256(p) for p in inputs]
    r = CliRunner().invoke(app, [*map(str, args)])
    assert r.exception is None or isinstance(r.exception, SystemExit), f"{args}: {r.exception!r}"
    assert r.exit_code in (0, 2), (args, r.exit_code, r.output[-2000:])
    if r.exit_code == 2:
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("stepscope: error: "), (args, r.stderr)
    assert "Traceback" not in r.output and "panicked" not in r.output
    assert [sha256(p) for p in inputs] == before, f"{args} changed an input"
    return r


def _kernel_rows(p: Path) -> int:
    try:
        with contextlib.closing(sqlite3.connect(p.resolve().as_uri() + "?mode=ro", uri=True)) as con:
            return con.execute(f"SELECT count(*) FROM {K}").fetchone()[0]
    except sqlite3.Error:
        return 10**9


def _sane(doc: dict, p: Path) -> None:
    assert all(isinstance(w, str) for w in doc["warnings"])
    assert not any("cannot be right" in w for w in doc["warnings"]), doc["warnings"]
    assert doc["steps"], "exit 0 with no step"
    assert sum(s["n_kernels"] for s in doc["steps"]) <= _kernel_rows(p)
    for s in doc["steps"]:
        for k in ("step_time_ns", "kernel_time_sum_ns", "gpu_busy_ns", "gpu_span_ns", "idle_ns",
                  "n_launch_calls", "launch_call_ns"):
            assert isinstance(s[k], int) and s[k] >= 0, (k, s[k])
        assert s["gpu_busy_ns"] + s["idle_ns"] == s["gpu_span_ns"]
        kernels = {c: v for c, v in s["classes"].items() if c != "memops"}
        assert sum(v["count"] for v in kernels.values()) == s["n_kernels"]
        assert sum(v["time_ns"] for v in kernels.values()) == s["kernel_time_sum_ns"]
        assert sum(k["count"] for k in s["kernels"] if k["class"] != "memops") == s["n_kernels"]
        assert s["floors"]["device_floor_ns"] >= 0 and s["floors"]["cpu_floor_ns"] >= 0


@PROFILE
@given(source=st.sampled_from(SOURCES), ops=operations, path=PATHS)
def test_analyze_survives_damaged_values(source, ops, path):
    with tempfile.TemporaryDirectory() as d, _read_path(path):
        p = _damaged(Path(d), source, ops)
        r = _run(["analyze", p, "--json", "--no-cache"], p)
        if r.exit_code == 0:
            _sane(json.loads(r.stdout), p)
            _run(["analyze", p, "--no-cache"], p)  # the terminal report too


COMMANDS = st.sampled_from(["compare", "tp", "report-md", "report-html", "export", "budget"])


@PROFILE
@given(source=st.sampled_from(SOURCES), ops=operations, command=COMMANDS, path=PATHS)
def test_every_command_survives_damaged_values(source, ops, command, path):
    with tempfile.TemporaryDirectory() as d, _read_path(path):
        p = _damaged(Path(d), source, ops)
        out = Path(d) / "out"
        args = {
            "compare": ["compare", source, p, "--json", "--no-cache"],
            "tp": ["tp", p, "--json", "--no-cache"],
            "report-md": ["report", p, "--compare", source, "-o", out.with_suffix(".md")],
            "report-html": ["report", p, "-o", out.with_suffix(".html")],
            "export": ["export", p, "-o", out.with_suffix(".json")],
            "budget": ["budget", p, "--cells", CELLS, "--json"],
        }[command]
        r = _run(args, p, source)
        if r.exit_code == 0 and command in ("compare", "tp", "budget"):
            doc = json.loads(r.stdout)
            if command == "tp":
                assert all(row["step_time_ns"] >= 0 for row in doc["projection"])
            if command == "compare":
                assert doc["speedup"] is None or doc["speedup"] >= 0
        if r.exit_code == 0 and command.startswith(("report", "export")):
            assert any(Path(d).glob("out.*"))


@PROFILE
@given(source=st.sampled_from(SOURCES), pages=st.one_of(st.none(), st.integers(1, 150)), flips=st.lists(
    st.tuples(st.integers(100, 600_000), st.integers(0, 255)), max_size=40),
    header=st.lists(st.tuples(st.integers(16, 99), st.integers(0, 255)), max_size=2), path=PATHS)
def test_truncated_and_flipped_files(source, pages, flips, header, path):
    data = bytearray(source.read_bytes())
    for where, byte in flips + header:  # bytes in the pages (b-tree cells, records) and in the header
        data[where % len(data)] = byte
    if pages is not None:  # the tail lost, at a page boundary or not
        data = data[: pages * 4096 + (pages % 3) * 1000]
    with tempfile.TemporaryDirectory() as d, _read_path(path):
        p = Path(d) / "t.sqlite"
        p.write_bytes(bytes(data))
        r = _run(["analyze", p, "--json", "--no-cache"], p)
        if r.exit_code == 0:
            _sane(json.loads(r.stdout), p)


TORCH = FIXTURES / "torch_profiler" / "llama8b_decode_b1_eager.torch.json.gz"
json_values = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                        st.text(max_size=8), st.lists(st.integers(), max_size=3),
                        st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
                        st.sampled_from(["NaN", "1e400", "-5", str(2**70), "\ud800x", "[/]"]))


@PROFILE
@given(edits=st.lists(st.tuples(st.integers(0, 13_055), st.sampled_from(["ts", "dur", "pid", "tid", "args", "cat",
                                                                         "ph", "name"]), json_values),
                      min_size=1, max_size=30),
       constants=st.booleans())
def test_damaged_pytorch_profiler_traces(edits, constants):
    import gzip

    doc = json.loads(gzip.decompress(TORCH.read_bytes()))
    events = doc["traceEvents"]
    for i, field, value in edits:
        e = events[i % len(events)]
        if isinstance(e, dict):
            e[field] = "@NAN@" if constants and field in ("ts", "dur") and value is None else value
    text = json.dumps(doc).replace('"@NAN@"', "NaN")
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "t.json"
        p.write_text(text)
        r = _run(["analyze", p, "--json"], p)
        if r.exit_code == 0:
            _sane(json.loads(r.stdout), p)
