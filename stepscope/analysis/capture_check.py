"""The capture's own defects (docs/SERVING.md, "What stepscope says about the capture"): what a
trace lacks before any of its steps is read. A figure of a step can only be as complete as the
capture it comes from, so these come first, in this order:

  truncated      the engine's CUDA records end long before the session: its last seconds are lost
  startup_only   a vLLM engine process whose trace holds its start-up only: no engine step
  untraced       no process of the trace did GPU work (the engine process was not traced)
  graph_level    CUDA graphs traced as whole replays: their kernels have no rows
  no_nvtx        no NVTX range delimits a step: the steps come from the kernels alone

Pure functions over the trace model, the flagged API calls and the steps (one row per defect,
DEFECT_SCHEMA); the session's length is read beside the trace (ingest/session.py).
"""

from __future__ import annotations

import polars as pl

from stepscope.analysis.lazy_numpy import np
from stepscope.analysis.startup import COMPILED  # Inductor's kernels
from stepscope.analysis.steps import COMPILE_PAUSE_NS  # a host pause this long is compilation

DEFECT_SCHEMA = {"kind": pl.String, "pid": pl.Int64, "text": pl.String, "remedy": pl.String,
                 "records_end_ns": pl.Int64, "session_end_ns": pl.Int64, "missing_ns": pl.Int64}
KINDS = ("clock", "truncated", "startup_only", "untraced", "graph_level", "no_nvtx")

# The engine's records end this long before the session (and this share of it) at least: a
# clean exit leaves a few seconds of teardown (2-5 s on the H200 captures of fixtures/)
TRUNCATED_MIN_NS = 10_000_000_000
TRUNCATED_SHARE = 0.1
# NVTX records outliving the CUDA records by this much: the process ran on, its CUDA buffers lost
NVTX_BEYOND_NS = 1_000_000_000

REMEDY_RECORDS = ("capture the traffic with vLLM's profiler hooks (start the server with --profiler-config "
                  "'{\"profiler\": \"cuda\"}', POST /start_profile before the requests and /stop_profile after) "
                  "under nsys profile --capture-range=cudaProfilerApi --capture-range-end=stop, or keep a plain "
                  "capture's records with nsys profile --cuda-flush-interval=1000 (docs/SERVING.md)")
REMEDY_TRAFFIC = ("send the requests while nsys records, and stop the server only after they are done "
                  "(docs/SERVING.md)")
REMEDY_UNTRACED = ("trace the engine process: nsys profile follows the processes the command starts "
                   "(keep --trace-fork-before-exec=true for a forking engine), and -t cuda must be on")
REMEDY_GRAPH = "capture with nsys profile --cuda-graph-trace=node"
REMEDY_NVTX = ("capture with -t cuda,nvtx and vLLM's ranges: its profiler hooks (execute_context step ranges) "
               "or VLLM_NVTX_SCOPES_FOR_PROFILING=1 (scheduler ranges)")
REMEDY_RANGES = "capture with -t cuda,nvtx and an NVTX range around each step (--step-regex names yours)"
# A kernel cannot start before the call that launched it began: one that does, by more than this,
# says the GPU's and the host's records are on different clocks (a report merged with an offset, a
# damaged export); at this share of the kernels or more the steps cannot be trusted and nothing is
# analyzed (the `clock` defect refuses), below it the defect is said and the analysis goes on
CLOCK_SLACK_NS = 1_000_000
# ... or starts this long after it: a queue holds a launch for milliseconds to seconds (a JIT
# compile, a stream waiting on an event), never ten minutes
CLOCK_LATE_NS = 600_000_000_000
CLOCK_REFUSE_SHARE = 0.01
REMEDY_CLOCK = ("export the report again with the nsys that recorded it (nsys export --type sqlite), and do not "
                "merge or edit the tables of an export by hand")
# the reader's warning that the graph_level defect stands for (ingest/nsys_sqlite.py)
GRAPH_LEVEL_WARNING = "per-kernel inventory unavailable for "


def s1(ns: int) -> str:
    """Seconds with one decimal: the scale of a session."""
    return f"{ns / 1e9:.1f} s"


def capture_defects(trace, api: pl.DataFrame, steps: pl.DataFrame, session_end_ns: int | None,
                    vllm_pids: set[int], without_steps: set[int]) -> pl.DataFrame:
    """The defects of a capture, DEFECT_SCHEMA, in KINDS order. `api`: the flagged calls
    (steps.api_flags); `steps`: the segmentation's (pid, delimiter); `session_end_ns`: where
    the session ends on the events' clock (None: not known); `vllm_pids`: the vLLM engine
    processes; `without_steps`: those of them with no engine step."""
    return defect_frame(record_defects(trace, api, session_end_ns, vllm_pids, without_steps)
                        + step_defects(trace, steps, vllm_pids))


def record_defects(trace, api: pl.DataFrame, session_end_ns: int | None, vllm_pids: set[int],
                   without_steps: set[int]) -> list[dict]:
    """The defects of what was recorded (truncated, startup_only, untraced, graph_level): read
    from the event frames, before an analysis lets them go."""
    rows: list[dict] = []
    truncated = _truncated(trace, api, session_end_ns, vllm_pids)
    rows += truncated
    lost = {r["pid"] for r in truncated}
    rows += [_startup_only(trace, api, pid, pid in lost, session_end_ns) for pid in sorted(without_steps)]
    if trace.kernels.is_empty() and trace.memops.is_empty():
        rows.append(_row("untraced", None, "no process of the trace did GPU work: the engine process was not "
                         "traced", REMEDY_UNTRACED))
    if trace.graph_level_launches:
        n = trace.graph_level_launches
        rows.append(_row("graph_level", None,
                         f"CUDA graphs were traced as whole replays (nsys's default --cuda-graph-trace=graph): each "
                         f"of the {n:,} graph launches is one GPU row (class cuda_graph), so its time counts but the "
                         "kernels inside it, and their classes, are not in the trace", REMEDY_GRAPH))
    return rows


def step_defects(trace, steps: pl.DataFrame, vllm_pids: set[int]) -> list[dict]:
    """The defects of how the steps were found (no_nvtx)."""
    nvtx = _no_nvtx(trace, steps, vllm_pids)
    return [nvtx] if nvtx is not None else []


def defect_frame(rows: list[dict]) -> pl.DataFrame:
    """DEFECT_SCHEMA rows in KINDS order (a stable sort: per kind as found)."""
    rows = [{k: r[k] for k in DEFECT_SCHEMA} for r in sorted(rows, key=lambda r: KINDS.index(r["kind"]))]
    return pl.DataFrame(rows, schema=DEFECT_SCHEMA) if rows else pl.DataFrame(schema=DEFECT_SCHEMA)


def _row(kind: str, pid: int | None, text: str, remedy: str, end=None, session=None, missing=None) -> dict:
    return {"kind": kind, "pid": pid, "text": text, "remedy": remedy, "records_end_ns": end,
            "session_end_ns": session, "missing_ns": missing}


def clock_defect(acts: pl.DataFrame, session_end_ns: int | None) -> dict | None:
    """Kernels that start before the call that launched them (by more than CLOCK_SLACK_NS), or
    CLOCK_LATE_NS or more after it: the GPU's records are not on the host's clock. (Not the
    session's end: some exports' events lie beyond their ANALYSIS_DETAILS duration.) `acts`:
    steps.activities', each kernel beside its launching call's start."""
    # two columns of the kernels, reduced as they are read: a filtered copy of the whole frame
    # would be every activity column once more
    k = acts.lazy().filter(pl.col("is_kernel")).select("start", "launch_start")
    launched = pl.col("launch_start").is_not_null()
    early, late = pl.col("launch_start") - pl.col("start"), pl.col("start") - pl.col("launch_start")
    d = k.select(n=pl.len(), n_early=(launched & (early > CLOCK_SLACK_NS)).sum(), by_early=early.filter(launched).max(),
                 n_late=(launched & (late >= CLOCK_LATE_NS)).sum(), by_late=late.filter(launched).max()
                 ).collect().row(0, named=True)
    n = d.pop("n")
    return clock_from_counts(n, d, session_end_ns)


def clock_from_counts(n: int, d: dict, session_end_ns: int | None) -> dict | None:
    """clock_defect's row from its counts over `n` kernels (n_early, by_early, n_late, by_late):
    also what an analysis by windows adds up (analysis/windows.py)."""
    if not n:
        return None
    j = {k_: (v or 0) for k_, v in d.items()}
    if not j["n_early"] and not j["n_late"]:
        return None
    parts = []
    if j["n_early"]:
        parts.append(f"{j['n_early']:,} of its {n:,} kernels start before the call that launched them, by up to "
                     f"{s1(j['by_early'])}")
    if j["n_late"]:
        parts.append(f"{j['n_late']:,} of its {n:,} kernels start {s1(CLOCK_LATE_NS)} or more after the call that "
                     f"launched them, up to {s1(j['by_late'])}")
    share = max(j["n_early"], j["n_late"]) / n
    text = ("the GPU's records are not on the host's clock: " + "; ".join(parts)
            + ("" if share < CLOCK_REFUSE_SHARE else
               ": the steps, gaps and floors would be measured across two clocks"))
    row = _row("clock", None, text, REMEDY_CLOCK, session=session_end_ns)
    row["refuse"] = share >= CLOCK_REFUSE_SHARE
    return row


def refusal(path, defect: dict) -> str | None:
    """The one line that refuses a capture when `defect` leaves nothing to analyze, else None."""
    return f"{path}: {defect['text']}; to fix: {defect['remedy']}" if defect.get("refuse") else None


def _records_end(trace, api: pl.DataFrame) -> pl.DataFrame:
    """pid, the end of its last CUDA record (API call, kernel or memop)."""
    # per frame first: a million-row frame is reduced to one row per process, never copied
    parts = [f.lazy().group_by("pid").agg(pl.col("end").max()).select(pl.col("pid").cast(pl.Int64),
                                                                     pl.col("end").cast(pl.Int64)).collect()
             for f in (api, trace.kernels, trace.memops) if f.height]
    if not parts:
        return pl.DataFrame(schema={"pid": pl.Int64, "end": pl.Int64})
    return pl.concat(parts).group_by("pid").agg(pl.col("end").max()).sort("pid")


def _truncated(trace, api: pl.DataFrame, session_end_ns: int | None, vllm_pids: set[int]) -> list[dict]:
    """A process with GPU work whose CUDA records end long before the session does, when it is a
    vLLM engine (its shutdown on SIGINT ends it before nsys saves its buffers) or its NVTX
    records outlive its CUDA records (it ran on: they were lost)."""
    if session_end_ns is None:
        return []
    gpu = set(trace.kernels["pid"].unique().to_list()) | set(trace.memops["pid"].unique().to_list())
    ends = _records_end(trace, api).filter(pl.col("pid").is_in(list(gpu)))
    nvtx_end = dict(trace.nvtx.group_by("pid").agg(pl.col("end").max()).iter_rows()) if trace.nvtx.height else {}
    floor = max(TRUNCATED_MIN_NS, int(TRUNCATED_SHARE * session_end_ns))
    out = []
    for pid, end in ends.iter_rows():
        missing = session_end_ns - end
        if missing < floor:
            continue
        beyond = nvtx_end.get(pid)
        ran_on = beyond is not None and beyond > end + NVTX_BEYOND_NS
        if pid not in vllm_pids and not ran_on:
            continue  # a process that may just have finished its GPU work early
        who = f"the engine (pid {pid})" if pid in vllm_pids else f"process {pid}"
        why = (f"its NVTX ranges go on to {s1(beyond)}, so the process ran on and its CUDA records were lost: "
               "it was ended before nsys saved its buffers" if ran_on else
               "the engine process was ended before nsys saved its buffers (vLLM's shutdown on SIGINT ends "
               "the engine core)")
        out.append(_row("truncated", pid,
                        f"{who}'s CUDA records end at {s1(end)}, {s1(missing)} before the session ({s1(session_end_ns)}): "
                        f"{why}; its last {s1(missing)} are missing", REMEDY_RECORDS, end, session_end_ns, missing))
    return out


def _startup_only(trace, api: pl.DataFrame, pid: int, lost: bool, session_end_ns: int | None = None) -> dict:
    """A vLLM engine process with no engine step: what its trace holds instead."""
    k = trace.kernels.filter(pl.col("pid") == pid)
    calls = api.filter(pl.col("pid") == pid)
    names = trace.strings.filter(pl.col("id").is_in(k["short_id"].unique().implode()))
    compiled_ids = names.filter(pl.col("value").str.contains(COMPILED))["id"]
    compiled = int(k["short_id"].is_in(compiled_ids.implode()).sum())
    capture = calls.filter(pl.col("is_graph_capture") & pl.col("api_name").cast(pl.String).str.contains("EndCapture"))
    work = calls.filter(pl.col("is_launch") | pl.col("is_copy")).sort("start")
    pauses = 0
    if work.height > 1:
        st, en = work["start"].to_numpy(), np.maximum.accumulate(work["end"].to_numpy())
        pauses = int((st[1:] - en[:-1] >= COMPILE_PAUSE_NS).sum())
    syncs = int(calls["api_name"].cast(pl.String).str.starts_with("cudaDeviceSynchronize").sum())
    what = []
    if compiled:
        what.append(f"torch.compile: {compiled:,} Inductor kernels")
    if pauses:
        what.append(f"{pauses} host pauses of 0.5 s or more (compilation)")
    if capture.height:
        what.append(f"CUDA-graph capture: {capture.height:,} graphs")
    if syncs:
        what.append(f"warm-up runs: {syncs:,} whole-device synchronizations")
    begin = min(x for x in (k["start"].min(), calls["start"].min()) if x is not None) if k.height or calls.height else 0
    end = max(x for x in (k["end"].max(), calls["end"].max()) if x is not None) if k.height or calls.height else 0
    held = f" ({'; '.join(what)})" if what else ""
    tail = ("the traffic after it is missing (its records were cut short)" if lost else
            "no request reached the engine while nsys recorded, or vLLM's engine loop was not recognized")
    if not lost and session_end_ns is not None and session_end_ns > end:
        tail += f" (its CUDA records end {s1(session_end_ns - end)} before the session, at {s1(session_end_ns)})"
    return _row("startup_only", pid,
                f"the engine (pid {pid}) ran no engine step in the trace: its {k.height:,} kernels from "
                f"{s1(begin)} to {s1(end)} are its start-up only{held}; {tail}",
                REMEDY_RECORDS if lost else REMEDY_TRAFFIC, end)


# how the steps were cut, by delimiter (docs/DEFINITIONS.md, "A step and its kernels")
CUT_BY = {"engine": "vLLM's engine loop (delimiter engine)", "period": "the repeat period of the kernels (delimiter period)",
          "sync": "host synchronizations (delimiter sync)", "capture": "the capture range (delimiter capture)",
          "graph": "CUDA-graph replays (delimiter graph)", "trace": "nothing: each process is one step (delimiter trace)"}


def _no_nvtx(trace, steps: pl.DataFrame, vllm_pids: set[int]) -> dict | None:
    """No NVTX at all, or a vLLM engine whose steps none of vLLM's ranges delimit (nsys exports
    only: a PyTorch-profiler trace has no NVTX to ask for)."""
    if not str(trace.format).startswith("nsys"):
        return None
    by_range = steps.filter(pl.col("delimiter").is_in(["nvtx", "schedule"])) if steps.height else steps
    cut = ", ".join(CUT_BY.get(d, d) for d in steps["delimiter"].unique(maintain_order=True).to_list()) \
        if steps.height else ""
    how = f": its steps were cut by {cut}" if cut else ""
    if trace.nvtx.is_empty():
        return _row("no_nvtx", None, f"the trace has no NVTX range{how}", REMEDY_NVTX if vllm_pids else REMEDY_RANGES)
    ranged = set(by_range["pid"].unique().to_list()) if by_range.height else set()
    bare = sorted(p for p in vllm_pids if p not in ranged)
    if not bare:
        return None
    who = ", ".join(str(p) for p in bare)
    return _row("no_nvtx", None, f"none of vLLM's NVTX ranges in the engine (pid {who}){how}", REMEDY_NVTX)


def beside_defects(defects: pl.DataFrame, warnings: list) -> list:
    """`warnings` but those a defect stands for (shown once, as the defect): the reader's
    graph-level sentence when the graph-level defect is there."""
    if defects.is_empty() or not (defects["kind"] == "graph_level").any():
        return list(warnings)
    return [w for w in warnings if not (isinstance(w, str) and w.startswith(GRAPH_LEVEL_WARNING))]


def no_step_line(path, defects: pl.DataFrame) -> str:
    """The one line of a trace in which no engine step can be found: what it holds, and why."""
    why = [r["text"] for r in defects.iter_rows(named=True) if r["kind"] in ("truncated", "startup_only", "untraced")]
    remedies = list(dict.fromkeys(r["remedy"] for r in defects.iter_rows(named=True)
                                  if r["kind"] in ("truncated", "startup_only", "untraced")))
    return f"{path}: no engine step found: {'; '.join(why)}. To fix: {'; '.join(remedies)}"


def untraced_line(path, processes: list[tuple[int, str | None, int]]) -> str:
    """The one line of an export without GPU work: `processes` (pid, name, CUDA calls) are the
    processes that made CUDA calls (none: none did)."""
    if processes:
        who = ", ".join(f"pid {p} ({n or '?'}, {c:,} CUDA calls)" for p, n, c in processes[:4])
        held = f"only process(es) that ran no kernel made CUDA calls: {who}"
    else:
        held = "no process made a CUDA call"
    return (f"{path}: no kernels recorded — was `--trace=cuda` on? The engine process was not traced ({held}): "
            f"{REMEDY_UNTRACED}, e.g. nsys profile --trace=cuda,nvtx")
