"""An nsys SQLite export read by windows of host time, so that memory grows with a window, not
with the run (a 10-minute serving run holds ~25M kernels).

`WindowReader(path).read(lo, hi)` is, frame for frame, what analysis/windows.py's `window_trace`
makes of the whole read (`read_nsys_sqlite(path, launch_config=False)`) for a window whose events
are read for host time [lo, hi): the API calls that start in it, the kernels and memops they
launched or that start in it launched by none of them, the NVTX ranges overlapping it: the same
selection (model.window_events) over the rows read; tests/test_window_reader.py holds the two
equal on real exports.

nsys's event tables have no index on `start`, but their rows come roughly in time order. At open
a *chunk map* is made of each event table: for each run of about `chunk_rows` rows (a rowid
range), bounds on their start and correlation ids, and how many starts are not integers. A window
reads only the chunks whose start range meets [lo, hi) or whose correlation ids meet those of the
window's API calls (a kernel launched in the window may start after hi, even before lo), and of
those chunks only the rows that start in [lo, hi) or carry such an id (for the same process).
Everything else the trace holds (NVTX, GPUs, processes, threads) is read once, into `base`; the
names (StringIds) of the kernels and calls read are decoded as windows read them.

The map is made by SQLite itself (_sql_map: one aggregate query per chunk, a rowid range SQLite
seeks, on a few threads), as every table of an export is read here: a pass of our own over the
file's B-tree pages took about half the CPU, and was left out (docs/PERFORMANCE.md, "A long run in
bounded memory"). A bound is never tighter than the values: a chunk read for nothing costs time,
a chunk left out would change the window.

The values are checked as the whole read checks them: typed.clean on every read and the row
checks of sanity.checked on the event frames. What they leave out is counted so that over
windows whose *own* spans partition the time axis each row counts once, as in the whole read: a
row counts in the window whose own span [own_lo, own_hi) holds its start (one whose start is not
an integer, which is always left out, in the window whose own span starts unbounded). `warnings()`
then says what the whole read says, in its order.
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import polars as pl

import stepscope.ingest.graph_replays as graph_replays
import stepscope.ingest.sanity as sanity
import stepscope.ingest.typed as typed
from stepscope.errors import InputError
from stepscope.ingest.nsys_sqlite import (
    KERNEL_TABLE, PROCESS_COLUMNS, RUNTIME_TABLE, THREAD_COLUMNS, _Schema, _StringIds,
    _attach_adbc, _bulk_raw, _count, _frame, _has_graphs, _is_db_error, _lacks, _merged, _metadata, _need,
    _read_gpus, _read_nvtx, _unpack_pid, _unpack_tid, connect_readonly, db_error, graph_level_and_overhead, is_sqlite,
    memop_query, read_names, read_threads,
)
from stepscope.ingest.typed import INT32 as I32, Col as C
from stepscope.model import API_SCHEMA, KERNEL_SCHEMA, MEMOP_SCHEMA, STRING_SCHEMA, Trace, empty
from stepscope.model import in_span as _in, window_events
from stepscope.paths import input_file

CHUNK_ROWS = 65_536
# the kernel columns of read_nsys_sqlite(path, launch_config=False)
KERNEL_COLUMNS = [c for c in KERNEL_SCHEMA if not c.startswith(("grid_", "block_"))]
_INT64 = (-(1 << 63), (1 << 63) - 1)
# a chunk map: chunk c holds the rows of rowids [a, b]; smin/smax bound their integer starts
# (smin None: no numeric start), cmin/cmax their correlation ids; n rows, bad of them with a
# start that is not an integer
CHUNK_SCHEMA = {"c": pl.Int64, "a": pl.Int64, "b": pl.Int64, "smin": pl.Int64, "smax": pl.Int64,
                "cmin": pl.Int64, "cmax": pl.Int64, "n": pl.Int64, "bad": pl.Int64}


def _pid_sql(col: str) -> str:
    """The OS pid of a globalPid/globalTid in SQL: the same bits as _unpack_pid (SQLite's >> is
    arithmetic, so even a negative value unpacks as polars' floor division does)."""
    return f"(({col} >> 24) & 16777215)"


def _low(v):
    """A lower bound on the integers among values whose SQLite min() is `v`: None where `v` is
    not a number (SQLite orders NULL < numbers < text < blob, and min skips NULL: the values hold
    no number); a REAL is rounded down."""
    return v if type(v) is int else _int64(v, math.floor) if type(v) is float else None


def _high(v):
    """An upper bound on the integers among values whose SQLite max() is `v`: None where all are
    NULL, unbounded where the greatest is text or a blob; a REAL is rounded up."""
    return v if type(v) is int else _int64(v, math.ceil) if type(v) is float else None if v is None else _INT64[1]


def _int64(v: float, rounded) -> int:
    """A REAL as an int64 bound (±inf to the ends)."""
    return max(_INT64[0], min(_INT64[1], rounded(v))) if math.isfinite(v) else _INT64[v > 0]


def _own(lo: int | None, hi: int | None) -> pl.Expr:
    """The rows a window counts in its warnings: those that start in its own span; a start that
    is not an integer (read as NULL, and always left out) counts in the window whose own span
    starts unbounded."""
    start = pl.col("start")
    own = start.is_not_null() & _in("start", lo, hi)
    return own | start.is_null() if lo is None else own


def _selected(t: "_Table", lo: int | None, hi: int | None, corr: pl.DataFrame | None) -> pl.Expr:
    """WindowReader._rows' SQL condition in polars, over a chunk's raw frame (its integer
    values; a value that is not an integer is NULL there, and its row left out by typed.clean
    whichever window reads it): the rows that start in [lo, hi) (and with lo None those whose
    start is not an integer), or carry, for their process, a correlation id in `corr`'s range.
    NULL compares as SQL's does (a filter drops it)."""
    start = pl.col("start")
    cond = pl.lit(True)
    if lo is not None:
        cond = cond & (start >= lo)
    if hi is not None:
        cond = cond & (start < hi)
    if lo is None:
        cond = cond | start.is_null()
    if t.corr and corr is not None and corr.height:
        pid = (pl.col("pid") // (1 << 24)) % (1 << 24)  # _pid_sql's bits
        for p, a, b in corr.select(pl.col("pid").cast(pl.Int64), "kmin", "kmax").iter_rows():
            cond = cond | ((pid == p) & (pl.col("corr") >= a) & (pl.col("corr") <= b))
    return cond


def _chunk_query(q: typed.Query, a: int, b: int, *where: str) -> typed.Query:
    """A table's query `q` over the rows of rowids [a, b] (a range SQLite seeks), and `where`."""
    return replace(q, where=q.where + [f"rowid >= {a} AND rowid <= {b}", *where], from_=q.table)


# ---------------------------------------------------------------------------------- the reader
@dataclass
class _Table:
    """One event table: its query (the model's columns and the whole read's own filter), the SQL
    of its rows' OS pid, whether it has correlation ids to find rows by, and its chunk map
    (CHUNK_SCHEMA)."""

    q: typed.Query
    pid: str
    corr: bool
    chunks: pl.DataFrame


@dataclass
class _Tally:
    """What sanity's checks left out of one frame, summed over windows (sanity._leave_out's
    warning, counted on the rows each window owns)."""

    what: str
    rows: int = 0
    left_out: int = 0
    why: Counter = field(default_factory=Counter)

    def warning(self) -> str | None:
        if not self.left_out:
            return None
        reasons = ", ".join(f"{n:,} {why}" for why, n in self.why.items() if n)
        return f"{self.left_out:,} of {self.rows:,} {self.what} left out ({reasons})"


@contextlib.contextmanager
def _input_errors(path: Path):
    """SQLite's errors as read_nsys_sqlite reports them (InputError, one line)."""
    try:
        yield
    except Exception as e:
        if not _is_db_error(e):
            raise
        raise db_error(path, e) from None


class WindowReader:
    """An export read window by window (module docstring).

    `base` is read_nsys_sqlite(path, launch_config=False) with empty kernels, memops and api
    frames (their schemas kept) and everything else as that read makes it, but for two things:
    `strings` holds the names of the kernels and API calls of the windows read so far (each read
    adds the names of its own; the whole read's names once a partition has been read), and
    `warnings` holds only what is not about the event tables and their names (those are
    warnings_so_far()'s).

    `rows_read[table]`: how many rows SQLite returned for each event table, and
    `chunks_read[table]`: how many of its chunks it scanned for them, over all reads so far.
    """

    def __init__(self, path: str | Path, chunk_rows: int = CHUNK_ROWS, spill: bool = True):
        path = input_file(path, "an nsys SQLite export")
        if not is_sqlite(path):
            raise InputError(f"{path} is not a SQLite file; export the report first: "
                             "nsys export --type sqlite report.nsys-rep")
        self.path, self.chunk_rows = path, int(chunk_rows)
        # `spill`: the event rows read once at open and kept on disk for the windows (ingest/spill.py);
        # STEPSCOPE_SPILL=0, the benchmarks' setting, reads them from the export instead
        self.spill = spill and os.environ.get("STEPSCOPE_SPILL", "").strip() != "0"
        self._spill = None
        self.rows_read: Counter = Counter()
        self.chunks_read: Counter = Counter()
        # the accounts of what the reads left out, in the order of the whole read's warnings:
        # typed.clean's per table (filled in at open), then sanity.checked's per check stage
        # (it warns once for the kernels' times and once for their names)
        self._readings: dict[str, typed.Reading] = {}
        self._tallies = {"kernel times": _Tally("kernels"), "kernel names": _Tally("kernels"),
                         "memops": _Tally("memcpy/memset rows"), "api": _Tally("API calls")}
        self._seen = pl.Series("id", [], pl.Int32)  # the name ids of the rows read (decoded)
        self.kernel_rowids: tuple[int, int] | None = None  # the rowids of the last window's kernel chunks
        self._con = None
        with _input_errors(path):
            self._con = connect_readonly(path)
            try:
                _Schema(self._con)  # fails fast, with sqlite3's message, on a corrupt file
                _attach_adbc(self._con, path)
                self._open()
            except BaseException:
                self.close()
                raise

    # ------------------------------------------------------------------ open: chunk maps, base
    def _open(self) -> None:
        con, path = self._con, self.path
        schema = _Schema(con)
        meta = _metadata(con, schema)
        if not schema.has(KERNEL_TABLE):
            if _count(con, schema, graph_replays.TABLE):
                raise InputError(f"{path} has no per-kernel rows: its CUDA-graph launches were traced as whole "
                                 "graphs; capture again with nsys profile --cuda-graph-trace=node")
            raise InputError(f"{path} has no kernel table ({KERNEL_TABLE}): it was captured without CUDA "
                             "tracing; capture again with nsys profile --trace=cuda,nvtx")
        if not schema.has("StringIds"):
            raise InputError(f"{path} has no StringIds table: its kernel names cannot be read (damaged, or "
                             "written by another tool); export it again with nsys export --type sqlite")
        k = KERNEL_TABLE
        string_ids = _StringIds(con, schema, path)
        _need(path, schema, k, "globalPid", "deviceId", "streamId", "correlationId", "start", "end",
              "shortName", "demangledName")
        # the whole read's kernel columns with launch_config=False (nsys_sqlite._read)
        self._graphs = _has_graphs(con, schema, string_ids)
        cols = [C("pid", "globalPid"), C("device", "deviceId", I32), C("stream", "streamId", I32),
                C("corr", "correlationId", required=False), C("start", "start"), C("end", "end"),
                C("short_id", "shortName", I32), C("demangled_id", "demangledName", I32)]
        if self._graphs:
            cols.append(C("graph_node_id", "graphNodeId", required=False))
        queries = [(typed.Query(k, cols), "globalPid", True)]

        self._api: _Table | None = None
        if schema.has(RUNTIME_TABLE):
            rt = schema.cols(RUNTIME_TABLE)
            name_col = "nameId" if "nameId" in rt else "name"
            _need(path, schema, RUNTIME_TABLE, "globalTid", "correlationId", "start", "end", name_col)
            # the whole read's filter: runtime and driver calls, only the names an analysis keeps
            where = ["eventClass IN (0, 1)"] if "eventClass" in rt else []
            if name_col == "nameId" and string_ids.readable():
                where.append(f"nameId IN ({','.join(str(int(i)) for i in string_ids.api_ids()) or 'NULL'})")
            # an API call is found by its start only: no correlation ids in its map
            queries.append((typed.Query(RUNTIME_TABLE, [
                C("pid", "globalTid"), C("corr", "correlationId", required=False), C("start", "start"),
                C("end", "end"), C("name_id", name_col, I32)], where), "globalTid", False))
        has_replays = bool(_count(con, schema, graph_replays.TABLE))
        if has_replays:
            queries.append((graph_replays.QUERY, "globalPid", True))
        memops = []
        for table, kind in (("CUPTI_ACTIVITY_KIND_MEMCPY", "memcpy"), ("CUPTI_ACTIVITY_KIND_MEMSET", "memset")):
            if schema.has(table):
                _need(path, schema, table, "globalPid", "deviceId", "streamId", "correlationId", "start", "end")
                memops.append(kind)
                queries.append((memop_query(table, kind, schema.col_or_null), "globalPid", True))
        # the rest of the trace read meanwhile, on a connection of its own (SQLite and ADBC let
        # go of the GIL while they read, numpy while it parses)
        with ThreadPoolExecutor(1) as pool:
            rest = pool.submit(self._read_rest, string_ids.raw)
            try:
                maps = self._tables(schema, queries)
            finally:
                rest = rest.result()
        self._kernels = maps[k]
        self.n_kernels = int(self._kernels.chunks["n"].sum())
        if not self.n_kernels:
            raise InputError(f"{path}: no kernels recorded — was `--trace=cuda` on? capture again with "
                             "nsys profile --trace=cuda,nvtx")
        self._api = maps.get(RUNTIME_TABLE)
        # CUDA graphs traced whole: the whole read adds their replays to the kernels and then
        # sorts the kernels by start, but only when a replay row survives typed.clean
        self._replays = maps.get(graph_replays.TABLE)
        self._sort_kernels = self._replays is not None and self._any_clean(self._replays)
        self._memops = [(kind, maps[f"CUPTI_ACTIVITY_KIND_{kind.upper()}"]) for kind in memops]
        tables = [self._kernels, self._replays, self._api, *(t for _, t in self._memops)]
        self._readings = {t.q.table: typed.Reading(t.q.table) for t in tables if t is not None}

        nvtx, gpus, processes, threads, graph_level, overhead_n, overhead_ns, direct = rest
        self._direct = direct
        # sanity.checked's part on the frames base holds
        self._nvtx_left_out: list[str] = []
        nvtx = sanity._leave_out(nvtx, "NVTX ranges", sanity._times(nvtx, False), self._nvtx_left_out)
        nvtx, n_nvtx = sanity.capped(nvtx, "name")
        self._nvtx_capped = [self._shortened(n_nvtx, "NVTX range name(s)")] if n_nvtx else []
        # the names are decoded as windows read them; the StringIds read whole for the API
        # names' filter is let go
        string_ids.raw = None
        self._string_ids = string_ids
        strings = empty(STRING_SCHEMA)
        if self._sort_kernels:
            strings = graph_replays.with_replay_name(strings, pl.DataFrame({"short_id": [graph_replays.REPLAY_ID]}))
        warnings = self._direct + [w for w in (r.warning() for r in _merged(self._nvtx_readings + self._rest_readings))
                                   if w] + self._nvtx_left_out + self._nvtx_capped
        self.base = Trace(
            path=path, format="nsys-sqlite", kernels=empty({c: KERNEL_SCHEMA[c] for c in KERNEL_COLUMNS}),
            memops=empty(MEMOP_SCHEMA), api=empty(API_SCHEMA), nvtx=nvtx, strings=strings, gpus=gpus,
            processes=processes, threads=threads, nsys_version=meta.get("EXPORT_PRODUCT_VERSION"),
            schema_version=meta.get("EXPORT_SCHEMA_VERSION"), graph_level_launches=int(graph_level),
            profiler_overhead_count=int(overhead_n), profiler_overhead_ns=int(overhead_ns), warnings=warnings)

    def _read_rest(self, strings_raw) -> tuple:
        """What the trace holds besides its events, as the whole read makes it (NVTX ranges,
        GPUs, processes, threads, graph-level launches, profiler overhead), on a connection of
        its own; its warnings in the whole read's order: each reader's own (`direct`), the
        readings of typed.clean (the event tables' and the names' go between NVTX_EVENTS and the
        GPUs: warnings()); sanity.checked's follow in _open. `strings_raw`: StringIds as read
        whole for the API names' filter, where it was."""
        path = self.path
        with _input_errors(path):
            con = connect_readonly(path)
            try:
                _attach_adbc(con, path)
                schema = _Schema(con)
                string_ids = _StringIds(con, schema, path)
                string_ids.raw = strings_raw
                direct: list[str] = []
                self._nvtx_readings: list[typed.Reading] = []
                nvtx = _read_nvtx(con, schema, path, self._nvtx_readings, direct, string_ids)
                self._rest_readings: list[typed.Reading] = []
                gpus = _read_gpus(con, schema, self._rest_readings, direct)
                processes, threads = read_names(
                    schema.has, lambda *a: _lacks(schema, *a),
                    lambda: _frame(con, typed.Query("PROCESSES", PROCESS_COLUMNS)),
                    lambda: _frame(con, typed.Query("ThreadNames", THREAD_COLUMNS,
                                                    from_="ThreadNames t JOIN StringIds s ON s.id = t.nameId")),
                    direct, self._rest_readings)
                graph_level, overhead_n, overhead_ns = graph_level_and_overhead(con, schema, direct)
            finally:
                con.close()
        return nvtx, gpus, processes, threads, graph_level, overhead_n, overhead_ns, direct

    @staticmethod
    def _shortened(n: int, what: str) -> str:
        return (f"{n:,} {what} longer than {sanity.NAME_MAX:,} characters shortened to the first "
                f"{sanity.NAME_MAX:,} (classified and shown so)")

    def _tables(self, schema: _Schema, queries: list[tuple[typed.Query, str, bool]]) -> dict[str, _Table]:
        """Each event table's chunk map: made from its rows as they are spilled (_spilled_map),
        or where no spill can be made, by SQLite's aggregates (_sql_map)."""
        if self.spill:
            from stepscope.ingest.spill import Spill

            self._spill = Spill.beside(self.path)
        if self._spill is not None:
            try:
                return {q.table: _Table(q, pid, corr, self._spilled_map(q, corr)) for q, pid, corr in queries}
            except OSError:  # a full disk: SQLite's own map, and windows read from it
                self._spill.close()
                self._spill = None
        return {q.table: _Table(q, pid, corr, self._sql_map(q, corr)) for q, pid, corr in queries}

    def _spilled_map(self, q: typed.Query, corr: bool) -> pl.DataFrame:
        """The table's chunk map made from its rows, each chunk read whole (as a window's read
        would read it, _bulk_raw's frames before typed.clean) and spilled. The bounds are those
        of the rows' integer values, as _sql_map makes them: a start or id that is not an
        integer is read as NULL (typed), and such a row is left out of every window (counted by
        the first, which reads the chunks where `bad`)."""
        def row(con, c: int, a: int, b: int):
            (raw, is_typed), = _bulk_raw(con, [_chunk_query(q, a, b)])
            if not raw.height:
                return None
            start = raw["start"]
            cm = (raw["corr"].min(), raw["corr"].max()) if corr else (None, None)
            self._spill.put(q.table, a, raw, is_typed)
            return c, a, b, start.min(), start.max(), *cm, raw.height, start.null_count()

        return self._map(q.table, row)

    def _sql_map(self, q: typed.Query, corr: bool) -> pl.DataFrame:
        """The table's chunk map in SQL: one aggregate query per chunk. min and max are taken of
        the raw values and made integer bounds here (_low, _high)."""
        t, where = q.table, " AND ".join(q.where) or "1"
        c = "correlationId" if corr else "NULL"
        sql = (f"SELECT min(start), max(start), min({c}), max({c}), count(*), total(typeof(start) != 'integer') "
               f"FROM {t} WHERE rowid >= ? AND rowid <= ? AND ({where})")

        def row(con, c: int, a: int, b: int):
            smin, smax, cmin, cmax, n, bad = con.execute(sql, (a, b)).fetchone()
            return (c, a, b, _low(smin), _high(smax), _low(cmin), _high(cmax), n, int(bad)) if n else None

        return self._map(t, row)

    def _map(self, table: str, row) -> pl.DataFrame:
        """A chunk map (CHUNK_SCHEMA) of `table`: `row(con, c, a, b)` of each chunk c of
        chunk_rows rowids [a, b] (a rowid range: SQLite seeks it; None: no row), on read_threads()
        threads with a connection each (ADBC attached)."""
        def part(cs: list[int]) -> list:
            rows = []
            con = connect_readonly(self.path)
            try:
                _attach_adbc(con, self.path)
                for c in cs:
                    r = row(con, c, *self._rowids(c))
                    if r is not None:
                        rows.append(r)
            finally:
                con.close()
            return rows

        cs = self._chunk_ids(table)
        threads = read_threads()
        with ThreadPoolExecutor(threads) as pool:  # every threads-th chunk a thread: the same share of each
            rows = [r for got in pool.map(part, [cs[i::threads] for i in range(threads)]) for r in got]
        return pl.DataFrame(rows, schema=CHUNK_SCHEMA, orient="row").sort("c") if rows else empty(CHUNK_SCHEMA)

    def _chunk_ids(self, table: str) -> list[int]:
        """The chunks of chunk_rows rowids that hold a row: each found by a seek to the least
        rowid past the one before (a damaged export's rowids may leave long gaps, or be negative)."""
        out = []
        nxt = self._con.execute(f"SELECT min(rowid) FROM {table}").fetchone()[0]
        while nxt is not None:
            c = nxt // self.chunk_rows  # floor, also below 0
            out.append(c)
            b = self._rowids(c)[1]
            if b >= _INT64[1]:
                break
            nxt = self._con.execute(f"SELECT min(rowid) FROM {table} WHERE rowid > ?", (b,)).fetchone()[0]
        return out

    def _rowids(self, c: int) -> tuple[int, int]:
        n = self.chunk_rows
        return max(c * n, _INT64[0]), min(c * n + n - 1, _INT64[1])

    def _any_clean(self, t: _Table) -> bool:
        """Whether a row of `t` survives typed.clean (read chunk by chunk until one does)."""
        for a, b in t.chunks.select("a", "b").iter_rows():
            q = _chunk_query(t.q, a, b)
            (raw, is_typed), = self._raw(t, [(a, b)], [q])
            if typed.clean(raw, q, is_typed)[0].height:
                return True
        return False

    def _raw(self, t: _Table, chunks: list[tuple[int, int]], queries: list[typed.Query], keep: pl.Expr | None = None):
        """The raw frames (_bulk_raw's) of `queries`, one per chunk of `chunks` (rowids [a, b]):
        from the spill where there is one, the rows `keep` takes (the queries' own condition in
        polars), else from SQLite."""
        if self._spill is None:
            yield from _bulk_raw(self._con, queries)
            return
        for a, _ in chunks:
            raw, is_typed = self._spill.get(t.q.table, a)
            yield (raw if keep is None else raw.filter(keep)), is_typed

    # ------------------------------------------------------------------ one window
    def read(self, lo: int | None, hi: int | None, own_lo: int | None = None, own_hi: int | None = None,
             count: bool = True) -> Trace:
        """The window [lo, hi) of host time (None: unbounded): window_trace(full_trace,
        Window(0, own_lo, own_hi, lo, hi)) frame for frame, but for `strings` (the names read so
        far: a superset of the window's). [own_lo, own_hi) (by default [lo, hi), and within it)
        is the window's own span: the rows that start in it are those its reading counts in
        warnings() (each once, over windows whose own spans partition the time axis)."""
        lo, hi = (None if v is None else int(v) for v in (lo, hi))  # the bounds go into SQL as literals
        own_lo = lo if own_lo is None else int(own_lo)
        own_hi = hi if own_hi is None else int(own_hi)
        if (lo is not None and own_lo < lo) or (hi is not None and (own_hi is None or own_hi > hi)):
            raise ValueError(f"the own span [{own_lo}, {own_hi}) is not within the window [{lo}, {hi})")
        # `count` False: a window read again (wider): its rows were counted by its first read
        own = (own_lo, own_hi) if count else (0, 0)
        with _input_errors(self.path):
            raw = self._rows(self._api, lo, hi, own) if self._api is not None else None
            api, api_names = self._calls(raw, own)
            # the correlation ids that the window's calls hold, per process: the rows they launched
            corr = (api.filter(pl.col("corr").is_not_null()).group_by("pid")
                    .agg(pl.col("corr").min().alias("kmin"), pl.col("corr").max().alias("kmax")).sort("pid"))
            kernels = self._read_kernels(lo, hi, own, corr, api_names)
            memops = self._read_memops(lo, hi, own, corr)

        # window_trace's selection (analysis/windows.py)
        return replace(self.base, **window_events(api, kernels, memops, self.base.nvtx, lo, hi),
                       warnings=[], cache_entry=None, cache_dir=None, reread=None)

    def _read_kernels(self, lo, hi, own, corr: pl.DataFrame | None, api_names: pl.Series,
                      where: str | None = None) -> pl.DataFrame:
        kernels = self._rows(self._kernels, lo, hi, own, corr, where).with_columns(_unpack_pid("pid"))
        if not self._graphs:
            kernels = kernels.with_columns(pl.lit(None, pl.Int64).alias("graph_node_id"))
        kernels = kernels.select(KERNEL_COLUMNS)
        if self._replays is not None and where is None:
            replays = self._rows(self._replays, lo, hi, own, corr).with_columns(_unpack_pid("pid"))
            kernels = graph_replays.with_replays(kernels, replays)
            if self._sort_kernels and replays.is_empty():  # the whole read's kernels are in start order
                kernels = kernels.sort("start", maintain_order=True)
        # the names the whole read decodes: its kernels' and calls' before sanity's checks
        self._learn_names(kernels["short_id"], kernels["demangled_id"], api_names)
        kernels = self._checked(kernels, "kernel times", sanity._times(kernels, True), own)
        ids = self.base.strings["id"].implode()
        return self._checked(kernels, "kernel names", {
            "with a shortName id not in StringIds": ~pl.col("short_id").is_in(ids),
            "with a demangledName id not in StringIds": ~pl.col("demangled_id").is_in(ids),
        }, own)

    def read_marks(self, glob: str, accept, copy_kind: int) -> Trace:
        """Of the trace's events only the kernels whose short name SQL's GLOB `glob` and then
        `accept(name)` take, and the copies of `copy_kind` (no API call: scan_calls): a light read
        of a whole run (what by_windows.py finds the engine loop's steps from), the rows checked
        as a window's are and counted in no account (the windows count every row). `strings`
        then holds those kernels' names."""
        none = (0, 0)  # no row counted
        with _input_errors(self.path):
            ids = pl.Series("id", [i for i, in self._con.execute(
                "SELECT id FROM StringIds WHERE typeof(id) = 'integer' AND value GLOB ?", (glob,))], pl.Int32)
            self._learn_names(ids)
            names = self.base.strings.filter(pl.col("id").is_in(ids.implode()))
            ids = [i for i, v in zip(names["id"].to_list(), names["value"].to_list()) if accept(v or "")]
            kernels = self._read_kernels(None, None, none, None, pl.Series("id", [], pl.Int32),
                                         f"shortName IN ({','.join(str(int(i)) for i in ids) or 'NULL'})")
            copy_kind_col = _Schema(self._con).col_or_null
            memops = self._read_memops(None, None, none, None, {
                kind: f"{copy_kind_col(t.q.table, 'copyKind')} = {int(copy_kind)}" if kind == "memcpy" else "0"
                for kind, t in self._memops})
        return replace(self.base, api=empty(API_SCHEMA), kernels=kernels, memops=memops, warnings=[],
                       cache_entry=None, cache_dir=None, reread=None)

    def scan_calls(self, keep) -> pl.DataFrame:
        """The trace's API calls, checked as a window's are (counted in no account), read a chunk
        of rows at a time: of each chunk the rows `keep(calls)` (a boolean Series) takes, in
        rowid order, with `_pos` (their place among all the calls read). What a light read holds
        of a long run's calls is then what it keeps, not the run's. `strings` learns the names
        of every call read (keep may decode them)."""
        if self._api is None:
            return empty(API_SCHEMA).with_columns(pl.lit(None, pl.Int64).alias("_pos"))
        parts, n = [], 0
        with _input_errors(self.path):
            for raw in self._chunk_frames(self._api):
                df, names = self._calls(raw, (0, 0))
                self._learn_names(names)
                df = df.with_columns(pl.int_range(n, n + df.height, dtype=pl.Int64).alias("_pos"))
                n += df.height
                parts.append(df.filter(keep(df)))
        return pl.concat(parts) if parts else empty(API_SCHEMA).with_columns(pl.lit(None, pl.Int64).alias("_pos"))

    def _calls(self, raw: pl.DataFrame | None, own) -> tuple[pl.DataFrame, pl.Series]:
        """API calls as _rows reads them (their process and thread packed in one id; None: the
        export has no call table), checked as the whole read checks them (what is left out
        counted on the own span `own`), and the name ids of every call read: the whole read
        decodes those before the checks."""
        api = pl.DataFrame(schema=API_SCHEMA) if raw is None else raw.select(
            _unpack_pid("pid"), _unpack_tid("pid"), pl.exclude("pid"))
        return self._checked(api, "api", sanity._times(api, True), own), api["name_id"]

    # the chunks a task of _chunk_frames reads on one connection of its own
    _TASK_CHUNKS = 8

    def _chunk_frames(self, t: _Table):
        """Each chunk's rows of `t` as typed.clean leaves them, in rowid order (a generator): read
        on read_threads() threads, a connection each per run of _TASK_CHUNKS chunks, at most two
        runs a thread ahead of the caller (SQLite lets go of the GIL as it reads)."""
        from collections import deque
        from itertools import islice

        chunks = t.chunks.select("a", "b").rows()
        queries = [_chunk_query(t.q, a, b) for a, b in chunks]
        if self._spill is not None:  # at file speed: no thread of its own
            for q, (raw, is_typed) in zip(queries, self._raw(t, chunks, queries)):
                yield typed.clean(raw, q, is_typed)[0]
            return
        runs = iter([queries[i:i + self._TASK_CHUNKS] for i in range(0, len(queries), self._TASK_CHUNKS)])

        def read(run):
            con = connect_readonly(self.path)
            try:
                _attach_adbc(con, self.path)
                return [typed.clean(raw, q, is_typed)[0] for q, (raw, is_typed) in zip(run, _bulk_raw(con, run))]
            finally:
                con.close()

        threads = read_threads()
        with ThreadPoolExecutor(threads, thread_name_prefix="stepscope-scan") as pool:
            ahead = deque(pool.submit(read, run) for run in islice(runs, 2 * threads))
            try:
                while ahead:
                    frames = ahead.popleft().result()
                    run = next(runs, None)
                    if run is not None:
                        ahead.append(pool.submit(read, run))
                    yield from frames
            finally:
                for f in ahead:
                    f.cancel()

    def _learn_names(self, *ids: pl.Series) -> None:
        """Decode the name ids not decoded before into base.strings (shortened, as the whole read
        shortens them, where longer than sanity.NAME_MAX)."""
        got = pl.concat([s.cast(pl.Int32).rename("id") for s in ids]).drop_nulls().unique()
        new = got.filter(~got.is_in(self._seen.implode())).sort()
        if new.is_empty():
            return
        self._seen = pl.concat([self._seen, new])
        decoded, _ = sanity.capped(self._string_ids.decoded(new, []), "value")
        if decoded.height:
            # in id order, as the whole read holds them (and as a lookup table by id is filled:
            # polars 1.33 scatters strings only at sorted indices)
            # each id once (a copy of this reader for another read, for_another_read, decodes
            # what an earlier copy on its worker did: its account must count them too)
            self.base.strings = pl.concat([self.base.strings, decoded]).unique("id", keep="first").sort("id")

    def _read_memops(self, lo, hi, own, corr: pl.DataFrame | None, where: dict | None = None) -> pl.DataFrame:
        parts = [self._rows(t, lo, hi, own, corr, None if where is None else where[kind])
                 .with_columns(_unpack_pid("pid"), pl.lit(kind).alias("kind"))
                 .select(list(MEMOP_SCHEMA)) for kind, t in self._memops]
        memops = pl.concat(parts) if parts else empty(MEMOP_SCHEMA)
        return self._checked(memops, "memops", sanity._times(memops, True) | {
            "with a byte count below 0 or beyond 2^48": (pl.col("bytes") < 0) | (pl.col("bytes") > sanity.MAX_BYTES)},
            own)

    def _rows(self, t: _Table, lo, hi, own, corr: pl.DataFrame | None = None, where: str | None = None) -> pl.DataFrame:
        """The rows of `t` that start in [lo, hi) or carry, for their process, a correlation id
        within `corr`'s range (pid, kmin, kmax), in rowid order, as typed.clean leaves them;
        with lo=None also those whose start is not an integer (typed.clean leaves them out:
        they are read to be counted). What typed.clean leaves out is counted on the rows that
        start in the own span `own`. `where` (SQL): those rows instead, from every chunk."""
        m = t.chunks
        pick = pl.col("smin").is_not_null()
        if hi is not None:
            pick = pick & (pl.col("smin") < hi)
        if lo is not None:
            pick = pick & (pl.col("smax") >= lo)
        if lo is None:
            pick = pick | (pl.col("bad") > 0)
        times = " AND ".join([f"start >= {lo}"] * (lo is not None) + [f"start < {hi}"] * (hi is not None)) or "1"
        conds = [times] + ["typeof(start) != 'integer'"] * (lo is None)
        if where is not None:
            conds, corr = [where], None
        if t.corr and corr is not None and corr.height:
            ranges = corr.select(pl.col("pid").cast(pl.Int64).alias("p"), "kmin", "kmax")
            hit = m.join(ranges, how="cross").filter((pl.col("cmin") <= pl.col("kmax")) & (pl.col("cmax") >= pl.col("kmin")))
            pick = pick | pl.col("c").is_in(hit["c"].implode())
            conds += [f"{_pid_sql(t.pid)} = {p} AND correlationId >= {a} AND correlationId <= {b}"
                      for p, a, b in ranges.iter_rows()]
        cond = " OR ".join(f"({c})" for c in conds)
        chunks = m.filter(pick).select("a", "b").unique().sort("a").rows()
        self.chunks_read[t.q.table] += len(chunks)
        if t is self._kernels:  # the rowids a window's kernels lie among (their grids are read there)
            self.kernel_rowids = (chunks[0][0], chunks[-1][1]) if chunks else None
        queries = [_chunk_query(t.q, a, b, f"({cond})") for a, b in chunks]
        # a light read's own SQL (read_marks: `where`) runs in SQLite, spilled or not
        got = _bulk_raw(self._con, queries) if where is not None else self._raw(t, chunks, queries,
                                                                                 _selected(t, lo, hi, corr))
        frames = []
        for q, (raw, is_typed) in zip(queries, got):
            self.rows_read[q.table] += raw.height
            mine = raw.select(_own(*own)).to_series() if raw.height else None
            df, rep = typed.clean(raw, q, is_typed)
            if rep.left_out or rep.bad_text:  # counted again, on the rows this window owns
                rep = typed.clean(raw.filter(mine), q, is_typed)[1]
            else:
                rep = typed.Reading(q.table, rows=int(mine.sum()) if mine is not None else 0)
            self._readings[q.table].add(rep)
            frames.append(df)
        if frames:
            return pl.concat(frames)
        return typed.clean(pl.DataFrame(schema=t.q.raw_schema(False)), t.q, False)[0]

    def _checked(self, df: pl.DataFrame, stage: str, checks: dict[str, pl.Expr], own) -> pl.DataFrame:
        """sanity._leave_out's rows left out of `df`, counted on the rows that start in the own
        span `own` in the account of `stage` (one of self._tallies)."""
        tally = self._tallies[stage]
        if df.is_empty():
            return df
        flags = df.select(*(e.fill_null(False).alias(f"_{i}") for i, e in enumerate(checks.values())),
                          _own=_in("start", *own))
        bad = flags.select(pl.any_horizontal(pl.exclude("_own"))).to_series()
        mine = flags["_own"]
        tally.rows += int(mine.sum())
        tally.left_out += int((bad & mine).sum())
        for i, why in enumerate(checks):
            tally.why[why] += int((flags[f"_{i}"] & mine).sum())
        return df.filter(~bad) if bad.any() else df

    # ------------------------------------------------------------------ warnings
    def _names_account(self) -> tuple[typed.Reading, list[str]]:
        """typed.clean's account of the names of the rows read (StringIds), and sanity's warning
        of those longer than sanity.NAME_MAX, as the whole read makes them of its names (the same
        ids, once a partition has been read)."""
        readings: list[typed.Reading] = []
        with _input_errors(self.path):
            names = self._string_ids.decoded(self._seen.sort(), readings)
        n = sanity.capped(names, "value")[1]
        return _merged(readings)[0] if readings else typed.Reading("StringIds"), \
            [self._shortened(n, "kernel or API call name(s)")] if n else []

    def warnings(self) -> list[str]:
        """The whole read's warnings (read_nsys_sqlite(path, launch_config=False).warnings), word
        for word and in its order, once windows whose own spans partition the time axis have
        been read (each API call's, kernel's and memop's start in one of them): the readers'
        own, typed.clean's per table (the event tables', then NVTX_EVENTS and the names, the GPUs,
        processes and threads), then sanity.checked's (the kernels' times, their names, memops,
        API calls, NVTX ranges, long names)."""
        names, long_names = self._names_account()
        readings = [*self._readings.values(), *self._nvtx_readings, names, *self._rest_readings]
        out = list(self._direct) + [w for w in (r.warning() for r in _merged(readings)) if w]
        out += [w for w in (t.warning() for t in self._tallies.values()) if w]
        return out + self._nvtx_left_out + long_names + self._nvtx_capped

    def warnings_so_far(self) -> list[str]:
        """What the reads so far left out of the event tables and of their names, in the whole
        read's words: each table's typed.clean account, the names', then sanity's. With
        base.warnings, over windows whose own spans partition the time axis, the whole read's
        warnings (warnings() puts them in its order)."""
        names, long_names = self._names_account()
        out = [w for w in (r.warning() for r in [*self._readings.values(), names]) if w]
        return out + [w for w in (t.warning() for t in self._tallies.values()) if w] + long_names

    def for_another_read(self) -> "WindowReader":
        """A copy that shares this reader's connection and maps but keeps an account of its own
        (account()): what a dask worker's task reads through, the reader sent to the worker once."""
        other = copy.copy(self)
        other._readings = {t: typed.Reading(t) for t in self._readings}
        other._tallies = {k: _Tally(t.what) for k, t in self._tallies.items()}
        other._seen = self._seen.clear()
        return other

    def account(self) -> tuple:
        """What the reads so far left out and which names they decoded: what a copy of this
        reader that read windows elsewhere (a dask worker's) hands back, for add_account."""
        return self._readings, self._tallies, self._seen

    def add_account(self, account: tuple) -> None:
        """Count in another copy's reads (account()): warnings() then says what both read."""
        readings, tallies, seen = account
        for table, r in readings.items():
            self._readings.setdefault(table, typed.Reading(table)).add(r)
        for stage, t in tallies.items():
            mine = self._tallies[stage]
            mine.rows += t.rows
            mine.left_out += t.left_out
            mine.why.update(t.why)
        self._seen = pl.concat([self._seen, seen]).unique()

    def close(self) -> None:
        if self._con is not None:
            self._con.close()
            self._con = None
        if self._spill is not None:
            self._spill.close()
            self._spill = None

    def __getstate__(self) -> dict:
        """What the reader learnt at open and of the windows read, without its connection: a
        copy (a dask worker's, by_windows.py) reads windows without opening the export again."""
        state = self.__dict__.copy()
        state["_con"] = None
        state["_string_ids"] = None
        # the spill is this machine's and this process's (removed as it closes): a copy reads
        # its windows from the export, by the same chunk map
        state["_spill"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        with _input_errors(self.path):
            self._con = connect_readonly(self.path)
            _attach_adbc(self._con, self.path)
            self._string_ids = _StringIds(self._con, _Schema(self._con), self.path)

    def __enter__(self) -> "WindowReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
