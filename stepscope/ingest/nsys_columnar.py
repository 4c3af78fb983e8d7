"""Reader for nsys's columnar exports: `nsys export --type=arrow` and `--type=parquetdir`.

nsys 2025.3 writes the same tables as its SQLite export, column for column:
- `--type=arrow`: one file of Arrow IPC *streams* back to back, one stream per table, the table's
  name in the stream schema's metadata (`table_name`);
- `--type=parquetdir`: a folder of one `<TABLE>.parquet` per table.

The frames, the rows left out and the warnings are the SQLite reader's (nsys_sqlite.py) on the
same report: the same typed.Query columns go through the same typed.clean, and the few SQL
filters that reader runs (runtime and driver calls of the kept API names, bounded NVTX ranges,
the StringIds that occur) are polars expressions here. No SQLite on the way: only the columns
used are taken (Parquet reads just those; the Arrow file is memory-mapped, and a column not
taken is never touched).
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from stepscope import apinames
from stepscope.errors import InputError
import stepscope.ingest.sanity as sanity  # the modules, not the package: no circle through ingest/__init__
import stepscope.ingest.typed as typed
from stepscope.ingest.nsys_sqlite import (KERNEL_TABLE, LAUNCH_COLUMNS, PROCESS_COLUMNS, RUNTIME_TABLE,
                                          THREAD_COLUMNS, _merged, _unpack_pid, _unpack_tid, read_names)
import stepscope.ingest.graph_replays as graph_replays
from stepscope.ingest.typed import INT32 as I32, TEXT, Col as C
from stepscope.model import (API_SCHEMA, GPU_SCHEMA, KERNEL_SCHEMA, MEMOP_SCHEMA, NVTX_SCHEMA, STRING_SCHEMA,
                             Trace, empty)
from stepscope.paths import shown

ARROW_STREAM_HEAD = b"\xff\xff\xff\xff"  # an IPC stream's first message: the continuation marker
ARROW_FILE_HEAD = b"ARROW1"
PARQUET_HEAD = b"PAR1"
FORMATS = {"arrow": "nsys-arrow", "parquetdir": "nsys-parquet"}


def kind_of(path: Path, head: bytes) -> str | None:
    """"arrow" or "parquetdir" when `path` looks like one of nsys's columnar exports, else None."""
    if path.is_dir():
        return "parquetdir" if any(path.glob("*.parquet")) else None
    if head.startswith(ARROW_STREAM_HEAD) or head.startswith(ARROW_FILE_HEAD):
        return "arrow"
    return None


class Tables:
    """The tables of a columnar export, each read (only the columns asked for) when asked."""

    def __init__(self, path: Path, kind: str):
        _need_pyarrow()
        self.path, self.kind = path, kind
        self._arrow: dict[str, object] = {}
        self._parquet: dict[str, Path] = {}
        self._cols: dict[str, list[str]] = {}
        if kind == "parquetdir":
            import pyarrow.parquet as pq

            for f in sorted(path.glob("*.parquet")):
                try:
                    self._cols[f.stem] = list(pq.read_schema(f).names)
                except Exception as e:  # noqa: BLE001 - pyarrow's errors have no common base worth naming
                    raise InputError(f"{shown(f)} is not a readable Parquet file ({_first(e)}): export it again "
                                     "with nsys export --type=parquetdir") from None
                self._parquet[f.stem] = f
        else:
            self._read_arrow()

    def _read_arrow(self) -> None:
        import pyarrow as pa
        import pyarrow.ipc as ipc

        try:
            source = pa.memory_map(str(self.path), "r")
            size = source.size()
            if source.read(6) == ARROW_FILE_HEAD:  # one table in the IPC file format
                source.seek(0)
                t = ipc.open_file(source).read_all()
                self._add(t)
                return
            source.seek(0)
            while source.tell() < size:
                t = ipc.open_stream(source).read_all()
                self._add(t)
        except (pa.ArrowInvalid, OSError) as e:
            raise InputError(f"{shown(self.path)} is not a readable Arrow export ({_first(e)}); it may be "
                             "truncated: export it again with nsys export --type=arrow") from None

    def _add(self, t) -> None:
        meta = t.schema.metadata or {}
        name = meta.get(b"table_name", b"").decode("utf-8", "replace")
        if not name:
            raise InputError(f"{shown(self.path)}: an Arrow stream without a table_name: not an nsys export "
                             "(export it again with nsys export --type=arrow)")
        self._arrow.setdefault(name, t)
        self._cols.setdefault(name, list(t.schema.names))

    @property
    def tables(self) -> set[str]:
        return set(self._cols)

    def has(self, table: str) -> bool:
        return table in self._cols

    def cols(self, table: str) -> set[str]:
        return set(self._cols.get(table, ()))

    def col_or_null(self, table: str, col: str) -> str:
        return col if col in self.cols(table) else "NULL"

    def rows(self, table: str) -> int:
        if not self.has(table):
            return 0
        if self.kind == "parquetdir":
            import pyarrow.parquet as pq

            return pq.ParquetFile(self._parquet[table]).metadata.num_rows
        return self._arrow[table].num_rows

    def frame(self, table: str, columns: list[str]) -> pl.DataFrame:
        """The columns of `table` (each once, in the order asked), as polars reads them."""
        cols = list(dict.fromkeys(columns))
        if self.kind == "parquetdir":
            try:
                return pl.read_parquet(self._parquet[table], columns=cols, use_pyarrow=False)
            except pl.exceptions.PolarsError as e:
                raise InputError(f"{shown(self._parquet[table])} cannot be read ({_first(e)}): export it again "
                                 "with nsys export --type=parquetdir") from None
        return pl.from_arrow(self._arrow[table].select(cols), rechunk=True)


def _first(e: Exception) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _raw(df: pl.DataFrame, q: typed.Query) -> pl.DataFrame:
    """The typed read's layout (typed.Query.raw_names(True)) of the frame `df` of the table's own
    columns: what the SQLite reader's typed query would return. A column of a non-integer type
    where an integer is read counts each of its values as 'not an integer', as SQLite's typeof."""
    out, bits = [], []
    for c in q.cols:
        src = None if c.sql == "NULL" else c.sql.split(".")[-1]
        col = pl.lit(None) if src is None else pl.col(src)
        dtype = None if src is None else df.schema[src]
        if c.kind == TEXT:
            if dtype is not None and dtype not in (pl.String, pl.Binary, pl.Null):
                col = col.cast(pl.String)
            out.append(col.cast(pl.Binary).fill_null(b"").alias(c.name))
            out.append(col.is_null().cast(pl.Int64).alias(f"_null_{c.name}"))
        else:
            if dtype is None or dtype == pl.Null or dtype.is_integer() or dtype == pl.Boolean:
                out.append(col.cast(pl.Int64).alias(c.name))
                bits.append(pl.lit(0, pl.Int64))
            else:
                out.append(pl.lit(None, pl.Int64).alias(c.name))
                bits.append(col.is_not_null().cast(pl.Int64))
    wrong = pl.lit(0, pl.Int64)
    for i, b in enumerate(bits):
        wrong = wrong | (b * (1 << i))
    return df.select(*out, wrong.alias(typed._WRONG))


def _frame(t: Tables, q: typed.Query, where: pl.Expr | None = None,
           src: pl.DataFrame | None = None) -> tuple[pl.DataFrame, typed.Reading]:
    """The SQLite reader's _frame(q) over a columnar table: q's columns, the rows `where` keeps."""
    if src is None:
        names = [c.sql.split(".")[-1] for c in q.cols if c.sql != "NULL"]
        src = t.frame(q.table, names + _where_cols(where))
    if where is not None:
        src = src.filter(where)
    return typed.clean(_raw(src, q), q, True)


def _where_cols(where: pl.Expr | None) -> list[str]:
    return [] if where is None else where.meta.root_names()


def _need(t: Tables, table: str, *cols: str) -> None:
    missing = [c for c in cols if c not in t.cols(table)]
    if missing:
        raise InputError(f"{shown(t.path)}: table {table} has no column {missing[0]}: not an nsys export stepscope "
                         "can read (damaged, or written by another tool); export it again with nsys export")


def _lacks(t: Tables, table: str, *cols: str) -> str | None:
    return next((c for c in cols if c not in t.cols(table)), None)


def _is_int(col: str) -> pl.Expr:
    return pl.col(col).is_not_null()


def read_nsys_columnar(path: str | Path, launch_config: bool = True, kind: str | None = None) -> Trace:
    """Read a columnar export (kind "arrow" or "parquetdir", sniffed when None): the Trace the
    SQLite reader gives for the same report (format nsys-arrow or nsys-parquet)."""
    path = Path(path)
    if kind is None:
        with open(path, "rb") if path.is_file() else _Empty() as f:
            kind = kind_of(path, f.read(16))
    if kind is None:
        raise InputError(f"{shown(path)} is not an nsys Arrow or Parquet export")
    t = Tables(path, kind)
    return _read(t, path, launch_config, FORMATS[kind])


class _Empty:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False

    def read(self, n: int) -> bytes:
        return b""


def _read(t: Tables, path: Path, launch_config: bool, fmt: str) -> Trace:
    meta = _metadata(t)
    warnings: list[str] = []
    readings: list[typed.Reading] = []
    k = KERNEL_TABLE
    if not t.has(k):
        graph_rows = t.rows("CUPTI_ACTIVITY_KIND_GRAPH_TRACE")
        if graph_rows:
            raise InputError(
                f"{path} has no per-kernel rows: its {graph_rows} CUDA-graph launches were traced "
                "as whole graphs; capture again with nsys profile --cuda-graph-trace=node")
        raise InputError(
            f"{path} has no kernel table ({k}): it was captured without CUDA tracing (or exported with "
            "--tables that left it out); capture again with nsys profile --trace=cuda,nvtx")
    if not t.has("StringIds"):
        raise InputError(f"{path} has no StringIds table: its kernel names cannot be read (damaged, or "
                         "written by another tool); export it again with nsys export")
    _need(t, k, "globalPid", "deviceId", "streamId", "correlationId", "start", "end", "shortName", "demangledName")
    graphs = _has_graphs(t)
    cols = [C("pid", "globalPid"), C("device", "deviceId", I32), C("stream", "streamId", I32),
            C("corr", "correlationId", required=False), C("start", "start"), C("end", "end"),
            C("short_id", "shortName", I32), C("demangled_id", "demangledName", I32)]
    if launch_config:
        cols += [C(name, t.col_or_null(k, col), required=False, source=col) for name, col in LAUNCH_COLUMNS.items()]
    if graphs:
        cols.append(C("graph_node_id", "graphNodeId", required=False))
    kernels, rep = _frame(t, typed.Query(k, cols))
    readings.append(rep)
    if kernels.is_empty():
        if rep.rows:
            raise InputError(f"{path}: no usable kernels: {rep.warning()}")
        raise InputError(f"{path}: no kernels recorded — was `--trace=cuda` on? capture again with "
                         "nsys profile --trace=cuda,nvtx")
    kernels = kernels.with_columns(_unpack_pid("pid"))
    if not launch_config:
        kernels = kernels.with_columns(*(pl.lit(None, pl.Int64).alias(c) for c in LAUNCH_COLUMNS))
    if not graphs:
        kernels = kernels.with_columns(pl.lit(None, pl.Int64).alias("graph_node_id"))
    kernels = kernels.select([c for c in KERNEL_SCHEMA if launch_config or not c.startswith(("grid_", "block_"))])
    if t.rows(graph_replays.TABLE):
        replays, rep = _frame(t, graph_replays.QUERY)
        readings.append(rep)
        kernels = graph_replays.with_replays(kernels, replays.with_columns(_unpack_pid("pid")))

    api = empty(API_SCHEMA)
    if t.has(RUNTIME_TABLE):
        rt = t.cols(RUNTIME_TABLE)
        name_col = "nameId" if "nameId" in rt else "name"
        _need(t, RUNTIME_TABLE, "globalTid", "correlationId", "start", "end", name_col)
        where = pl.col("eventClass").is_in([0, 1]) if "eventClass" in rt else None
        if name_col == "nameId" and {"id", "value"} <= t.cols("StringIds"):
            strings = t.frame("StringIds", ["id", "value"])
            kept = strings.filter(pl.col("id").is_not_null() & _glob_any(pl.col("value").cast(pl.String),
                                                                        apinames.KEPT))["id"]
            names = pl.col("nameId").is_in(kept.implode())
            where = names if where is None else where & names
        q = typed.Query(RUNTIME_TABLE, [C("pid", "globalTid"), C("corr", "correlationId", required=False),
                                        C("start", "start"), C("end", "end"), C("name_id", name_col, I32)])
        raw_api, rep = _frame(t, q, where)
        readings.append(rep)
        api = raw_api.select(_unpack_pid("pid"), _unpack_tid("pid"), pl.exclude("pid"))

    memops = _read_memops(t, readings)
    nvtx = _read_nvtx(t, readings, warnings)
    strings = graph_replays.with_replay_name(
        _read_strings(t, pl.concat([kernels["short_id"].unique(), kernels["demangled_id"].unique(),
                                    api["name_id"].unique()]).unique().drop_nulls(), readings), kernels)
    gpus = _read_gpus(t, readings, warnings)
    processes, threads = read_names(
        t.has, lambda *a: _lacks(t, *a), lambda: _frame(t, typed.Query("PROCESSES", PROCESS_COLUMNS)),
        lambda: _frame(t, typed.Query("ThreadNames", THREAD_COLUMNS), src=_thread_names(t)), warnings, readings)

    graph_level = t.rows("CUPTI_ACTIVITY_KIND_GRAPH_TRACE")
    if graph_level:
        warnings.append(f"per-kernel inventory unavailable for {graph_level} graph launches "
                        "(traced with --cuda-graph-trace=graph; use --cuda-graph-trace=node)")
    overhead_n, overhead_ns = 0, 0
    if t.has("PROFILER_OVERHEAD") and not _lacks(t, "PROFILER_OVERHEAD", "start", "end"):
        po = t.frame("PROFILER_OVERHEAD", ["start", "end"])
        if po.schema["start"].is_integer() and po.schema["end"].is_integer():
            good = po.filter(pl.col("start").is_not_null() & pl.col("end").is_not_null()
                             & (pl.col("end") >= pl.col("start")))
            overhead_n = good.height
            # SQLite's total(): a floating-point sum
            overhead_ns = float(good.select((pl.col("end") - pl.col("start")).cast(pl.Float64).sum()).item() or 0.0)
        overhead_ns = int(min(overhead_ns, float(1 << 62)))

    warnings += [w for w in (r.warning() for r in _merged(readings)) if w]
    return sanity.checked(Trace(
        path=path, format=fmt, kernels=kernels, memops=memops, api=api, nvtx=nvtx,
        strings=strings, gpus=gpus, processes=processes, threads=threads,
        nsys_version=meta.get("EXPORT_PRODUCT_VERSION"), schema_version=meta.get("EXPORT_SCHEMA_VERSION"),
        graph_level_launches=int(graph_level), profiler_overhead_count=int(overhead_n),
        profiler_overhead_ns=int(overhead_ns), warnings=warnings))


def _thread_names(t: Tables) -> pl.DataFrame:
    """ThreadNames t JOIN StringIds s ON s.id = t.nameId, in ThreadNames' order."""
    return t.frame("ThreadNames", ["globalTid", "nameId"]).join(
        t.frame("StringIds", ["id", "value"]).unique("id", keep="first", maintain_order=True),
        left_on="nameId", right_on="id", how="inner", maintain_order="left")


def _glob_any(text: pl.Expr, prefixes) -> pl.Expr:
    """value GLOB 'p*' for any p (the prefixes hold no GLOB metacharacters)."""
    out = pl.lit(False)
    for p in prefixes:
        out = out | text.str.starts_with(p)
    return out.fill_null(False)


def _metadata(t: Tables) -> dict[str, str]:
    for table in ("META_DATA_EXPORT", "EXPORT_META_DATA"):
        if t.has(table) and {"name", "value"} <= t.cols(table):
            df = t.frame(table, ["name", "value"])
            if df.schema["name"] != pl.String:
                return {}
            df = df.filter(pl.col("name").is_not_null())
            values = df["value"] if df.schema["value"] == pl.String else df["value"].cast(pl.String).str.slice(0, 200)
            return dict(zip(df["name"].to_list(), values.to_list()))
    return {}


def _has_graphs(t: Tables) -> bool:
    if "graphNodeId" not in t.cols(KERNEL_TABLE):
        return False
    if any(x.startswith("CUDA_GRAPH") for x in t.tables) or "value" not in t.cols("StringIds"):
        return True
    values = t.frame("StringIds", ["value"])["value"].cast(pl.String)
    return bool(values.to_frame().select(_glob_any(pl.col("value"), apinames.GRAPH_LAUNCH).any()).item())


def _read_memops(t: Tables, readings: list) -> pl.DataFrame:
    parts = []
    for table, kind in (("CUPTI_ACTIVITY_KIND_MEMCPY", "memcpy"), ("CUPTI_ACTIVITY_KIND_MEMSET", "memset")):
        if t.has(table):
            _need(t, table, "globalPid", "deviceId", "streamId", "correlationId", "start", "end")
            from stepscope.ingest.nsys_sqlite import memop_query

            df, rep = _frame(t, memop_query(table, kind, t.col_or_null))
            readings.append(rep)
            parts.append(df.with_columns(_unpack_pid("pid"), pl.lit(kind).alias("kind")).select(list(MEMOP_SCHEMA)))
    return pl.concat(parts) if parts else empty(MEMOP_SCHEMA)


def _read_nvtx(t: Tables, readings: list, warnings: list) -> pl.DataFrame:
    if not t.has("NVTX_EVENTS"):
        return empty(NVTX_SCHEMA)
    _need(t, "NVTX_EVENTS", "start", "end", "eventType", "globalTid")
    cols = t.cols("NVTX_EVENTS")
    ids = "textId" in cols and t.has("StringIds")
    raw, rep = _frame(t, typed.Query("NVTX_EVENTS", [
        C("gtid", "globalTid"), C("start", "start"), C("end", "end"),
        C("text", "text" if "text" in cols else "NULL", TEXT, False, "text"),
        C("text_id", "textId" if ids else "NULL", I32, False, "textId")]),
        pl.col("eventType").is_in([59, 60]) & pl.col("end").is_not_null())
    readings.append(rep)
    name = pl.col("text")
    if ids:
        need = raw.filter(pl.col("text").is_null())["text_id"].drop_nulls().unique()
        strings = _read_strings(t, need, readings)
        name = pl.coalesce(name, pl.col("text_id").replace_strict(
            strings["id"], strings["value"], default=None, return_dtype=pl.String))
        nowhere = need.filter(~need.is_in(strings["id"].implode()))
        if nowhere.len():
            n = raw.filter(pl.col("text").is_null() & pl.col("text_id").is_in(nowhere.implode())).height
            warnings.append(f"NVTX_EVENTS: {n:,} ranges have no name (their textId is not in StringIds)")
    return raw.select(_unpack_pid("gtid").alias("pid"), _unpack_tid("gtid"), "start", "end",
                      name.alias("name")).cast(NVTX_SCHEMA)


def _read_strings(t: Tables, ids: pl.Series, readings: list) -> pl.DataFrame:
    if not t.has("StringIds") or ids.len() == 0:
        return empty(STRING_SCHEMA)
    _need(t, "StringIds", "id", "value")
    df, rep = _frame(t, typed.Query("StringIds", [C("id", "id", I32), C("value", "value", TEXT)]),
                     pl.col("id").is_in(ids.cast(pl.Int64).implode()))
    readings.append(rep)
    return df.unique("id", keep="first", maintain_order=True)


def _read_gpus(t: Tables, readings: list, warnings: list) -> pl.DataFrame:
    from stepscope.ingest.nsys_sqlite import GPU_TABLE, gpu_query

    q = gpu_query(t.cols(GPU_TABLE), warnings) if t.has(GPU_TABLE) else None
    if q is None:
        return empty(GPU_SCHEMA)
    df, rep = _frame(t, q)
    readings.append(rep)
    return df.unique("device", keep="first").sort("device")


def _need_pyarrow() -> None:
    """pyarrow reads nsys's columnar exports; it is an optional extra, so its absence is one line."""
    import importlib.util

    if importlib.util.find_spec("pyarrow") is None:
        from stepscope.errors import EnvironmentProblem

        raise EnvironmentProblem("reading nsys's Arrow or Parquet exports needs pyarrow: "
                                 "pip install 'stepscope[columnar]' (or export to SQLite: nsys export --type=sqlite)")
