"""The shortcuts issue 31's second round took (CHANGELOG.md, round two), each against
the plain way of computing the same thing: plain SQL over the export, numpy's binary search,
the text document, and a decision made step by step."""

from __future__ import annotations

import numpy as np
import polars as pl
from hypothesis import given, settings, strategies as st

from stepscope.analysis import phase
from stepscope.analysis.untraced import _positions
from stepscope.launch_config import rowid_span
from tests.conftest import FIXTURES, need, ro

K = "CUPTI_ACTIVITY_KIND_KERNEL"


def test_rowid_span_is_the_tables_min_and_max_rowid():
    """Two index lookups give what one min()/max() query (a scan) gives, on real exports, also
    on a table with no rows (nsys's MEMSET table is absent here: an empty copy of the kernel
    table stands for it)."""
    for name in ("llama8b_decode_b1_eager.sqlite", "round5/llama8b_decode_b1_bare.sqlite"):
        c = ro(need(FIXTURES / name))
        first = c.execute(f"SELECT rowid FROM {K} ORDER BY rowid LIMIT 1").fetchone()[0]
        last = c.execute(f"SELECT rowid FROM {K} ORDER BY rowid DESC LIMIT 1").fetchone()[0]
        assert rowid_span(c, K) == (first, last)
        assert last - first + 1 == c.execute(f"SELECT count(*) FROM {K}").fetchone()[0]
    import sqlite3

    mem = sqlite3.connect(":memory:")
    mem.execute(f"CREATE TABLE {K} (start INTEGER)")
    assert rowid_span(mem, K) == (None, None)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-5, 60), unique=True, min_size=1, max_size=30), st.data())
def test_step_positions_are_numpys_binary_search(ids, data):
    """The index of each step id among the sorted ids: the id itself when they are 0..n-1, a
    binary search otherwise; the same answer as np.searchsorted either way."""
    sid = np.array(sorted(ids), dtype=np.int64)
    if data.draw(st.booleans()):
        sid = np.arange(len(ids), dtype=np.int64)  # the usual numbering
    values = data.draw(st.lists(st.sampled_from(sid.tolist()), max_size=50))
    got = _positions(sid, pl.Series("step", values, dtype=pl.Int64))
    assert got.dtype == np.int32
    assert got.tolist() == np.searchsorted(sid, np.array(values, dtype=np.int64)).tolist()


def _evidence_rows(step: int, tokens: int, att_blocks: int, rows: int | None) -> list[dict]:
    """A step's evidence kernels: one per-token kernel with grid x = tokens, one attention
    kernel launched with att_blocks blocks, and (optionally) a sampler row kernel."""
    base = {"step": step, "device": 0, "tile_n": None, "grid_y": 1, "grid_z": 1, "block_y": 1}
    out = [{**base, "role": "per_token", "name": "rms_norm_kernel", "label": "rms_norm_kernel",
            "start": 0, "end": 10, "grid_x": tokens},
           {**base, "role": "attention", "name": "sdpa_kernel", "label": "sdpa_kernel",
            "start": 20, "end": 90, "grid_x": att_blocks}]
    if rows is not None:
        out.append({**base, "role": "rows", "name": "_gumbel_sample_kernel", "label": "_gumbel_sample_kernel",
                    "start": 95, "end": 99, "grid_x": rows})
    return out


def test_steps_of_different_shapes_each_get_their_own_decision():
    """Decided once per distinct shape and joined back: each step still gets the decision its
    own evidence calls for (the rules of DEFINITIONS.md, "Phase evidence"): 8 attention blocks
    for 1 token is decode by launch; 2048 tokens with 132 blocks on a 132-SM GPU decide nothing
    by launch and 1 sampled row makes it prefill by shape. Steps 0 and 2 share a shape."""
    k = pl.DataFrame(_evidence_rows(5, 1, 8, None) + _evidence_rows(7, 2048, 132, 1) + _evidence_rows(9, 1, 8, None),
                     schema={"step": pl.Int64, "device": pl.Int64, "tile_n": pl.Int64, "grid_y": pl.Int64,
                             "grid_z": pl.Int64, "block_y": pl.Int64, "role": pl.String, "name": pl.String,
                             "label": pl.String, "start": pl.Int64, "end": pl.Int64, "grid_x": pl.Int64})
    out = phase.step_evidence(k, {0: 132})
    assert out["step"].to_list() == [5, 7, 9]
    assert out["phase"].to_list() == ["decode", "prefill", "decode"]
    assert out["phase_by"].to_list() == ["launch", "shape", "launch"]
    assert out["tokens"].to_list() == [1, 2048, 1]
    assert out["phase_detail"][0] == out["phase_detail"][2] != out["phase_detail"][1]
    assert "132 SMs" not in out["phase_detail"][1] and "2048 tokens" in out["phase_detail"][1]


def test_the_documents_bytes_are_its_text(monkeypatch):
    """analyze_json_bytes (the CLI's) is analyze_json's text as UTF-8, compact (above
    INDENT_MAX_STEPS steps) and indented, on a trace whose document holds non-ASCII text."""
    from stepscope import library
    from stepscope.render import json as rj

    from stepscope.pipeline import result_of

    d = library.diagnosis(need(FIXTURES / "round5" / "llama8b_decode_b1_bare.sqlite"), cache=False)
    r = result_of(d, "all")
    text = rj.analyze_json(r)
    assert rj.analyze_json_bytes(r) == text.encode()
    monkeypatch.setattr(rj, "INDENT_MAX_STEPS", 0)
    compact = rj.analyze_json(r)
    assert "\n" not in compact and any(ord(c) > 127 for c in compact)
    assert rj.analyze_json_bytes(r) == compact.encode()
    import json

    assert json.loads(compact) == json.loads(text)


def test_class_table_from_the_per_name_table_is_the_plain_group_by():
    """Each step's class counts and times, summed from the per-name table (issue 31, third
    round), equal a plain group-by of the activities by (step, class) on real exports; and both
    equal plain SQL's kernel count per step."""
    from stepscope import library
    from stepscope.analysis.inventory import _class_tables, in_steps

    for name in ("llama8b_decode_b1_eager.sqlite", "llama8b_decode_b1_eager_tp2.sqlite",
                 "round5/llama1b_decode_emit_nvtx.sqlite", "llama8b_prefill_b1_eager.sqlite"):
        inv = library.load(need(FIXTURES / name), cache=False)
        a = in_steps(inv.acts, "step", "class", "name", "demangled", "start", "end")
        classes, kernels = _class_tables(a)
        plain = (a.group_by("step", "class").agg(pl.len().cast(pl.Int64).alias("count"),
                                                 (pl.col("end") - pl.col("start")).sum().alias("time_ns"))
                 .select("step", pl.col("class").cast(pl.String), "count", "time_ns")
                 .sort("step", "time_ns", "class", descending=[False, True, False]))
        assert classes.equals(plain), name
        assert classes.equals(inv.classes), name
        assert kernels["count"].sum() == classes["count"].sum() == a.height
        n = ro(need(FIXTURES / name)).execute(f"SELECT count(*) FROM {K}").fetchone()[0]
        assert classes.filter(pl.col("class") != "memops")["count"].sum() <= n


def test_launch_latency_by_lookup_is_the_join(monkeypatch):
    """launch_summary takes each activity's previous-step end by a gather from a table by step
    id (frames.lookup); the same figures as the join it replaced, on real exports (a TP trace,
    whose steps interleave across devices, among them)."""
    from stepscope import library
    from stepscope.analysis import launch

    for name in ("llama8b_decode_b1_eager.sqlite", "llama8b_decode_b1_eager_tp2.sqlite",
                 "round5/llama8b_decode_b1_bare.sqlite"):
        inv = library.load(need(FIXTURES / name), cache=False)
        got, _ = launch.launch_summary(inv)

        def joined(col, keys, values):  # the plain way: a hash lookup by step, as the join did
            t = pl.DataFrame({"step": keys, "_v": values})
            return pl.col(col).replace_strict(t["step"], t["_v"], default=None, return_dtype=values.dtype)
        with monkeypatch.context() as m:
            m.setattr(launch, "lookup", joined)
            want, _ = launch.launch_summary(inv)
        assert got.equals(want), name
        assert got["latency_median_ns"].null_count() < got.height


@given(st.lists(st.text(), max_size=40), st.text(), st.text())
@settings(max_examples=200)
def test_texts_joined_by_the_csv_writer_are_pythons_join(texts, before, after):
    """jsontext.comma_joined (polars' CSV writer, unquoted): commas, quotes, newlines, carriage
    returns, non-ASCII and empty texts come out as Python's join writes them."""
    from stepscope.jsontext import comma_joined

    want = (before + ",".join(texts) + after).encode()
    assert comma_joined(pl.Series(texts, dtype=pl.String), before, after) == want
    # a null among them: the join, which leaves it out
    with_null = pl.Series([*texts, None], dtype=pl.String)
    assert comma_joined(with_null, before, after) == (before + ",".join(texts) + after).encode()
