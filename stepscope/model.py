"""The one normalized trace model every reader produces and every analysis consumes.

A `Trace` is a bundle of polars frames. Readers (nsys SQLite, PyTorch-profiler JSON) fill it;
analyses only read it. Times are integer nanoseconds on one clock per trace; names are kept
as integer ids into `strings` so that million-kernel traces never materialize a million
Python strings (decode ids with `Trace.name_of` / `Trace.decode`).

Frames and their columns (dtype in brackets):

kernels   pid[i32] device[i32] stream[i32] corr[i64] start[i64] end[i64]
          short_id[i32] demangled_id[i32] grid_x/y/z[i64] block_x/y/z[i64]
          graph_node_id[i64, null when not a graph node]
          (grid/block are absent when the reader was asked to skip them: launch_config=False)
memops    pid device stream [i32], corr start end [i64], kind[str: memcpy|memset], bytes[i64]
          copy_kind[i32: a memcpy's direction, nsys's copyKind (1 host-to-device, 2
          device-to-host, 8 device-to-device, ...); null for memsets and when unknown]
api       pid tid [i32], corr start end [i64], name_id[i32]; runtime *and* driver calls
nvtx      pid tid [i32], start end [i64], name[str]; ranges only (instant markers dropped)
strings   id[i32] value[str]; only the ids that occur in the frames above
gpus      device[i32] name[str] sm_count[i64] memory_bandwidth_bps[i64] total_memory_bytes[i64]
processes pid[i32] name[str]
threads   pid[i32] tid[i32] name[str]

`pid` and `tid` are OS ids (unpacked from nsys's globalPid/globalTid).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import polars as pl

I64 = pl.Int64
# OS ids, device and stream numbers and string ids fit 32 bits: a million-row frame saves 4 MB
# per such column (times are ns and stay 64-bit; correlation ids are 64-bit in nsys)
I32 = pl.Int32

KERNEL_SCHEMA = {
    "pid": I32, "device": I32, "stream": I32, "corr": I64, "start": I64, "end": I64,
    "short_id": I32, "demangled_id": I32,
    "grid_x": I64, "grid_y": I64, "grid_z": I64, "block_x": I64, "block_y": I64, "block_z": I64,
    "graph_node_id": I64,
}
MEMOP_SCHEMA = {
    "pid": I32, "device": I32, "stream": I32, "corr": I64, "start": I64, "end": I64,
    "kind": pl.String, "bytes": I64, "copy_kind": I32,
}
API_SCHEMA = {"pid": I32, "tid": I32, "corr": I64, "start": I64, "end": I64, "name_id": I32}
NVTX_SCHEMA = {"pid": I32, "tid": I32, "start": I64, "end": I64, "name": pl.String}
STRING_SCHEMA = {"id": I32, "value": pl.String}
GPU_SCHEMA = {
    "device": I32, "name": pl.String, "sm_count": I64,
    "memory_bandwidth_bps": I64, "total_memory_bytes": I64,
}
PROCESS_SCHEMA = {"pid": I32, "name": pl.String}
THREAD_SCHEMA = {"pid": I32, "tid": I32, "name": pl.String}


# the frames with a row per event: what an analysis lets go of once its activities hold them
EVENT_FRAMES = ("kernels", "memops", "api")


def empty(schema: dict) -> pl.DataFrame:
    return pl.DataFrame(schema=schema)


def in_span(col: str, lo: int | None, hi: int | None) -> pl.Expr:
    """`col` in the time span [lo, hi) (None: unbounded on that side): how a window of a long run
    selects its events, the same whether cut from a whole read (analysis/windows.py) or read
    (ingest/nsys_windows.py)."""
    e = pl.lit(True)
    if lo is not None:
        e = e & (pl.col(col) >= lo)
    if hi is not None:
        e = e & (pl.col(col) < hi)
    return e


def window_events(api: pl.DataFrame, kernels: pl.DataFrame, memops: pl.DataFrame, nvtx: pl.DataFrame,
                  lo: int | None, hi: int | None) -> dict:
    """The events of a window [lo, hi) of host time, of a trace's (or of the rows read for it:
    ingest/nsys_windows.py): its API calls (`api`: those that started in it), the kernels and
    memops they launched or that started in it launched by none of them, the NVTX ranges that
    overlap it. The same selection whether cut from a whole read (analysis/windows.py) or read."""
    keys = api.select("pid", "corr").unique().with_columns(_mine=pl.lit(True))

    def launched(f: pl.DataFrame) -> pl.DataFrame:
        # one join marks the rows launched by the window's calls (a semi and an anti join were two)
        mine = f.select("pid", "corr").join(keys, on=["pid", "corr"], how="left", maintain_order="left")["_mine"]
        g = f.with_columns(_mine=mine.is_not_null()).with_columns(_loose=~pl.col("_mine") & in_span("start", lo, hi))
        if not g["_loose"].any():
            return f.filter(g["_mine"])
        # in start order, the launched rows first at a tie, each kind in its own order
        return (g.filter(pl.col("_mine") | pl.col("_loose")).sort("start", "_loose", maintain_order=True)
                .drop("_mine", "_loose"))

    if lo is not None:
        nvtx = nvtx.filter(pl.col("end") >= lo)
    if hi is not None:
        nvtx = nvtx.filter(pl.col("start") < hi)
    return {"kernels": launched(kernels), "memops": launched(memops), "api": api, "nvtx": nvtx}


@dataclass
class Trace:
    """A normalized trace: what one profiler run recorded, independent of its file format."""

    path: Path
    format: str  # "nsys-sqlite" | "kineto-json"
    kernels: pl.DataFrame
    memops: pl.DataFrame
    api: pl.DataFrame
    nvtx: pl.DataFrame
    strings: pl.DataFrame
    gpus: pl.DataFrame = field(default_factory=lambda: empty(GPU_SCHEMA))
    processes: pl.DataFrame = field(default_factory=lambda: empty(PROCESS_SCHEMA))
    threads: pl.DataFrame = field(default_factory=lambda: empty(THREAD_SCHEMA))
    nsys_version: str | None = None
    schema_version: str | None = None
    # cudaGraphLaunch replays recorded without per-kernel rows (--cuda-graph-trace=graph).
    graph_level_launches: int = 0
    # nsys's own cost, from PROFILER_OVERHEAD: rows and summed duration.
    profiler_overhead_count: int = 0
    profiler_overhead_ns: int = 0
    warnings: list[str] = field(default_factory=list)
    # what `stepscope trace` measured outside nsys's capture range (ingest/sidecar.py): read
    # from `<name>.stepscope.json` beside the export each time (never cached with the frames)
    sidecar: dict | None = None
    # the Parquet cache entry this read wrote (ingest/cache.py), None when it wrote none
    cache_entry: Path | None = None
    # the Parquet cache entry the frames came from or were written to (None: not cached); an
    # analysis of them may keep its own frames inside it (ingest/cache.py, load_derived)
    cache_dir: Path | None = field(default=None, repr=False, compare=False)
    # reads this trace again from its file (ingest.read_trace sets it): what read_events() brings the
    # event frames back with after drop_event_frames(reread=True)
    reread: "Callable[[], Trace] | None" = field(default=None, repr=False, compare=False)
    # reads chosen kernels' grid and block from the trace's file (stepscope.launch_config), where
    # the trace is a window of a long run's (by_windows.py): its rows' only
    launch_config: "Callable | None" = field(default=None, repr=False, compare=False)
    # the engine loop's steps (steps.engine_windows) of the whole run this trace is a window of
    # (analysis/windows.py): found once from a light read of the run, not from the window's events
    engine_windows: "pl.DataFrame | None" = field(default=None, repr=False, compare=False)

    def name_of(self, ids: pl.Expr | str, alias: str) -> pl.Expr:
        """An expression mapping an id column to its string (for use in with_columns)."""
        col = pl.col(ids) if isinstance(ids, str) else ids
        return col.replace_strict(
            self.strings["id"], self.strings["value"], default=None, return_dtype=pl.String
        ).alias(alias)

    def drop_event_frames(self, reread: bool = False) -> None:
        """Let go of the per-event frames (kernels, memops, API calls) once an analysis holds
        their rows; what describes the trace (strings, GPUs, NVTX, processes) stays. With
        `reread` the caller may read them again from the trace's file (read_events, a notebook
        may ask); without, an access is a mistake of the caller and says so."""
        for name in EVENT_FRAMES:
            self.__dict__.pop(name, None)
        if not reread:
            self.reread = None

    @property
    def has_events(self) -> bool:
        """Whether the kernel, memop and API frames are held (not let go, or read again)."""
        return all(f in self.__dict__ for f in EVENT_FRAMES)

    def read_events(self) -> "Trace":
        """Read the kernel, memop and API frames again from the trace's file (the read that made
        this trace: ingest.read_trace's `reread`), when they were let go (drop_event_frames with
        `reread`) or left unread (read_trace's events=False): asked for by the caller, never on
        an attribute access. Returns the trace."""
        if self.has_events:
            return self
        if self.__dict__.get("reread") is None:
            raise AttributeError("the trace's event frames were let go once the analysis held their rows "
                                 "(analysis/memory.py): read them from the Inventory's activities")
        fresh = self.reread()
        for f in EVENT_FRAMES:
            self.__dict__[f] = getattr(fresh, f)
        return self

    def __repr__(self) -> str:
        # the dataclass' own repr would touch the frames let go (and print a million rows)
        held = ", ".join(f"{f}={self.__dict__[f].height} rows" if f in self.__dict__ else f"{f}=let go"
                         for f in EVENT_FRAMES)
        return f"Trace(path={self.path!r}, format={self.format!r}, {held})"

    def __getattr__(self, name: str):
        # reached only when normal lookup fails: an event frame drop_event_frames() let go; says
        # why, reads nothing (read_events does, when asked)
        if name not in EVENT_FRAMES:
            raise AttributeError(f"{type(self).__name__!s} has no attribute {name!r}")
        if self.__dict__.get("reread") is None:
            raise AttributeError(f"the trace's {name} frame was let go once the analysis held its rows "
                                 "(analysis/memory.py): read them from the Inventory's activities")
        raise AttributeError(f"the trace's {name} frame was let go once the analysis held its rows "
                             "(analysis/memory.py): Trace.read_events() reads them again from the file")

    def string_map(self) -> dict[int, str]:
        return dict(zip(self.strings["id"].to_list(), self.strings["value"].to_list()))
