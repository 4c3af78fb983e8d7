"""Which of a long run's API calls decide its engine loop's steps (steps.engine_windows), so that
a light read of the run (by_windows.py) holds those calls, not the run's: an eager run launches a
call per kernel, tens of millions in ten minutes.

engine_windows reads, of a process's calls: the launches of its marks (the input preparation's
and output's kernels, the device-to-host copies: `mark`), its graph captures and profiler starts
(its start-up's end: `mark`), and then, around each anchor (a launch of its preparation kernel),
only the launches and copies that can be the step's first call or bound a pause it measures:

- the step's first call: the first launch or copy after its last output and not after the anchor
  (after_i, t_i]; none there, and the step begins at the anchor, whatever lies beyond;
- a step with no output since the previous anchor begins after the longest pause between the two
  anchors [prev_i, t_i] (the previous anchor's own call is where the first pause starts); for the
  first step, after the floor, the pause starts at the last launch or copy at or before the
  floor: those calls of that start (`Ties`);
- the start-up's warm-up runs, each a leading iteration whose calls are read whole: the first
  LEAD_ITERATIONS iterations' host time, (floor, t_N]. A run whose warm-up reaches further is
  read again with every call (`lead_within` says whether it did).

Calls of one start are kept in the calls' order (`_pos`), so that engine_windows' order among
them is the whole read's. tests/test_windows.py holds the light read's steps to the whole one's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from stepscope.analysis.lazy_numpy import np
from stepscope.analysis.steps import API_FLAGS, OPEN_END, _engine_marks, engine_loop

# the leading iterations a light read holds whole: a start-up's warm-up runs are two in vLLM 0.26
# (the dummy run and the sampler's)
LEAD_ITERATIONS = 16


class Flags:
    """The flags of api_flags that choosing calls needs (launch, copy, graph capture, profiler
    start), for a chunk of calls at a time: each name decided once (`strings()`: the names
    learnt so far, id -> value frame)."""

    NEEDED = ("is_launch", "is_copy", "is_graph_capture", "is_prof_start")

    def __init__(self, strings):
        self.strings = strings
        self.having = {f: [] for f in self.NEEDED}
        self.seen: set = set()

    def __call__(self, calls: pl.DataFrame) -> pl.DataFrame:
        new = set(calls["name_id"].unique().drop_nulls().to_list()) - self.seen
        if new:
            s = self.strings().filter(pl.col("id").is_in(list(new)))
            names = dict(zip(s["id"].to_list(), s["value"].to_list()))
            for i in new:
                for f in self.NEEDED:
                    if API_FLAGS[f](names.get(i) or ""):
                        self.having[f].append(i)
            self.seen |= new
        return calls.with_columns(pl.col("name_id").is_in(self.having[f]).fill_null(False).alias(f)
                                  for f in self.NEEDED)


def mark_pids(light) -> set:
    """The processes of `light`'s marks: those whose engine loop its calls are read for."""
    return set(light.kernels["pid"].unique().to_list()) | set(light.memops["pid"].unique().to_list())


def mark_keys(light) -> dict:
    """pid -> the sorted correlation ids of its marks (the kernels and copies of `light`)."""
    parts = [light.kernels.select("pid", "corr"), light.memops.select("pid", "corr")]
    keys = pl.concat(parts).drop_nulls().unique()
    return {pid: np.sort(g["corr"].to_numpy()) for (pid,), g in keys.group_by(["pid"])}


def _member(values: np.ndarray, sorted_keys: np.ndarray) -> np.ndarray:
    i = np.searchsorted(sorted_keys, values)
    return (i < sorted_keys.size) & (sorted_keys[np.minimum(i, max(sorted_keys.size - 1, 0))] == values) \
        if sorted_keys.size else np.zeros(values.size, bool)


def is_mark(calls: pl.DataFrame, keys: dict) -> pl.Series:
    """Which of `calls` (api_flags') launched a mark, or capture a graph or start the profiler."""
    out = (calls["is_graph_capture"] | calls["is_prof_start"]).to_numpy().copy()
    pid, corr = calls["pid"].to_numpy(), calls["corr"].fill_null(-1).to_numpy()
    for p, k in keys.items():
        rows = np.flatnonzero(pid == p)
        if rows.size:
            out[rows] |= _member(corr[rows], k)
    return pl.Series(out)


@dataclass
class Spans:
    """Per process: the host time whose calls a light read keeps (closed integer intervals,
    merged: `lo`, `hi` sorted), its floor, whether its first step needs the calls at the floor
    (`ties`), and its anchors' count."""

    lo: dict = field(default_factory=dict)
    hi: dict = field(default_factory=dict)
    floor: dict = field(default_factory=dict)
    ties: set = field(default_factory=set)
    anchors: dict = field(default_factory=dict)


def spans(light, api: pl.DataFrame) -> Spans:
    """The Spans of `light` (its marks) and `api` (api_flags' of the calls is_mark kept)."""
    out = Spans()
    marks = _engine_marks(light, api, mark_pids(light))
    if marks is None or marks.is_empty():
        return out
    for (pid,), m in marks.group_by(["pid"], maintain_order=True):
        loop = engine_loop(m, api.filter(pl.col("pid") == pid))
        if loop is None:
            continue
        t, lonely = loop.t, loop.lonely()
        lo = [loop.after + 1, loop.prev[lonely]]
        hi = [t, t[lonely]]
        if loop.first_lonely:
            lo[1] = np.where(lonely == 0, loop.floor + 1, lo[1])
            out.ties.add(pid)
        lo.append([loop.floor + 1])
        hi.append([int(t[LEAD_ITERATIONS]) if t.size > LEAD_ITERATIONS else OPEN_END])
        lo, hi = np.concatenate(lo).astype(np.int64), np.concatenate(hi).astype(np.int64)
        ok = lo <= hi
        lo, hi = lo[ok], hi[ok]
        order = np.argsort(lo, kind="stable")
        lo, hi = lo[order], np.maximum.accumulate(hi[order])
        # merged: an interval that starts inside the one before joins it
        new = np.concatenate(([True], lo[1:] > hi[:-1]))
        starts = np.flatnonzero(new)
        out.lo[pid] = lo[starts]
        out.hi[pid] = np.maximum.reduceat(hi, starts) if starts.size else hi[:0]
        out.floor[pid] = loop.floor
        out.anchors[pid] = t.size
    return out


class Keeper:
    """scan_calls' `keep` of the second read: the marks' calls, and the calls that start in the
    spans; and aside (`ties`), per process whose first step needs them, its launches and copies
    of the latest start at or before its floor."""

    def __init__(self, s: Spans, keys: dict):
        self.s, self.keys = s, keys
        self.tie_start: dict = {}
        self.tie_rows: dict = {}

    def __call__(self, calls: pl.DataFrame) -> pl.Series:
        out = is_mark(calls, self.keys).to_numpy().copy()
        pid, start = calls["pid"].to_numpy(), calls["start"].to_numpy()
        work = (calls["is_launch"] | calls["is_copy"]).to_numpy()
        for p, lo in self.s.lo.items():
            rows = np.flatnonzero(pid == p)
            if not rows.size:
                continue
            st = start[rows]
            j = np.searchsorted(lo, st, side="right") - 1
            out[rows] |= (j >= 0) & (st <= self.s.hi[p][np.maximum(j, 0)])
            if p in self.s.ties:
                self._tie(p, calls, rows[work[rows] & (st <= self.s.floor[p])])
        return pl.Series(out)

    def _tie(self, p, calls: pl.DataFrame, rows: np.ndarray) -> None:
        if not rows.size:
            return
        mine = calls[rows]
        m = int(mine["start"].max())
        best = self.tie_start.get(p)
        if best is None or m > best:
            self.tie_start[p], self.tie_rows[p] = m, [mine.filter(pl.col("start") == m)]
        elif m == best:
            self.tie_rows[p].append(mine.filter(pl.col("start") == m))

    def calls(self, kept: pl.DataFrame) -> pl.DataFrame:
        """The calls kept with the ties, each once, in the calls' order, without `_pos`."""
        ties = [f for fs in self.tie_rows.values() for f in fs]
        every = pl.concat([kept, *(f.select(kept.columns) for f in ties)]) if ties else kept
        return every.unique("_pos", keep="first").sort("_pos").drop("_pos")


def lead_within(engine: pl.DataFrame, s: Spans) -> bool:
    """Whether every process's warm-up runs lay within the leading iterations its light read
    held whole (else it is read again with every call)."""
    n = dict(engine.group_by("pid").len().iter_rows()) if engine.height else {}
    for pid, anchors in s.anchors.items():
        if anchors > LEAD_ITERATIONS and anchors - n.get(pid, 0) >= LEAD_ITERATIONS:
            return False
    return True
