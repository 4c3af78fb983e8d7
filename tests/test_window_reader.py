"""The window reader (ingest/nsys_windows.py): each window it reads from the file is, frame for
frame, analysis/windows.py's window_trace of the whole read, on real exports (serving runs in
graph and eager mode, a MoE model, vLLM's own hooks, two processes, CUDA graphs traced whole),
with small chunks so that a window spans many; and a window reads only part of the kernel table."""

from __future__ import annotations

import sqlite3

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from stepscope.analysis.windows import Window, window_trace
from stepscope.ingest.nsys_sqlite import read_nsys_sqlite
from stepscope.ingest.nsys_windows import WindowReader, _high, _low
from tests.conftest import FIXTURES, gunzipped, mutated, need

EXPORTS = {
    "serving_graph": "serving/llama-3.1-8b_serve_r48_s0_graph.sqlite.gz",
    "serving_eager": "serving/llama-3.1-8b_serve_r48_s0_eager.sqlite.gz",
    "decode_eager": "llama8b_decode_b1_eager.sqlite",
    "moe_graph": "models/qwen3-30b-a3b_r32_graph_plain.sqlite.gz",
    "vllm_hooks": "vllm_serve/llama-3.1-8b_serve_hooks.sqlite.gz",
    "tp2_graph": "llama8b_decode_b1_graph_tp2.sqlite",  # two processes, each its own correlation ids
    "graph_level": "models/llama-3.2-1b_r16_long_graph_plain.sqlite.gz",  # replays added to the kernels
}
EVENT_FRAMES = ("kernels", "memops", "api", "nvtx", "gpus", "processes", "threads")
SCALARS = ("path", "format", "nsys_version", "schema_version", "graph_level_launches",
           "profiler_overhead_count", "profiler_overhead_ns", "sidecar")


def export(name: str):
    path = need(FIXTURES / EXPORTS[name])
    return gunzipped(path) if path.name.endswith(".gz") else path


def cuts(trace, parts: int = 5) -> list[int]:
    """API start times that cut the calls into `parts` parts of equal count."""
    starts = trace.api["start"].sort()
    return [int(starts[len(starts) * i // parts]) for i in range(1, parts)]


def partition(trace) -> list[tuple[int | None, int | None]]:
    bounds = [None, *cuts(trace), None]
    return list(zip(bounds, bounds[1:]))


def assert_window(got, full, lo, hi) -> None:
    ref = window_trace(full, Window(0, lo, hi, lo, hi))  # the own span does not change the frames
    for f in EVENT_FRAMES:
        try:
            assert_frame_equal(getattr(got, f), getattr(ref, f), check_exact=True)
        except AssertionError as e:
            raise AssertionError(f"{f} of [{lo}, {hi}): {e}") from None
    for a in SCALARS:
        assert getattr(got, a) == getattr(ref, a), a
    assert got.warnings == ref.warnings == []
    # names: the reader holds those of the windows read so far: the whole read's (same values),
    # the window's among them
    assert got.strings.schema == ref.strings.schema
    assert got.strings.join(ref.strings, on=["id", "value"], how="anti").is_empty()
    ids = pl.concat([got.kernels["short_id"], got.kernels["demangled_id"], got.api["name_id"]]).unique()
    assert ids.is_in(got.strings["id"].implode()).all()


@pytest.fixture(scope="module", params=list(EXPORTS))
def pair(request):
    path = export(request.param)
    full = read_nsys_sqlite(path, launch_config=False)
    with WindowReader(path, chunk_rows=1000) as reader:
        yield full, reader


def test_each_window_is_window_trace_of_the_whole_read(pair):
    full, reader = pair
    c = cuts(full)
    windows = partition(full) + [(None, None), (c[0], c[2]), (None, c[1]), (c[3], None), (c[1], c[1] + 1)]
    apis = []
    for lo, hi in windows:
        got = reader.read(lo, hi)
        assert_window(got, full, lo, hi)
        apis.append(got.api)
    # a partition of the time axis holds every API call once, and every kernel at least once
    n = len(partition(full))
    assert_frame_equal(pl.concat(apis[:n]).sort(pl.all()), full.api.sort(pl.all()))
    assert sum(reader.read(lo, hi).kernels.height for lo, hi in partition(full)) >= full.kernels.height
    assert reader.warnings_so_far() == []


def test_base_is_the_whole_read_without_its_events(pair):
    full, reader = pair
    base = reader.base
    for f in ("nvtx", "gpus", "processes", "threads"):
        assert_frame_equal(getattr(base, f), getattr(full, f), check_exact=True)
    for f in ("kernels", "memops", "api"):
        assert getattr(base, f).is_empty() and getattr(base, f).schema == getattr(full, f).schema
    for a in SCALARS:
        assert getattr(base, a) == getattr(full, a), a
    # the names of the windows read so far; once a partition is read, the whole read's
    assert base.strings.join(full.strings, on=["id", "value"], how="anti").is_empty()
    for lo, hi in partition(full):
        reader.read(lo, hi)
    assert_frame_equal(reader.base.strings.sort("id"), full.strings.sort("id"), check_exact=True)
    assert base.warnings == full.warnings  # these exports are clean: only the graph-level note, if any
    assert reader.warnings() == full.warnings
    con = sqlite3.connect(f"file:{full.path}?mode=ro", uri=True)
    assert reader.n_kernels == con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    con.close()


def sql_bounds(con, table: str, corr: bool, a: int, b: int, where: str = "1", integers: bool = False) -> tuple:
    """The chunk map's row of rowids [a, b] (of the rows the reader reads: `where`) as SQLite's
    own aggregates make it; `integers`: the bounds of the integer values only (a map made from
    the spilled rows, where a value of another type is NULL)."""
    c = "correlationId" if corr else "NULL"
    s = "iif(typeof(start) = 'integer', start, NULL)" if integers else "start"
    c = f"iif(typeof({c}) = 'integer', {c}, NULL)" if integers else c
    smin, smax, cmin, cmax, n, bad = con.execute(
        f"SELECT min({s}), max({s}), min({c}), max({c}), count(*), total(typeof(start) != 'integer') "
        f"FROM {table} WHERE rowid >= ? AND rowid <= ? AND ({where})", (a, b)).fetchone()
    return _low(smin), _high(smax), _low(cmin), _high(cmax), n, int(bad)


def assert_maps_are_sqls(reader) -> None:
    """Each chunk of each map is what SQLite's min, max, count says of its rowid range (of its
    integer values where the map was made from the spilled rows), and the ranges hold every row
    of the table once."""
    integers = reader._spill is not None
    con = sqlite3.connect(f"file:{reader.path}?mode=ro", uri=True)
    tables = [reader._kernels, reader._api, reader._replays, *(t for _, t in reader._memops)]
    for t in (t for t in tables if t is not None):
        m = t.chunks
        assert (m["a"].shift(-1) > m["b"]).all() and (m["a"] <= m["b"]).all()  # disjoint, in rowid order
        where = " AND ".join(t.q.where) or "1"  # the runtime table: the calls an analysis reads
        assert m["n"].sum() == con.execute(f"SELECT count(*) FROM {t.q.table} WHERE {where}").fetchone()[0]
        for c, a, b, *got in m.iter_rows():
            assert tuple(got) == sql_bounds(con, t.q.table, t.corr, a, b, where, integers), (t.q.table, c)
    con.close()


def test_the_chunk_maps_are_sqlite_own_aggregates(pair):
    assert_maps_are_sqls(pair[1])


def test_a_window_reads_only_part_of_the_kernel_table():
    path = export("serving_eager")
    full = read_nsys_sqlite(path, launch_config=False)
    lo, end = cuts(full)[1:3]
    # the window ends just after a launch call: the kernel it launched starts after the window
    launches = (full.kernels.join(full.api, on=["pid", "corr"], suffix="_call")
                .filter(pl.col("start_call") >= lo, pl.col("start_call") < end).sort("start_call"))
    hi = int(launches["start_call"][launches.height // 2]) + 1
    with WindowReader(path, chunk_rows=4096) as reader:
        got = reader.read(lo, hi)
        read = reader.rows_read["CUPTI_ACTIVITY_KIND_KERNEL"]
        assert got.kernels.height <= read < reader.n_kernels / 4, (got.kernels.height, read, reader.n_kernels)
        scanned = reader.chunks_read["CUPTI_ACTIVITY_KIND_KERNEL"] * 4096
        assert scanned < reader.n_kernels / 3, (scanned, reader.n_kernels)
        assert (got.kernels["start"] >= hi).any()
        assert_window(got, full, lo, hi)


DAMAGE = [
    "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = 'x' WHERE rowid % 37 = 0",
    "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = start + 0.5 WHERE rowid % 41 = 0",
    "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET end = start - 1 WHERE rowid % 43 = 0",
    "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET shortName = 99999999 WHERE rowid % 47 = 0",
    "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET deviceId = 1 << 40 WHERE rowid % 53 = 0",
    "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET correlationId = 'c' WHERE rowid % 61 = 0",
    "UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET start = 'y' WHERE rowid % 31 = 0",
    "UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET end = start - 5 WHERE rowid % 29 = 0",
    "UPDATE CUPTI_ACTIVITY_KIND_MEMSET SET bytes = -1",
    # a text of 40 bytes before the correlation id (a column the model does not read): the
    # pages' pass adds the columns' sizes one by one there
    "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET contextId = printf('%.40c', 'z') WHERE rowid % 11 = 0",
]


def overlapping(full) -> list[tuple]:
    """Windows whose own spans partition the time axis, each read with context on both sides
    (the next own span's first calls, the previous one's last): (lo, hi, own_lo, own_hi)."""
    starts = full.api["start"].sort()
    bounds = [None, *cuts(full), None]
    out = []
    for own_lo, own_hi in zip(bounds, bounds[1:]):
        lo = None if own_lo is None else int(starts[max(starts.search_sorted(own_lo) - 50, 0)])
        hi = None if own_hi is None else int(starts[min(starts.search_sorted(own_hi) + 50, len(starts) - 1)])
        out.append((lo, hi, own_lo, own_hi))
    return out


@pytest.mark.parametrize("spill", [True, False], ids=["spilled", "sqlite"])
@pytest.mark.parametrize("damage", [DAMAGE, DAMAGE + [
    # a start of 200 characters: its serial type takes two bytes, the kernels' map is made in SQL
    "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = printf('%.200c', 'x') WHERE rowid % 97 = 0",
    # a row spilling to an overflow page: the columns read are on its own page
    "UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET callchainId = zeroblob(9000) WHERE rowid % 89 = 0",
    # names: bytes that are not UTF-8 (counted per name read), one longer than sanity.NAME_MAX
    "UPDATE StringIds SET value = CAST(x'c3' || value AS TEXT) WHERE id % 7 = 0",
    "UPDATE StringIds SET value = value || printf('%.20000c', 'y') "
    "WHERE id = (SELECT shortName FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE rowid = 5)",
]], ids=["damaged", "damaged_long_values"])
def test_a_damaged_export_same_frames_and_the_whole_reads_warnings(tmp_path, damage, spill):
    """Values typed.clean and sanity.checked leave out are left out of every window, and over a
    partition each is counted once: the whole read's warnings, word for word and in its order,
    also where the windows overlap (each counts the rows of its own span)."""
    path = mutated(tmp_path, *damage)
    full = read_nsys_sqlite(path, launch_config=False)
    assert len(full.warnings) >= 5
    if damage is not DAMAGE:
        assert any(w.startswith("StringIds:") for w in full.warnings)
        assert any("kernel or API call name(s) longer than" in w for w in full.warnings)
    with WindowReader(path, chunk_rows=64, spill=spill) as reader:
        assert (reader._spill is not None) == spill
        for lo, hi in partition(full):
            assert_window(reader.read(lo, hi), full, lo, hi)
        assert reader.warnings() == full.warnings
        assert sorted(reader.base.warnings + reader.warnings_so_far()) == sorted(full.warnings)
        assert_frame_equal(reader.base.strings.sort("id"), full.strings.sort("id"), check_exact=True)
        assert_maps_are_sqls(reader)
    with WindowReader(path, chunk_rows=64, spill=spill) as reader:
        windows = overlapping(full)
        assert all(lo is None or lo < own_lo for lo, _, own_lo, _ in windows[1:])
        for lo, hi, own_lo, own_hi in windows:
            assert_window(reader.read(lo, hi, own_lo, own_hi), full, lo, hi)
        assert reader.warnings() == full.warnings


def test_an_own_span_lies_within_the_window():
    with WindowReader(export("decode_eager")) as reader:
        for lo, hi, own_lo, own_hi in ((10, 20, 5, 20), (10, 20, 10, 25), (None, 20, 5, 21), (10, None, 9, None)):
            with pytest.raises(ValueError, match="not within"):
                reader.read(lo, hi, own_lo, own_hi)
        # None: the window's own bound
        assert reader.read(10, None, 12).api.height == reader.read(10, None).api.height


def test_a_wal_mode_export_reads_the_same_windows(tmp_path):
    """A WAL-mode export (its newest pages may be in the -wal file): SQLite reads it for the maps
    and the windows alike, the same frames and warnings as the whole read."""
    path = mutated(tmp_path, "PRAGMA journal_mode = WAL", *DAMAGE[:3])  # first: not inside a transaction
    assert open(path, "rb").read(20)[18:20] == b"\x02\x02"
    full = read_nsys_sqlite(path, launch_config=False)
    with WindowReader(path, chunk_rows=500) as reader:
        for lo, hi in partition(full):
            assert_window(reader.read(lo, hi), full, lo, hi)
        assert reader.warnings() == full.warnings

def test_a_copy_reads_on(tmp_path):
    """A pickled copy (what a dask worker gets: by_windows.py) reads windows and counts on as
    the reader would, without opening the export again."""
    import pickle

    path = mutated(tmp_path, *DAMAGE)
    full = read_nsys_sqlite(path, launch_config=False)
    (lo0, hi0), *rest = partition(full)
    with WindowReader(path, chunk_rows=64) as reader:
        reader.read(lo0, hi0)
        copy = pickle.loads(pickle.dumps(reader))
    try:
        for lo, hi in rest:
            assert_window(copy.read(lo, hi), full, lo, hi)
        assert copy.warnings() == full.warnings
    finally:
        copy.close()


def test_the_spill_is_the_exports_rows_on_disk_while_the_reader_is_open(tmp_path):
    """The rows read at open are spilled beside the export (its cache folder), one file a chunk,
    and the folder is gone once the reader closes; a pickled copy (a dask worker's) reads from
    the export by the same map."""
    import pickle

    path = mutated(tmp_path)  # a copy in a folder of its own: the spill goes beside it
    full = read_nsys_sqlite(path, launch_config=False)
    from stepscope.ingest import cache

    with WindowReader(path, chunk_rows=100) as reader:
        folder = reader._spill.folder
        assert folder.parent == path.parent / ".stepscope-cache" and folder.name.startswith(".tmp-")
        # the cache's prune takes it for a write in progress: no entry, left alone while fresh
        assert cache.prune(folder.parent) == [] and folder.is_dir()
        tables = [reader._kernels, reader._api, reader._replays, *(t for _, t in reader._memops)]
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        chunks = sum(con.execute(f"SELECT count(DISTINCT rowid / 100) FROM {t.q.table} WHERE "
                                 f"{' AND '.join(t.q.where) or '1'}").fetchone()[0] for t in tables if t is not None)
        con.close()
        assert len(list(folder.iterdir())) == chunks > 10
        copy = pickle.loads(pickle.dumps(reader))
    assert not folder.exists() and copy._spill is None
    try:
        for lo, hi in partition(full):
            assert_window(copy.read(lo, hi), full, lo, hi)
    finally:
        copy.close()


def test_without_a_spill_the_windows_read_sqlite(tmp_path, monkeypatch):
    """No folder can be made (none writable), or a write fails (a full disk): the map is SQLite's
    own aggregates, and the windows are read from the export, the same frames."""
    from stepscope.ingest import spill

    path = mutated(tmp_path)
    full = read_nsys_sqlite(path, launch_config=False)

    def full_disk(*a, **k):
        raise OSError(28, "No space left on device")

    for patch in (("stepscope.ingest.cache._roots", lambda p: [tmp_path / "file" / "x"]),
                  ("stepscope.ingest.spill.Spill.put", full_disk)):
        (tmp_path / "file").write_text("")  # a file where the folder would be: no folder under it
        with monkeypatch.context() as m:
            m.setattr(*patch)
            with WindowReader(path, chunk_rows=1000) as reader:
                assert reader._spill is None
                assert_maps_are_sqls(reader)
                for lo, hi in partition(full):
                    assert_window(reader.read(lo, hi), full, lo, hi)
        assert not [p for p in (path.parent / ".stepscope-cache").glob(".tmp-spill-*")]
    with monkeypatch.context() as m:  # the benchmarks' setting: the export read as without a folder
        m.setenv("STEPSCOPE_SPILL", "0")
        with WindowReader(path, chunk_rows=1000) as reader:
            assert reader._spill is None and not reader.spill
            assert_maps_are_sqls(reader)
    made = spill.Spill.beside(path)
    assert made.folder.is_dir()
    made.close()
    assert not made.folder.exists()


def test_the_spill_goes_where_the_cache_may_write(tmp_path, monkeypatch):
    """A symlinked `.stepscope-cache` beside the export is never written (as the cache's rule):
    the spill goes to $STEPSCOPE_CACHE_DIR; a killed run's spill is removed by the cache's prune
    once an hour old."""
    import os
    import time

    from stepscope.ingest import cache
    from stepscope.ingest.spill import Spill

    path = mutated(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (path.parent / ".stepscope-cache").symlink_to(elsewhere)
    monkeypatch.setenv("STEPSCOPE_CACHE_DIR", str(tmp_path / "home"))
    s = Spill.beside(path)
    assert s.folder.parent == tmp_path / "home" and not list(elsewhere.iterdir())
    s.put("T", 0, pl.DataFrame({"start": [1, 2]}), False)
    assert cache.prune(s.folder.parent) == []  # fresh: a write in progress
    assert cache.prune(s.folder.parent, now=time.time() + 2 * 3600) == [s.folder]  # a killed run's
    assert not s.folder.exists()
    s.close()
    os.chmod(tmp_path / "home", 0o777)  # writable by others: not trusted either, nowhere left
    assert Spill.beside(path) is None
