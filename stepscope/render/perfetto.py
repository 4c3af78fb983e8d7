"""Chrome trace JSON of chosen steps, for ui.perfetto.dev (or chrome://tracing).

Layout:
  one process per GPU device ("GPU <d>", pid DEVICE_PID_BASE + d), one thread per stream;
      kernels and memops as complete ("X") events, `cat` = kernel class
  one process per host process (its OS pid), one thread per OS thread: the launch calls that
      launched the steps' GPU work; and a "steps" thread with the step ranges
  a flow arrow (ph "s" at the launch call → ph "f", bp "e", at the GPU activity, same id)

A track of the format must hold slices that nest or follow each other: Perfetto drops (and
chrome://tracing misdraws) a slice that partially overlaps another on its thread. GPU work of one
stream does overlap — a split-K GEMM and its splitKreduce, 54 times in the eager decode fixture —
and a nested kernel would read as a call stack it is not, so every track is split into lanes:
each slice goes to the first lane whose previous slice has ended. Lane 0 keeps the stream's (or
OS thread's) id and name; lane k > 0 is thread id + k × LANE_TID_STRIDE, named "… (overlap k)".

Timestamps are microseconds (the format's unit) relative to the first exported event, with
nanosecond precision kept in the fraction; `otherData.t0_ns` holds the trace time of zero.
"""

from __future__ import annotations

import gzip
import heapq
import json
from collections.abc import Iterator

import polars as pl

from stepscope.analysis.inventory import Inventory
from stepscope.launch_config import DIMS
from stepscope.paths import shown
from stepscope.render.names import DOCUMENT, cut

DEVICE_PID_BASE = 100_000_000  # above Linux's pid_max (2^22), so never a host pid
# Lane k > 0 of a track is its thread id + k × this: above pid_max (2^22), so never an OS thread
# id, and above every stream id nsys and Kineto write (small integers)
LANE_TID_STRIDE = 10_000_000
STEPS_TID = 5_000_000  # the host process's "steps" track: between pid_max and the first lane


def _ts(ns: int, t0: int) -> float:
    """A Chrome-trace timestamp: µs (the format's unit) since t0, ns kept in the fraction."""
    return (ns - t0) / 1000.0


def lanes(starts: list[int], ends: list[int]) -> list[int]:
    """Interval partitioning of slices sorted by start: each slice goes to the lowest-numbered
    lane free at its start (its last slice ended at or before it), so no two slices of a lane
    overlap and the lane count is the most slices open at once."""
    free: list[int] = []          # lanes whose last slice has ended
    open_: list[tuple] = []       # (end, lane) of the slice each busy lane holds
    out = []
    for s, e in zip(starts, ends):
        while open_ and open_[0][0] <= s:
            heapq.heappush(free, heapq.heappop(open_)[1])
        lane = heapq.heappop(free) if free else len(open_)  # no free lane: all are open
        heapq.heappush(open_, (e, lane))
        out.append(lane)
    return out


def _lane_tid(tid: int | None, lane: int) -> int:
    return (tid or 0) + lane * LANE_TID_STRIDE


def _run_lanes(frame: pl.DataFrame, keys: list[str], start: str, end: str) -> pl.Series:
    """lanes() per track (`keys`) of a frame sorted by start, without a Python step per slice:
    a slice that starts at or after every earlier slice of its track has ended begins a run that
    takes lane 0 (lanes() gives the lowest free lane, and all are free then); a run of two slices
    takes lanes 0 and 1 (a split-K GEMM and its reduce); only longer runs go through lanes()."""
    if frame.height == 0:
        return pl.Series("_lane", [], pl.Int64)
    # tracks made contiguous (start order kept within each), so runs are contiguous too; on one
    # packed integer where the two track keys fit (a sort or window on two keys costs several
    # times the memory)
    track = _track_key(frame, *keys)
    f = frame.select(*([track] if track is not None else keys), start, end).with_row_index("_i")
    by = ["_track"] if track is not None else keys
    f = f.sort("_track", maintain_order=True) if track is not None else f.sort([*keys, "_i"])
    pos = pl.int_range(pl.len(), dtype=pl.Int64)
    new = (pl.col("_prev").is_null() | (pl.col(start) >= pl.col("_prev")))
    f = f.with_columns(pl.col(end).cum_max().shift(1).over(by).alias("_prev")).with_columns(new.alias("_new"))
    f = f.with_columns(pl.when(pl.col("_new")).then(pos).forward_fill().alias("_first"),
                       pl.when(pl.col("_new").shift(-1, fill_value=True)).then(pos).backward_fill().alias("_last"))
    f = f.with_columns((pos - pl.col("_first")).alias("_k"), (pl.col("_last") - pl.col("_first") + 1).alias("_n"))
    lane = f.select("_i", pl.when(pl.col("_n") <= 2).then(pl.col("_k")).otherwise(None).alias("_lane"))
    long = f.filter(pl.col("_n") > 2)
    out = lane.sort("_i")["_lane"]
    if long.height:
        out = out.to_list()
        for _, g in long.group_by("_first", maintain_order=True):
            for i, ln in zip(g["_i"].to_list(), lanes(g[start].to_list(), g[end].to_list())):
                out[i] = ln
        out = pl.Series("_lane", out, pl.Int64)
    return out.cast(pl.Int64).alias("_lane")


def _packed(frame: pl.DataFrame, outer: str, inner: str, bits: int, alias: str,
            inner_nulls: bool = False) -> pl.Expr | None:
    """Two integer key columns as one Int64, outer * 2^bits + inner, where every value fits
    (outer from 0 below 2^(63 - bits), inner from 0 below 2^bits - 1): a sort, window, unique
    or join on one integer column takes a fraction of the memory and time of one on two. With
    `inner_nulls` a null inner key is 2^bits - 1, its own value, as a group-by on the two keeps
    it; without, a null in either makes it None, as does a value that does not fit."""
    b = frame.select(o0=pl.col(outer).min(), o1=pl.col(outer).max(), on=pl.col(outer).null_count(),
                     i0=pl.col(inner).min(), i1=pl.col(inner).max(), inn=pl.col(inner).null_count()).row(0)
    o0, o1, on, i0, i1, inn = b
    if o0 is None or o0 < 0 or o1 >= 1 << (63 - bits) or on or (inn and not inner_nulls):
        return None
    if i0 is not None and (i0 < 0 or i1 >= (1 << bits) - 1):
        return None
    return (pl.col(outer).cast(pl.Int64) * (1 << bits)
            + pl.col(inner).cast(pl.Int64).fill_null((1 << bits) - 1)).alias(alias)


def _track_key(frame: pl.DataFrame, outer: str, inner: str) -> pl.Expr | None:
    """A track (device and stream, or pid and tid) as one integer; a null stream or thread is
    its own track of its device or process."""
    return _packed(frame, outer, inner, 32, "_track", inner_nulls=True)


def _launch_key(acts: pl.DataFrame) -> pl.Expr | None:
    """A launch (pid, correlation id; CUPTI's ids are 32-bit) as one integer."""
    return _packed(acts, "pid", "corr", 40, "_key")


def _us_text(ns: pl.Expr) -> pl.Expr:
    """repr(ns / 1000.0) as text: polars writes a float as its shortest round-trip decimal, as
    Python's repr does. The divisor is a column (x * 0 + 1000): polars divides by a constant as
    a multiplication by its reciprocal (1706.7450000000001 for 1706745 ns), not by a column. A
    fifth of the time of spelling the decimal out from the integer (test_export_perfetto holds
    the text equal to repr on millions of values)."""
    f = ns.cast(pl.Float64)
    return (f / (f * 0.0 + 1000.0)).cast(pl.String)


def _ts_text(col: str, t0: int) -> pl.Expr:
    """_ts over a column, as JSON text (the integer difference first: a float of a trace
    timestamp loses its nanoseconds)."""
    return _us_text(pl.col(col).cast(pl.Int64) - pl.lit(t0, pl.Int64))


def _int_text(e: pl.Expr) -> pl.Expr:
    return e.cast(pl.Int64).cast(pl.String).fill_null("null")


def _lane_tid_expr(tid: pl.Expr, lane: pl.Expr) -> pl.Expr:
    return tid.fill_null(0).cast(pl.Int64) + lane * LANE_TID_STRIDE


def _json_text(frame: pl.DataFrame, col: str, *, cut_to: int | None = None,
               null: str = "null") -> pl.Expr:
    """A text column as JSON strings (json.dumps, cut like names.cut): each distinct value
    encoded once in Python (names repeat: a few hundred per million kernels)."""
    # distinct values first, then text: a categorical column cast whole would spell out every row
    values = [v for v in frame[col].unique().cast(pl.String).to_list() if v is not None]
    mapping = {v: json.dumps(cut(v, cut_to) if cut_to else v) for v in values}
    c = pl.col(col).cast(pl.String)
    if not mapping:
        return pl.lit(null)
    return c.replace_strict(mapping, default=None, return_dtype=pl.String).fill_null(null)


def _lit(text: str) -> pl.Expr:
    return pl.lit(text, pl.String)


# activities encoded per polars pass: bounds the text held at once. The expressions' intermediate
# columns take ~3.5 KB a row: 50,000 rows added 190 MB to a million-kernel export's peak, 10,000
# add 50 MB in the same time (benchmarks/commands.py)
CHUNK_ROWS = 10_000


def export_chunks(inv: Inventory, step_ids: list[int], as_bytes: bool = False) -> Iterator[str | bytes]:
    """The Chrome-trace JSON of the chosen steps, in pieces whose concatenation is the document
    (the events export_document's dict holds, in the same order); built a column at a time.
    `as_bytes`: UTF-8 pieces, the large ones straight from polars (no Python str between)."""
    def piece(text_col: pl.DataFrame):
        col = text_col.to_series()
        return col.cast(pl.Binary).item() if as_bytes else col.item()

    def small(text: str):
        return text.encode("utf-8") if as_bytes else text

    sel = [int(i) for i in step_ids]
    acts = _chosen_activities(inv, sel)
    steps = inv.steps.filter(pl.col("step").is_in(sel))
    # the launch call of each activity is on its row already (the inventory joined it)
    key = _launch_key(acts)
    calls = (
        acts.filter(pl.col("launch_start").is_not_null())
        .select("pid", "tid", "corr", pl.col("launch_start").alias("start"), pl.col("launch_end").alias("end"),
                pl.col("launch_api").alias("api_name"), *([] if key is None else [key]))
    )
    calls = (calls.unique(["pid", "corr"], keep="first", maintain_order=True) if key is None
             else calls.filter(pl.col("_key").is_first_distinct())).sort("start", maintain_order=True)
    times = [acts["start"].min()]
    if calls.height:
        times.append(calls["start"].min())
    times += [x for x in steps["w_start"].to_list() if x is not None]
    t0 = int(min(t for t in times if t is not None)) if acts.height else 0

    # lanes: per GPU stream, per host thread and per host process's steps track
    acts = acts.with_columns(_run_lanes(acts, ["device", "stream"], "start", "end"))
    calls = calls.with_columns(_run_lanes(calls, ["pid", "tid"], "start", "end"))
    ranges = steps.filter(pl.col("w_start").is_not_null() & pl.col("tid").is_not_null()).sort("w_start")
    range_lane = {}
    for _, r in ranges.group_by("pid", maintain_order=True):
        range_lane.update(zip(r["step"].to_list(), lanes(r["w_start"].to_list(), r["w_end"].to_list())))

    ev: list[dict] = []

    def thread(pid: int, tid: int, name: str, order: int) -> None:
        ev.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "ts": 0, "args": {"name": name}})
        ev.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "ts": 0,
                   "args": {"sort_index": order}})

    # metadata: names and order of the tracks (each overlap lane right under its stream or thread)
    for d in sorted(set(acts["device"].drop_nulls().to_list())):
        pid = DEVICE_PID_BASE + d
        gpu = inv.trace.gpus.filter(pl.col("device") == d)
        label = f"GPU {d}" + (f" ({gpu['name'][0]})" if gpu.height and gpu["name"][0] else "")
        ev.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "ts": 0, "args": {"name": label}})
        ev.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "ts": 0,
                   "args": {"sort_index": 1000 + d}})
        tracks = acts.filter(pl.col("device") == d).select("stream", "_lane").unique().drop_nulls("stream")
        for i, (s, lane) in enumerate(sorted(tracks.iter_rows())):
            thread(pid, _lane_tid(s, lane), f"stream {s}" + (f" (overlap {lane})" if lane else ""), i)
    host = set(calls.select("pid", "tid", "_lane").unique().iter_rows())
    for pid in sorted({p for p, _, _ in host} | set(ranges["pid"].to_list())):
        ev.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "ts": 0,
                   "args": {"name": f"host pid {pid}"}})
        ev.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "ts": 0,
                   "args": {"sort_index": 0}})
    order = 0
    for pid, n in sorted({(p, range_lane[s]) for p, s in zip(ranges["pid"].to_list(), ranges["step"].to_list())}):
        thread(pid, _lane_tid(STEPS_TID, n), "steps" + (f" (overlap {n})" if n else ""), order)
        order += 1
    for pid, tid, lane in sorted(host):
        thread(pid, _lane_tid(tid, lane), f"host thread {tid} (launch calls)" + (f" (overlap {lane})" if lane else ""),
               order)
        order += 1
    # the step ranges, on their process's steps track (one per step: few)
    for r in ranges.iter_rows(named=True):
        ev.append({"ph": "X", "cat": "step", "name": f"step {r['step']}: {cut(r['name'], DOCUMENT)}", "pid": r["pid"],
                   "tid": _lane_tid(STEPS_TID, range_lane[r["step"]]), "ts": _ts(r["w_start"], t0),
                   "dur": (r["w_end"] - r["w_start"]) / 1000.0,
                   "args": {"step": r["step"], "device": r["device"], "delimiter": r["delimiter"],
                            "thread": r["tid"]}})
    yield small('{"traceEvents":[' + ",".join(json.dumps(e, separators=(",", ":")) for e in ev))
    first = not ev
    comma = small(",")

    # launch calls
    api_json = _json_text(calls, "api_name", null='"api call"')
    for off in range(0, calls.height, CHUNK_ROWS):
        part = calls.slice(off, CHUNK_ROWS)
        text = piece(part.select(pl.concat_str(
            _lit('{"ph":"X","cat":"launch","name":'), api_json, _lit(',"pid":'), _int_text(pl.col("pid")),
            _lit(',"tid":'), _int_text(_lane_tid_expr(pl.col("tid"), pl.col("_lane"))),
            _lit(',"ts":'), _ts_text("start", t0), _lit(',"dur":'), _us_text(pl.col("end") - pl.col("start")),
            _lit(',"args":{"correlation":'), _int_text(pl.col("corr")), _lit("}}")).str.join(",")))
        if text:
            if not first:
                yield comma
            yield text
            first = False

    # GPU activities, each followed by the flow from its launch call (s) to it (f)
    on = ["pid", "corr"] if key is None else ["_key"]
    src = calls.select(*on, _lane_tid_expr(pl.col("tid"), pl.col("_lane")).alias("_src_tid"),
                       pl.col("start").alias("_src_start"))
    # the join on the key columns alone, its new columns put beside the activities' own: a join
    # of the whole frame would copy every column of a million rows
    acts = acts.hstack(acts.select(*(on if key is None else [key])).join(src, on=on, how="left", maintain_order="left")
                       .select("_src_tid", "_src_start"))
    acts = acts.with_columns(
        pl.when(pl.col("_src_tid").is_not_null())
        .then(pl.col("_src_tid").is_not_null().cum_sum()).otherwise(None).alias("_flow"))
    name_json = _json_text(acts, "name", cut_to=DOCUMENT, null='"?"')
    dem_json = _json_text(acts, "demangled", cut_to=DOCUMENT)
    cls = pl.col("class").cast(pl.String)
    cat_json = pl.concat_str(_lit('"'), cls.fill_null("other"), _lit('"'))
    cls_json = pl.concat_str(_lit('"'), cls, _lit('"')).fill_null("null")
    gpid = _int_text(pl.col("device").fill_null(0).cast(pl.Int64) + DEVICE_PID_BASE)
    tid = _int_text(_lane_tid_expr(pl.col("stream"), pl.col("_lane")))
    ts = _ts_text("start", t0)
    # a kernel's args and a memop's, each null on the other's rows and left out by ignore_nulls:
    # a when/then would build both for every row
    kernel_args = pl.concat_str(
        pl.when(pl.col("is_kernel")).then(_lit(',"demangled":')), dem_json,
        _lit(',"grid":['), _int_text(pl.col("grid_x")), _lit(","), _int_text(pl.col("grid_y")), _lit(","),
        _int_text(pl.col("grid_z")), _lit('],"block":['), _int_text(pl.col("block_x")), _lit(","),
        _int_text(pl.col("block_y")), _lit(","), _int_text(pl.col("block_z")), _lit("]"))
    graph_arg = pl.concat_str(pl.when(pl.col("is_kernel")).then(_lit(',"graph_node_id":')),
                              pl.col("graph_node_id").cast(pl.String))
    memop_args = pl.concat_str(pl.when(~pl.col("is_kernel")).then(_lit(',"bytes":')), _int_text(pl.col("bytes")))
    x_event = pl.concat_str(
        _lit('{"ph":"X","cat":'), cat_json, _lit(',"name":'), name_json, _lit(',"pid":'), gpid,
        _lit(',"tid":'), tid, _lit(',"ts":'), ts, _lit(',"dur":'), _us_text(pl.col("end") - pl.col("start")),
        _lit(',"args":{"step":'), _int_text(pl.col("step")), _lit(',"correlation":'), _int_text(pl.col("corr")),
        _lit(',"class":'), cls_json, kernel_args, graph_arg, memop_args, _lit("}}"), ignore_nulls=True)
    flow_id = pl.col("_flow").cast(pl.String)  # null without a flow: the flow events are left out
    flow_events = pl.concat_str(
        _lit(',{"ph":"s","cat":"launch","name":"launch","id":'), flow_id, _lit(',"pid":'),
        _int_text(pl.col("pid")), _lit(',"tid":'), _int_text(pl.col("_src_tid")), _lit(',"ts":'),
        _ts_text("_src_start", t0), _lit('},{"ph":"f","bp":"e","cat":"launch","name":"launch","id":'),
        flow_id, _lit(',"pid":'), gpid, _lit(',"tid":'), tid, _lit(',"ts":'), ts, _lit("}"))
    # grid/block, when the trace was read without them: read from the export once, joined a
    # chunk at a time (a join of a million rows on three keys takes hundreds of MB)
    dims = None if all(c in acts.columns for c in DIMS) else inv.launch_config_rows(acts, narrow=False)
    for off in range(0, acts.height, CHUNK_ROWS):
        part = inv.with_launch_config(acts.slice(off, CHUNK_ROWS), dims)
        text = piece(part.select(pl.concat_str(x_event, flow_events, ignore_nulls=True).str.join(",")))
        if text:
            if not first:
                yield comma
            yield text
            first = False
    other = {"producer": "stepscope export", "trace": shown(inv.trace.path), "format": inv.trace.format,
             "steps": step_ids, "t0_ns": t0}
    yield small('],"displayTimeUnit":"ns","otherData":' + json.dumps(other, separators=(",", ":")) + "}")


# what the events are written from, besides grid/block (analysis/memory.EXPORT_ACT_COLUMNS keeps them)
EXPORT_COLUMNS = ("step", "device", "stream", "pid", "tid", "corr", "start", "end", "is_kernel", "name", "demangled",
                  "class", "graph_node_id", "bytes", "launch_start", "launch_end", "launch_api")


def _chosen_activities(inv: Inventory, sel: list[int]) -> pl.DataFrame:
    """The chosen steps' activities in start order (ties in (step, start) order), narrowed to
    what the events are written from. Without copying them where it can: the activities are
    sorted by (step, start), so every step's, on one device, is a slice already in start order."""
    cols = [c for c in (*EXPORT_COLUMNS, "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z")
            if c in inv.acts.columns]
    if set(sel) == set(inv.step_ids()):
        acts = inv.in_steps(*cols)
    else:
        acts = inv.acts.lazy().filter(pl.col("step").is_in(sel)).select(cols).collect()
    return acts if acts["start"].is_sorted() else acts.sort("start", maintain_order=True)


class PerfettoRenderer:
    """The Chrome-trace JSON for ui.perfetto.dev of a Result's selected steps (the pipeline's
    Renderer; its inventory must hold the per-event frames: library.analyze(..., events=True))."""

    def render(self, result) -> bytes:
        return b"".join(export_chunks(result.inventory, list(result.steps), as_bytes=True))


def export_document(inv: Inventory, step_ids: list[int]) -> dict:
    """The export as a dict (for notebooks and tests): export_chunks' document, parsed."""
    return json.loads("".join(export_chunks(inv, step_ids)))


def write_export(inv: Inventory, step_ids: list[int], path, gzipped: bool) -> None:
    """Stream the export to `path` (gzip with mtime 0 when `gzipped`, so one trace exported
    twice gives the same bytes), never holding the whole document."""
    with open(path, "wb") as raw:
        out = gzip.GzipFile(filename="", mode="wb", compresslevel=6, fileobj=raw, mtime=0) if gzipped else raw
        for c in export_chunks(inv, step_ids, as_bytes=True):
            out.write(c)
        if gzipped:
            out.close()
