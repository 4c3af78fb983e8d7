"""The exporter as it was before it was vectorized (one dict per event, in Python loops):
the oracle the vectorized export is compared with, event by event (test_export_perfetto.py).
Kept verbatim from stepscope/render/perfetto.py at 9390779, but for its name."""

from __future__ import annotations

import polars as pl

from stepscope.analysis.inventory import Inventory
from stepscope.paths import shown
from stepscope.render.names import DOCUMENT, cut
from stepscope.render.perfetto import DEVICE_PID_BASE, STEPS_TID, _lane_tid, _ts, lanes


def reference_export_document(inv: Inventory, step_ids: list[int]) -> dict:
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

    # lanes: per GPU stream, per host thread and per host process's steps track
    acts = acts.with_columns(pl.lit(0).alias("_lane"))
    if acts.height:
        parts = []
        for _, a in acts.group_by("device", "stream", maintain_order=True):
            parts.append(a.with_columns(pl.Series("_lane", lanes(a["start"].to_list(), a["end"].to_list()))))
        acts = pl.concat(parts).sort("start", maintain_order=True)
    if calls.height:
        parts = []
        for _, c in calls.group_by("pid", "tid", maintain_order=True):
            parts.append(c.with_columns(pl.Series("_lane", lanes(c["start"].to_list(), c["end"].to_list()))))
        calls = pl.concat(parts).sort("start", maintain_order=True)
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
    host = set(zip(calls["pid"].to_list(), calls["tid"].to_list(), calls["_lane"].to_list()))
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

    # the step ranges, on their process's steps track
    for r in ranges.iter_rows(named=True):
        ev.append({"ph": "X", "cat": "step", "name": f"step {r['step']}: {cut(r['name'], DOCUMENT)}", "pid": r["pid"],
                   "tid": _lane_tid(STEPS_TID, range_lane[r["step"]]), "ts": _ts(r["w_start"], t0),
                   "dur": (r["w_end"] - r["w_start"]) / 1000.0,
                   "args": {"step": r["step"], "device": r["device"], "delimiter": r["delimiter"],
                            "thread": r["tid"]}})
    # launch calls
    for r in calls.iter_rows(named=True):
        ev.append({"ph": "X", "cat": "launch", "name": r["api_name"] or "api call", "pid": r["pid"],
                   "tid": _lane_tid(r["tid"], r["_lane"]), "ts": _ts(r["start"], t0),
                   "dur": (r["end"] - r["start"]) / 1000.0, "args": {"correlation": r["corr"]}})
    call_at = {(p, c): (_lane_tid(t, lane), s) for p, c, t, lane, s in zip(
        calls["pid"].to_list(), calls["corr"].to_list(), calls["tid"].to_list(), calls["_lane"].to_list(),
        calls["start"].to_list())}
    # GPU activities and their flows
    flow_id = 0
    for r in acts.iter_rows(named=True):
        pid = DEVICE_PID_BASE + (r["device"] or 0)
        tid = _lane_tid(r["stream"], r["_lane"])
        ts = _ts(r["start"], t0)
        args = {"step": r["step"], "correlation": r["corr"], "class": r["class"]}
        if r["is_kernel"]:
            args.update(demangled=cut(r["demangled"], DOCUMENT), grid=[r["grid_x"], r["grid_y"], r["grid_z"]],
                        block=[r["block_x"], r["block_y"], r["block_z"]])
            if r["graph_node_id"] is not None:
                args["graph_node_id"] = r["graph_node_id"]
        else:
            args["bytes"] = r["bytes"]
        ev.append({"ph": "X", "cat": r["class"] or "other", "name": cut(r["name"], DOCUMENT) or "?", "pid": pid,
                   "tid": tid, "ts": ts, "dur": (r["end"] - r["start"]) / 1000.0, "args": args})
        src = call_at.get((r["pid"], r["corr"]))
        if src is not None:
            flow_id += 1
            ev.append({"ph": "s", "cat": "launch", "name": "launch", "id": flow_id, "pid": r["pid"],
                       "tid": src[0], "ts": _ts(src[1], t0)})
            ev.append({"ph": "f", "bp": "e", "cat": "launch", "name": "launch", "id": flow_id, "pid": pid,
                       "tid": tid, "ts": ts})
    return {
        "traceEvents": ev,
        "displayTimeUnit": "ns",
        "otherData": {
            "producer": "stepscope export", "trace": shown(inv.trace.path), "format": inv.trace.format,
            "steps": step_ids, "t0_ns": t0,
        },
    }

