"""The stable JSON document of `stepscope analyze --json` (schema in the README).

The document is written as text by polars (stepscope/jsontext.py): a million-kernel trace's
per-step kernel lists, gaps and histograms are encoded column-wise and joined, never held as
Python objects. Small documents are re-indented for people; big ones stay compact.
"""

from __future__ import annotations

import json

import polars as pl

from stepscope import jsontext
from stepscope.analysis.inventory import Inventory
from stepscope.paths import shown
from stepscope.render.sections import sections_text

STEP_FIELDS = (
    "step_time_ns", "n_kernels", "kernel_time_sum_ns", "gpu_busy_ns", "gpu_span_ns", "idle_ns",
    "n_launch_calls", "launch_call_ns", "layers", "kernels_per_layer",
)
INDENT_MAX_STEPS = 64  # above this many steps the document is written compact


def trace_dict(inv: Inventory) -> dict:
    t = inv.trace
    return {"path": shown(t.path), "nsys_version": t.nsys_version, "schema_version": t.schema_version}


def gpus_list(inv: Inventory) -> list[dict]:
    return inv.trace.gpus.to_dicts()


def steps_text(inv: Inventory, ids: list[int], diag=None) -> list[str]:
    """One JSON object per selected step, as text; `diag` (a Diagnosis) adds the gaps, launch
    and floors sections."""
    return _steps_frame(inv, ids, diag).to_series().to_list()


def _steps_joined(inv: Inventory, ids: list[int], diag=None, before: str = "", after: str = "",
                  texts: pl.DataFrame | None = None) -> bytes:
    """steps_text's objects joined with commas between `before` and `after`, as UTF-8 taken from
    polars in one piece: a Python string per step, joined and encoded again, costs more than
    making them (a step's text holds a character beyond Latin-1, so every copy of 18 MB is one of
    36 MB, widened), and each copy of the whole document is held beside the last."""
    return jsontext.comma_joined(_steps_frame(inv, ids, diag, texts).to_series(), before, after)


def inventory_texts(inv: Inventory, ids: list[int] | None = None) -> pl.DataFrame:
    """(step, text): the part of each step's object that the inventory alone decides (its
    figures, phase evidence, classes, kernels, framework), open for the diagnosis' sections. A
    pure function of the inventory's frames: a kept analysis keeps it too (library.step_texts)."""
    sel = inv.step_ids() if ids is None else list(ids)
    steps = inv.steps.filter(pl.col("step").is_in(sel)).rename({"step": "index"})
    head = steps.select(pl.col("index").alias("step"), jsontext.open_records(
        steps, ["index", "pid", "device", "delimiter", "name", "phase", *STEP_FIELDS]).alias("head"))
    classes = jsontext.members(inv.classes.filter(pl.col("step").is_in(sel)), "step", "class",
                               ["count", "time_ns"], "classes")
    kernels = _kernel_arrays(inv.kernels.filter(pl.col("step").is_in(sel)))
    t = head.join(classes, on="step", how="left").join(kernels, on="step", how="left")
    t = t.join(_phase_evidence(steps), on="step", how="left").join(_framework(inv, sel), on="step", how="left")
    return t.sort("step").select("step", pl.concat_str(
        pl.col("head"), pl.col("phase_evidence").fill_null(""), pl.lit(',"classes":'), pl.col("classes").fill_null("{}"),
        pl.lit(',"kernels":'), pl.col("kernels").fill_null("[]"), pl.col("framework").fill_null("")).alias("text"))


def _steps_frame(inv: Inventory, ids: list[int], diag=None, texts: pl.DataFrame | None = None,
                 sections: pl.DataFrame | None = None) -> pl.DataFrame:
    """One column of steps_text's objects, in step order. `texts`: inventory_texts of every step,
    when already at hand; `sections`: sections_text(diag), likewise."""
    sel = list(ids)
    t = inventory_texts(inv, sel) if texts is None else texts.filter(pl.col("step").is_in(sel))
    parts = [pl.col("text")]
    if diag is not None:
        sections = sections_text(diag) if sections is None else sections
        t = t.join(sections, on="step", how="left")
        parts += [pl.lit(',"gaps":'), pl.col("gaps"), pl.lit(',"launch":'), pl.col("launch"),
                  pl.lit(',"floors":'), pl.col("floors")]
        if "tp" in sections.columns:  # multi-rank traces only: single-GPU documents keep their form
            parts += [pl.lit(',"tp":'), pl.col("tp").fill_null("null")]
        if "untraced" in sections.columns:
            parts += [pl.lit(',"untraced_step_time_ns":'),
                      pl.col("untraced_step_time_ns").cast(pl.String).fill_null("null"),
                      pl.lit(',"untraced":'), pl.col("untraced").fill_null("null")]
        if "engine" in sections.columns:  # vLLM traces only
            parts += [pl.lit(',"engine":'), pl.col("engine").fill_null("null")]
    return t.sort("step").select(pl.concat_str(*parts, pl.lit("}")))


def _kernel_arrays(k: pl.DataFrame) -> pl.DataFrame:
    """(step, kernels): each step's kernel list; an entry classed by evidence other than its
    name carries `class_by` (what placed it), the others keep their five fields."""
    base = ["name", "demangled", "class", "count", "time_ns"]
    if "class_by" not in k.columns or k["class_by"].null_count() == k.height:
        return jsontext.arrays(k, "step", base, "kernels")
    by = pl.struct(pl.col("class_by")).struct.json_encode().str.strip_prefix("{")
    rec = jsontext.open_records(k, base) + pl.when(pl.col("class_by").is_not_null()).then(
        pl.lit(",") + by).otherwise(pl.lit("}"))
    return jsontext.joined(k.select("step", rec.alias("_j")), "step", "_j", "kernels", "[", "]")


def _framework(inv: Inventory, sel: list[int]) -> pl.DataFrame:
    """(step, ',"framework":{count, time_ns, families, ops}') for the steps with framework
    kernels: the class by op family and, where NVTX ranges name ops, by launching op."""
    fam = inv.framework.filter(pl.col("step").is_in(sel))
    if fam.is_empty():
        return pl.DataFrame(schema={"step": pl.Int64, "framework": pl.String})
    # the framework class's own row of each step (its families partition it): read, not summed again
    total = (inv.classes.filter((pl.col("class") == "framework") & pl.col("step").is_in(fam["step"].unique().implode()))
             .select("step", pl.col("count").cast(pl.Int64), pl.col("time_ns").cast(pl.Int64)))
    head = total.select("step", jsontext.open_records(total, ["count", "time_ns"]).alias("head"))
    members = jsontext.members(fam, "step", "family", ["count", "time_ns"], "families")
    ops = inv.framework_ops.filter(pl.col("step").is_in(sel))
    ops = jsontext.arrays(ops, "step", ["op", "family", "count", "time_ns"], "ops")
    t = head.join(members, on="step", how="left").join(ops, on="step", how="left")
    return t.select("step", pl.concat_str(pl.lit(',"framework":'), pl.col("head"), pl.lit(',"families":'),
                                          pl.col("families"), pl.lit(',"ops":'), pl.col("ops").fill_null("[]"),
                                          pl.lit("}")).alias("framework"))


def _phase_evidence(steps: pl.DataFrame) -> pl.DataFrame:
    """(step, ',"phase_evidence":{by, detail, tokens}') for the steps whose phase the trace's
    evidence decided (or failed to): a step named with its phase gains nothing."""
    ev = steps.filter(pl.col("phase_by").is_not_null() & (pl.col("phase_by") != "name")).select(
        pl.col("index").alias("step"), pl.col("phase_by").alias("by"), pl.col("phase_detail").alias("detail"), "tokens")
    return ev.select("step", pl.concat_str(pl.lit(',"phase_evidence":'), jsontext.records(ev, ["by", "detail", "tokens"]))
                     .alias("phase_evidence"))


# the steps a big document is written in at a time (JsonRenderer.write): each piece's kernel
# lists are made, written and let go before the next (a ten-minute run's document is ~700 MB)
WRITE_STEPS = 2000


class JsonRenderer:
    """`stepscope analyze --json` (the pipeline's Renderer): the document of a Result as UTF-8."""

    def render(self, result) -> bytes:
        return analyze_json_bytes(result)

    def write(self, result, out, steps_at_a_time: int = WRITE_STEPS) -> None:
        """render()'s bytes written to the binary stream `out` a few steps at a time, so that the
        whole document is never held: the same bytes."""
        ids = list(result.steps)
        if len(ids) <= INDENT_MAX_STEPS:
            out.write(analyze_json_bytes(result))
            return
        inv, diag = result.inventory, result.diagnosis
        out.write(_head_text(result).encode() + b',"steps":[')
        for i in range(0, len(ids), steps_at_a_time):
            piece = ids[i:i + steps_at_a_time]  # its sections made with it: never every step's at once
            part = _steps_frame(inv, piece, diag, result.texts, sections_text(diag, piece)).to_series()
            out.write(jsontext.comma_joined(part, "," if i else "", ""))
            del part
        out.write(b"]}")


def analyze_json(result) -> str:
    """The document of a Result (pipeline.result_of / library.analyze) as JSON text: its
    selected steps with the diagnosis' sections (see steps_text), and for a trace of several steps
    the run view as a top-level `run` section. Formats what the Result holds, nothing more."""
    doc, n = _document(result)
    return reindent(doc.decode()) if n <= INDENT_MAX_STEPS else doc.decode()


def analyze_json_bytes(result) -> bytes:
    """analyze_json's document as UTF-8, for a writer of bytes (the CLI): the same bytes
    without a Python string of the whole document in between (the Result's `texts`: the
    inventory part of every step, when kept: library.step_texts)."""
    doc, n = _document(result)
    return reindent(doc.decode()).encode() if n <= INDENT_MAX_STEPS else doc


def _document(result) -> tuple[bytes, int]:
    """The compact document as UTF-8 and how many steps it holds."""
    inv, diag, ids = result.inventory, result.diagnosis, list(result.steps)
    return _steps_joined(inv, ids, diag, _head_text(result) + ',"steps":[', "]}", result.texts), len(ids)


def _head_text(result) -> str:
    """The document's fields before its steps, as compact JSON text without its closing brace."""
    inv = result.inventory
    head = {"trace": trace_dict(inv), "gpus": gpus_list(inv)}
    if getattr(inv, "capture", None) is not None and inv.capture.height:
        # the capture's own defects (analysis/capture_check.py), only when there are: before the warnings
        head["capture"] = inv.capture.to_dicts()
    from stepscope.render.sentences import warning_texts

    head["warnings"] = warning_texts(inv.warnings)
    if inv.startup.height:
        # a serving run's start-up, left out of its steps (analysis/startup.py)
        head["startup"] = inv.startup.to_dicts()
    if result.run is not None:
        head["run"] = result.run
    if result.whatif_calibration is not None:
        # the constants the median step's predicted_graph_step_* used, and the captures they come from
        head["whatif_calibration"] = result.whatif_calibration
    return json.dumps(head, separators=(",", ":"), default=str)[:-1]  # ASCII: non-ASCII is escaped


def analyze_document(result) -> dict:
    """The document as Python objects (what the Python API's to_dict returns)."""
    return json.loads(analyze_json(result))


def reindent(text: str) -> str:
    try:
        import orjson
    except ImportError:
        return json.dumps(json.loads(text), indent=2)
    try:
        return orjson.dumps(orjson.loads(text), option=orjson.OPT_INDENT_2).decode()
    except (orjson.JSONDecodeError, orjson.JSONEncodeError):  # an integer beyond 64 bits: json's are exact
        return json.dumps(json.loads(text), indent=2)


def dumps(doc: dict) -> str:
    """Indented JSON for other commands' documents (orjson when installed; json's module for a
    document holding an integer beyond 64 bits, which orjson refuses and Python's ints hold)."""
    try:
        import orjson
    except ImportError:
        return json.dumps(doc, indent=2, default=str)
    try:
        return orjson.dumps(doc, default=str, option=orjson.OPT_INDENT_2).decode()
    except orjson.JSONEncodeError:
        return json.dumps(doc, indent=2, default=str)
