"""Chrome trace JSON of chosen steps, for ui.perfetto.dev (or chrome://tracing).

Layout:
  one process per GPU device ("GPU <d>", pid DEVICE_PID_BASE + d), one thread per stream;
      kernels and memops as complete ("X") events, `cat` = kernel class
  one process per host process (its OS pid), one thread per OS thread:
      the launch calls that launched the steps' GPU work, and the step range itself
  a flow arrow (ph "s" at the launch call → ph "f", bp "e", at the GPU activity, same id)

Timestamps are microseconds (the format's unit) relative to the first exported event, with
nanosecond precision kept in the fraction; `otherData.t0_ns` holds the trace time of zero.
"""

from __future__ import annotations

import json

import polars as pl

from stepscope.analysis.inventory import Inventory
from stepscope.paths import shown
from stepscope.render.names import DOCUMENT, cut

DEVICE_PID_BASE = 100_000_000  # above Linux's pid_max (2^22), so never a host pid


def _us(ns: int, t0: int) -> float:
    return (ns - t0) / 1000.0


def export_document(inv: Inventory, step_ids: list[int]) -> dict:
    sel = [int(i) for i in step_ids]
    acts = inv.acts.filter(pl.col("step").is_in(sel)).sort("start")
    steps = inv.steps.filter(pl.col("step").is_in(sel))
    calls = (
        acts.filter(pl.col("launch_start").is_not_null()).select("pid", "corr").unique()
        .join(inv.api.select("pid", "tid", "corr", "start", "end", "api_name"), on=["pid", "corr"])
        .unique(["pid", "corr"], keep="first").sort("start")
    )
    times = [acts["start"].min()]
    if calls.height:
        times.append(calls["start"].min())
    times += [x for x in steps["w_start"].to_list() if x is not None]
    t0 = int(min(t for t in times if t is not None)) if acts.height else 0

    ev: list[dict] = []
    # metadata: names and order of the tracks
    for d in sorted(set(acts["device"].drop_nulls().to_list())):
        pid = DEVICE_PID_BASE + d
        gpu = inv.trace.gpus.filter(pl.col("device") == d)
        label = f"GPU {d}" + (f" ({gpu['name'][0]})" if gpu.height and gpu["name"][0] else "")
        ev.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "ts": 0, "args": {"name": label}})
        ev.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "ts": 0,
                   "args": {"sort_index": 1000 + d}})
        for s in sorted(set(acts.filter(pl.col("device") == d)["stream"].drop_nulls().to_list())):
            ev.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": s, "ts": 0,
                       "args": {"name": f"stream {s}"}})
    host_threads = set(zip(calls["pid"].to_list(), calls["tid"].to_list()))
    host_threads |= {(p, t) for p, t in zip(steps["pid"].to_list(), steps["tid"].to_list()) if t is not None}
    for pid in sorted({p for p, _ in host_threads}):
        ev.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "ts": 0,
                   "args": {"name": f"host pid {pid}"}})
        ev.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "ts": 0,
                   "args": {"sort_index": 0}})
    for pid, tid in sorted(host_threads):
        ev.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "ts": 0,
                   "args": {"name": f"host thread {tid} (launch calls)"}})

    # the step ranges on their host thread
    for r in steps.iter_rows(named=True):
        if r["w_start"] is None or r["tid"] is None:
            continue
        ev.append({"ph": "X", "cat": "step", "name": f"step {r['step']}: {cut(r['name'], DOCUMENT)}", "pid": r["pid"],
                   "tid": r["tid"], "ts": _us(r["w_start"], t0), "dur": (r["w_end"] - r["w_start"]) / 1000.0,
                   "args": {"step": r["step"], "device": r["device"], "delimiter": r["delimiter"]}})
    # launch calls
    for r in calls.iter_rows(named=True):
        ev.append({"ph": "X", "cat": "launch", "name": r["api_name"] or "api call", "pid": r["pid"],
                   "tid": r["tid"], "ts": _us(r["start"], t0), "dur": (r["end"] - r["start"]) / 1000.0,
                   "args": {"correlation": r["corr"]}})
    call_at = {(p, c): (t, s) for p, c, t, s in zip(calls["pid"].to_list(), calls["corr"].to_list(),
                                                     calls["tid"].to_list(), calls["start"].to_list())}
    # GPU activities and their flows
    flow_id = 0
    for r in acts.iter_rows(named=True):
        pid = DEVICE_PID_BASE + (r["device"] or 0)
        ts = _us(r["start"], t0)
        args = {"step": r["step"], "correlation": r["corr"], "class": r["class"]}
        if r["is_kernel"]:
            args.update(demangled=cut(r["demangled"], DOCUMENT), grid=[r["grid_x"], r["grid_y"], r["grid_z"]],
                        block=[r["block_x"], r["block_y"], r["block_z"]])
            if r["graph_node_id"] is not None:
                args["graph_node_id"] = r["graph_node_id"]
        else:
            args["bytes"] = r["bytes"]
        ev.append({"ph": "X", "cat": r["class"] or "other", "name": cut(r["name"], DOCUMENT) or "?", "pid": pid,
                   "tid": r["stream"], "ts": ts, "dur": (r["end"] - r["start"]) / 1000.0, "args": args})
        src = call_at.get((r["pid"], r["corr"]))
        if src is not None:
            flow_id += 1
            ev.append({"ph": "s", "cat": "launch", "name": "launch", "id": flow_id, "pid": r["pid"],
                       "tid": src[0], "ts": _us(src[1], t0)})
            ev.append({"ph": "f", "bp": "e", "cat": "launch", "name": "launch", "id": flow_id, "pid": pid,
                       "tid": r["stream"], "ts": ts})
    return {
        "traceEvents": ev,
        "displayTimeUnit": "ns",
        "otherData": {
            "producer": "stepscope export", "trace": shown(inv.trace.path), "format": inv.trace.format,
            "steps": step_ids, "t0_ns": t0,
        },
    }


def dumps(doc: dict) -> str:
    return json.dumps(doc, separators=(",", ":"))
