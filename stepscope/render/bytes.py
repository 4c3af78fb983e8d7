"""The byte side on the terminal and as JSON: `budget`'s table and `cells show`'s ledger."""

from __future__ import annotations

import json


def budget_json(doc: dict) -> str:
    """`budget --json`: the document as it has always been printed (indent 1, str() for the rest)."""
    return json.dumps(doc, indent=1, default=str)


def render_budget(doc) -> None:
    """`budget` on the terminal: the per-class and per-op table, how the kernels joined, and the
    kernels without a cell."""
    from rich.console import Console
    from rich.table import Table

    from stepscope.render.names import term
    from stepscope.render.units import MISSING, nbytes, us

    con = Console()
    for r in doc.get("verdict_block") or ():  # render/headline.py's rows, as analyze opens with them
        con.print(f"[bold]{term(r['label'])}:[/] {term(r['text'], 2000)}")
    st = doc["step"]
    t = Table(title=f"HBM byte budget — step {doc['step_index']} ({term(st['phase'])}, batch "
              f"{st['batch']}, context {st['context']}, {term(doc['model'])}) on {term(doc['gpu'] or '?')}")
    for c in ("class", "op", "calls", "bytes/call", "measured", "minimum", "ampl.",
              "removable", "floor", "kernel time"):
        t.add_column(c, justify="left" if c in ("class", "op") else "right")
    for r in doc["rows"]:
        amp = r["amplification"]
        t.add_row(term(r["class"]), term(r["op"]) if r["op"] else "[dim](no cell)[/]", str(r["calls"]),
                  nbytes(r["measured_bytes_per_call"]), nbytes(r["measured_bytes"]), nbytes(r["min_bytes"]),
                  f"{amp:.2f}" if amp is not None else MISSING, nbytes(r["removable_bytes"]),
                  us(r["floor_ns"]), us(r["time_ns"]))
    t.add_row("[bold]step[/]", "", str(st["calls"]), "", nbytes(st["measured_bytes"]),
              nbytes(st["min_bytes"]),
              f"{st['amplification']:.2f}" if st["amplification"] else MISSING,
              nbytes(st["removable_bytes"]),
              us(st["floor_ns"]), us(st["time_ns"]))
    con.print(t)
    ranked = [c for c in doc["classes"] if c["removable_bytes"] is not None]
    if ranked:
        con.print("classes by removable bytes: " + ", ".join(
            f"{term(c['class'])} {nbytes(c['removable_bytes'])}" for c in ranked[:5]))
    j = st["joined"]
    if j.get("order"):
        o = st["order"]
        con.print(f"joined by launch order: {j['order']} of the step's {o['step_kernels']} kernels to the "
                  f"{o['profiled_kernels']} profiled kernels of the step's own ncu run, checked by name; "
                  f"{j.get('trace', 0)} memops by their trace bytes")
    else:
        con.print(f"joined: {j['launch']} calls by kernel+grid+block, {j['name']} by name only, "
                  f"{j['op']} by op, {j.get('trace', 0)} memops by their trace bytes; "
                  f"{len(st['unjoined_kernels'])} kernel(s) without a cell")
    if st.get("unjoined_min_bytes"):
        ops = f" (ops no kernel joined: {', '.join(st['unjoined_ops'])})" if st.get("unjoined_ops") else ""
        con.print(f"minimum over the joined kernels: {nbytes(st['min_bytes'])}; the step's calls no kernel "
                  f"joined{ops} add {nbytes(st['unjoined_min_bytes'])} to the step's {nbytes(st['plan_min_bytes'])}")
    below = [r for r in doc["rows"] if r.get("note") is not None]
    if below:
        con.print("below their minimum (DRAM bytes only: inputs the previous kernel left in L2 were read "
                  "from L2, outputs still in the write-back L2 at the kernel's end are not counted; ncu's "
                  "hit rate exceeds 100 % on tiny kernels and is shown as 100): "
                  + ", ".join(f"{r['op'] or r['class']} ({r['note'].split(': ', 1)[-1]})"
                              for r in below))
    for u in st["unjoined_kernels"][:15]:
        con.print(f"  [yellow]no cell[/] {term(u['class']):<16} {u['count']:>4}× {term(u['name'])}"
                  + (f" [dim]({term(u['reason'])})[/]" if u.get("reason") else ""))
    for w in doc.get("warnings", []):
        con.print(f"[yellow]warning:[/] {term(w, 2000)}")


def cells_document(led, gpus, peak) -> dict:
    """`cells show --json`: the ledger's rows with the GPUs and their peak bandwidth."""
    keep = ["cell", "op", "proj", "tokens", "launch", "kernel", "grid", "block",
            "dram_read_bytes", "dram_write_bytes", "dram_bytes", "duration_ns", "l2_hit_pct",
            "achieved_bps", "cell_min_bytes", "amplification", "matched", "error", "gpu"]
    rows = led.select([c for c in keep if c in led.columns]).to_dicts()
    return {"gpus": gpus, "peak_hbm_bps": peak, "cells": rows}


def cells_json(led, gpus, peak) -> str:
    """`cells show --json`."""
    return json.dumps(cells_document(led, gpus, peak), indent=1)


def render_cells(led, gpus, peak) -> None:
    """`cells show` on the terminal: the ledger of each profiled launch."""
    from rich.console import Console
    from rich.table import Table

    from stepscope.render.names import term
    from stepscope.render.units import MISSING, nbytes, us

    con = Console()
    t = Table(title=f"byte cells — {term(', '.join(gpus)) or 'GPU unknown'}"
              + (f" (peak {peak / 1e12:.2f} TB/s)" if peak else ""))
    for col, just in (("cell", "left"), ("#", "right"), ("kernel", "left"), ("grid", "left"),
                      ("read", "right"), ("write", "right"), ("min (cell)", "right"),
                      ("ampl.", "right"), ("L2 hit", "right"), ("time", "right"),
                      ("GB/s", "right")):
        t.add_column(col, justify=just, overflow="fold")
    for r in led.iter_rows(named=True):
        if r.get("error"):
            t.add_row(term(r.get("cell") or "?"), "", f"[red]error: {term(r['error'], 2000)}[/]", "", "", "", "",
                      "", "", "", "")
            continue
        kern = term((r.get("kernel") or "")[:60])
        if r.get("matched") is False:
            kern = f"[dim]{kern} (not the op's regex)[/]"
        amp = r.get("amplification")
        t.add_row(
            term(r.get("cell") or ""), "" if r.get("launch") is None else str(r["launch"]), kern,
            term(r.get("grid") or ""), nbytes(r.get("dram_read_bytes")),
            nbytes(r.get("dram_write_bytes")), nbytes(r.get("cell_min_bytes")),
            f"{amp:.2f}" if amp is not None and r.get("launch") in (0, None) else "",
            f"{r['l2_hit_pct']:.1f}%" if r.get("l2_hit_pct") is not None else MISSING,
            us(r.get("duration_ns")),
            f"{r['achieved_bps'] / 1e9:.0f}" if r.get("achieved_bps") is not None else MISSING,
        )
    con.print(t)
