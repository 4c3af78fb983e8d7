"""What the byte budget is given (issue 30): huge shapes and partial cells. A model card, a step
name or an option with sizes past any model's is either computed exactly or refused in one line
(never an i128 or 64-bit overflow); `budget` with cells for a few kernels sets the joined kernels
against their own minimum; `report --cells` on damaged traces, or with cells of one class only,
does not crash."""

from __future__ import annotations

import csv
import json
import re
import shutil
import sqlite3
import tempfile
from pathlib import Path

import polars as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.conftest import CliRunner

from stepscope.cli import app
from tests.conftest import FIXTURES, eager_copy, one_line_2, examples, need, sha256

EAGER = FIXTURES / "llama8b_decode_b1_eager.sqlite"
R5_EAGER = FIXTURES / "round5" / "llama8b_decode_b1_eager.sqlite"
NCU = FIXTURES / "ncu"
SWEEP = NCU / "h200_llama8b_sweep.parquet"
CELLS = SWEEP
RAW = NCU / "h200_llama8b_ncu_raw.csv"
STEP_CELLS = NCU / "step_torch_llama8b_decode_b1"
CARD = json.loads((Path(__file__).resolve().parent.parent / "stepscope" / "data" / "cards" / "llama-3.1-8b.json")
                  .read_text())
# each example runs two or three commands on a whole export; the default run takes the full 12 too:
# with 5, the TP and collective paths of report and budget (65 lines) went untested by default
FEW = examples(full=12, quick=12)
HUGE = [0, -1, 1, 2**31, 2**40, 2**53 + 1, 2**62, 2**63 - 1, 2**63, 2**64 + 1, 10**30]


def _run(args: list, *inputs: Path):
    """One command: exit 0, or exit 2 with one `stepscope: error:` line; never a traceback nor
    exit 3; the inputs unchanged."""
    before = [sha256(p) for p in inputs]
    r = CliRunner().invoke(app, [*map(str, args)])
    assert r.exception is None or isinstance(r.exception, SystemExit), (args, repr(r.exception))
    assert r.exit_code in (0, 2), (args, r.exit_code, r.output[-1500:])
    if r.exit_code == 2:
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("stepscope: error: "), (args, r.stderr)
    assert "Traceback" not in r.output
    assert [sha256(p) for p in inputs] == before
    return r


def _ints(doc) -> list[int]:
    if isinstance(doc, bool):
        return []
    if isinstance(doc, int):
        return [doc]
    if isinstance(doc, dict):
        doc = list(doc.values())
    return [i for v in doc for i in _ints(v)] if isinstance(doc, list) else []


# --- a model card's sizes -------------------------------------------------------------------------

card_values = st.one_of(st.sampled_from(HUGE), st.integers(-(2**70), 2**70), st.floats(allow_nan=True),
                        st.text(max_size=5), st.none(), st.booleans())
card_keys = st.sampled_from(["hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                             "intermediate_size", "num_hidden_layers", "vocab_size"])


@FEW
@given(edits=st.dictionaries(card_keys, card_values, min_size=1, max_size=3),
       batch=st.sampled_from([None, 1, 100_000]), context=st.sampled_from([None, 2048, 10_000_000]))
def test_budget_and_report_with_a_card_of_huge_sizes(edits, batch, context):
    with tempfile.TemporaryDirectory() as d:
        card = Path(d) / "card.json"
        card.write_text(json.dumps({**CARD, **edits}))
        shape = [*(["--batch", batch] if batch else []), *(["--context", context] if context else [])]
        r = _run(["budget", need(EAGER), "--cells", need(SWEEP), "--model", card, "--json", *shape], EAGER, card)
        if r.exit_code == 0:
            doc = json.loads(r.stdout)
            st_ = doc["step"]
            assert st_["min_bytes"] > 0 and st_["removable_bytes"] == st_["measured_bytes"] - st_["min_bytes"]
            assert all(abs(i) < 2**63 for i in _ints(doc))
        else:
            assert re.search(r"model card|beyond 2\^62", r.stderr), r.stderr
        _run(["report", EAGER, "--cells", SWEEP, "--model", card, *shape, "-o", Path(d) / "r.md"], EAGER, card)


def test_the_largest_card_computes_or_is_refused_whole():
    """Every size at its bound: a decode step of batch 1 is computed (exact integers); batch
    100,000 at context 10M needs more than 2^62 bytes and is refused in one line."""
    from stepscope.bytes.minbytes import CARD_MAX, step_rows

    card = {**CARD, **CARD_MAX, "num_attention_heads": 1024, "num_key_value_heads": 1024, "head_dim": 1024}
    rows = step_rows(card, 1, 1, "decode")
    h, v, i, L = CARD_MAX["hidden_size"], CARD_MAX["vocab_size"], CARD_MAX["intermediate_size"], CARD_MAX["num_hidden_layers"]
    lm = [r for r in rows if r["op"] == "gemm:lm_head"][0]
    assert lm["min_bytes"] == (h + h * v + v) * 2  # x + W + y, bf16, one token
    gate_up = [r for r in rows if r["op"] == "gemm:gate_up"][0]
    assert gate_up["min_bytes"] == L * (h + h * 2 * i + 2 * i) * 2
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "card.json"
        p.write_text(json.dumps(card))
        r = _run(["budget", need(EAGER), "--cells", need(SWEEP), "--model", p, "--batch", 100_000,
                  "--context", 10_000_000], EAGER)
        assert r.exit_code == 2 and "beyond 2^62" in r.stderr


# --- huge shapes in a step's name -----------------------------------------------------------------

def _named(folder: Path, **shape) -> Path:
    p = folder / "named.sqlite"
    shutil.copy(need(EAGER), p)
    with sqlite3.connect(p) as con:
        (name,) = con.execute("SELECT text FROM NVTX_EVENTS WHERE text LIKE 'step %' LIMIT 1").fetchone()
        for k, v in shape.items():
            name = re.sub(rf"\b{k}=\d+", f"{k}={v}", name)
        con.execute("UPDATE NVTX_EVENTS SET text = ? WHERE text LIKE 'step %'", (name,))
    return p


@FEW
@given(shape=st.dictionaries(st.sampled_from(["batch", "context", "tokens", "tp", "layers"]),
                             st.sampled_from([v for v in HUGE if v >= 0]), min_size=1, max_size=5))
def test_tp_analyze_and_budget_with_huge_shapes_in_the_step_name(shape):
    with tempfile.TemporaryDirectory() as d:
        p = _named(Path(d), **shape)
        r = _run(["tp", p, "--json", "--no-cache"], p)
        if r.exit_code == 0:
            doc = json.loads(r.stdout)
            assert 1 <= doc["inputs"]["base_tp"] <= 65_536 and all(abs(i) < 2**63 for i in _ints(doc))
        else:
            assert "tp=" in r.stderr and "outside 1..65,536" in r.stderr
            assert not 1 <= shape.get("tp", 1) <= 65_536
        r = _run(["analyze", p, "--json", "--no-cache"], p)
        assert r.exit_code == 0
        json.loads(r.stdout)
        r = _run(["budget", p, "--cells", need(SWEEP), "--json"], p)
        if r.exit_code == 0:
            assert json.loads(r.stdout)["step"]["min_bytes"] > 0


def test_tp_refuses_a_step_name_saying_tp_2_62(tmp_path):
    p = _named(tmp_path, tp=2**62)
    r = _run(["tp", p, "--json", "--no-cache"], p)
    assert r.exit_code == 2 and f"tp={2**62}, outside 1..65,536" in r.stderr


def test_json_documents_write_integers_beyond_64_bits_exactly():
    from stepscope.render.json import dumps

    assert json.loads(dumps({"a": 2**70, "b": -(2**65)})) == {"a": 2**70, "b": -(2**65)}


# --- budget with cells for a few kernels ----------------------------------------------------------

def _ncu_rows(path: Path) -> tuple[list[str], list[list[str]]]:
    rows = [r for r in csv.reader(ln for ln in path.read_text().splitlines() if ln.startswith('"'))]
    return rows[0], [r for r in rows[2:] if r and r[0] != "ID"]


def _num(s: str) -> int:
    return int(s.replace(",", ""))


def _gemm_min(k: int, n: int, tokens: int = 1) -> int:
    return (tokens * k + k * n + tokens * n) * 2  # X, W, Y in bf16: the minbytes hand formula


H, I_, V = 4096, 14336, 128256
QKV, O, GATE_UP, DOWN = _gemm_min(H, 6144), _gemm_min(H, H), _gemm_min(H, 2 * I_), _gemm_min(I_, H)


def _sql(path: Path, q: str, *args):
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as con:
        return con.execute(q, args).fetchone()


def test_budget_with_the_cells_of_five_gemms_of_the_step(tmp_path):
    """The step's own ncu run (launch order), cut to its first five GEMM launches: layer 0's
    qkv, o, gate_up, down and layer 1's qkv. They are set against their own five minimums
    (before: the 129 GEMM calls' 14 GB against 0.5 GB measured, "removable" -13 GB)."""
    cells = pl.read_parquet(need(STEP_CELLS / "cells.parquet"))
    few = tmp_path / "five.parquet"
    cells.filter(pl.col("kernel").str.starts_with("nvjet")).head(5).write_parquet(few)
    r = _run(["budget", need(R5_EAGER), "--cells", few, "--json"], R5_EAGER)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    head, data = _ncu_rows(STEP_CELLS / "ncu_raw.csv")
    ik, ir, iw = head.index("Kernel Name"), head.index("dram__bytes_read.sum"), head.index("dram__bytes_write.sum")
    gemms = [x for x in data if x[ik].startswith("nvjet")][:5]
    memset = _sql(R5_EAGER, "SELECT coalesce(sum(bytes), 0) FROM CUPTI_ACTIVITY_KIND_MEMSET")[0]
    measured = sum(_num(x[ir]) + _num(x[iw]) for x in gemms) + memset
    minimum = 2 * QKV + O + GATE_UP + DOWN
    st_ = doc["step"]
    assert st_["min_bytes"] == minimum > 0
    assert st_["measured_bytes"] == measured
    assert st_["removable_bytes"] == measured - minimum
    got = {x["op"]: (x["calls"], x["min_bytes"]) for x in doc["rows"] if x["measured_bytes"] and x["op"] != "memset"}
    assert got == {"gemm:qkv": (2, 2 * QKV), "gemm:o": (1, O), "gemm:gate_up": (1, GATE_UP), "gemm:down": (1, DOWN)}
    # the step plan's minimum is still the whole step's, and what no cell measured is said
    assert st_["plan_min_bytes"] == 15_289_851_408 == st_["min_bytes"] + st_["unjoined_min_bytes"]


def test_budget_with_imported_cells_of_two_gemms(tmp_path):
    """`cells import` of the plain ncu run names no op: the two GEMMs kept (gate_up and down
    at M=1) take their op from their class and bytes and are set against its minimum (before:
    minimum 0, "removable" = everything measured)."""
    imported = tmp_path / "imported.parquet"
    _run(["cells", "import", need(RAW), "-o", imported])
    head, data = _ncu_rows(RAW)
    ik, iid = head.index("Kernel Name"), head.index("ID")
    ir, iw = head.index("dram__bytes_read.sum"), head.index("dram__bytes_write.sum")
    names = {"nvjet_sm90_tst_128x8_64x12_2x1_v_bz_TNT": GATE_UP, "nvjet_sm90_tst_128x8_64x12_2x1_v_bz_splitK_TNT": DOWN}
    first = {}
    for x in data:  # the first launch of each in the raw text
        first.setdefault(x[ik], x)
    keep = tmp_path / "two.parquet"
    cells = pl.read_parquet(imported)
    cells.filter(pl.col("kernel").is_in(list(names)) & pl.col("id").is_in([int(first[n][iid]) for n in names])) \
        .unique("kernel", keep="first").write_parquet(keep)
    r = _run(["budget", need(EAGER), "--cells", keep, "--json"], EAGER)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    calls = {n: _sql(EAGER, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName "
                            "WHERE s.value = ?", n)[0] for n in names}
    assert calls == {n: 32 for n in names}
    memset = _sql(EAGER, "SELECT coalesce(sum(bytes), 0) FROM CUPTI_ACTIVITY_KIND_MEMSET")[0]
    measured = sum(calls[n] * (_num(first[n][ir]) + _num(first[n][iw])) for n in names) + memset
    minimum = sum(calls[n] * m for n, m in names.items())
    st_ = doc["step"]
    assert st_["min_bytes"] == minimum > 0 and st_["measured_bytes"] == measured
    assert st_["removable_bytes"] == measured - minimum
    assert {x["op"] for x in doc["rows"] if x["measured_bytes"] and x["class"] == "gemm"} == {"gemm:gate_up", "gemm:down"}
    assert any("name no op" in w for w in doc["warnings"])


# --- report --cells on damaged traces -------------------------------------------------------------

from tests.test_fuzz_fixtures import _damaged, operations  # noqa: E402  (the campaign's damage)


@pytest.fixture(scope="module")
def partial_cells(tmp_path_factory):
    p = tmp_path_factory.mktemp("cells") / "gemms.parquet"
    pl.read_parquet(need(SWEEP)).filter(pl.col("op") == "gemm").write_parquet(p)
    return p


@FEW
@given(source=st.sampled_from(sorted(FIXTURES.glob("*.sqlite"))), ops=operations,
       which=st.sampled_from(["sweep", "partial"]))
def test_report_with_cells_on_damaged_traces(partial_cells, source, ops, which):
    with tempfile.TemporaryDirectory() as d:
        p = _damaged(Path(d), source, ops)
        cells = need(SWEEP) if which == "sweep" else partial_cells
        out = Path(d) / "r.md"
        r = _run(["report", p, "-o", out, "--cells", cells], p)
        if r.exit_code == 0:
            assert out.exists() and out.stat().st_size > 0


# --- crashes found past the fault campaign, each on a damaged copy of a real fixture ------------

@pytest.fixture
def trace(tmp_path):
    return eager_copy(tmp_path)




@pytest.mark.parametrize("form", ["md", "html"])
def test_report_with_cells_where_a_class_has_a_minimum_and_no_measurement(trace, tmp_path, form):
    import polars as pl
    cells = tmp_path / "gemm.parquet"  # cells of the GEMMs only: the other classes' minimum has no measurement
    pl.read_parquet(need(CELLS)).filter(pl.col("kernel").str.starts_with("nvjet")).write_parquet(cells)
    out = tmp_path / f"r.{form}"
    r = CliRunner().invoke(app, ["report", str(trace), "-o", str(out), "--cells", str(cells)])
    assert r.exit_code == 0, r.output
    text = out.read_text()
    assert "Byte budget" in text or "byte budget" in text.lower()
    if form == "md":
        budget = text.split("### Byte budget", 1)[1]
        gemm = next(line for line in budget.splitlines() if line.startswith("| gemm |"))
        assert "×1.0" in gemm  # measured against its own, non-zero minimum


@pytest.mark.parametrize("name,says", [
    ("batch=999999999999999999 tokens=1 context=2048", "batch=999999999999999999, outside 1..100,000"),
    ("batch=1 tokens=1 context=999999999999999999", "context=999999999999999999"),
    ("batch=1 tokens=1 context=2048 tp=99999999999", "tp=99999999999"),
])
def test_budget_of_a_step_name_with_huge_shapes(trace, name, says):
    # the shapes read from the step's name overflowed the budget's 128-bit integers (exit 3)
    with sqlite3.connect(trace) as c:
        c.execute("UPDATE NVTX_EVENTS SET text = ? WHERE text LIKE 'step %'",
                  (f"step phase=decode {name} model=llama-3.1-8b mode=eager",))
    r = CliRunner().invoke(app, ["budget", str(trace), "--cells", str(need(CELLS))])
    one_line_2(r, says)


def test_budget_with_the_shapes_passed_over_a_huge_name(trace):
    with sqlite3.connect(trace) as c:
        c.execute("UPDATE NVTX_EVENTS SET text = ? WHERE text LIKE 'step %'",
                  ("step phase=decode batch=999999999999999999 context=999999999999999999 model=llama-3.1-8b",))
    r = CliRunner().invoke(app, ["budget", str(trace), "--cells", str(need(CELLS)), "--batch", "1",
                                 "--context", "2048", "--json"])
    assert r.exit_code == 0, r.output


def test_budget_with_another_models_cells_says_so_first(tmp_path):
    """Cells measured on llama-3.1-8b joined to a Qwen3-30B-A3B step (tenth round's eager MoE
    capture): the first warning says whose cells they are and that measured vs minimum and the
    floor are not this step's; the same cells on a llama-3.1-8b step give no such warning. The
    cells' model is read here from the file with polars, not from the budget."""
    from tests.conftest import gunzipped

    models = pl.read_parquet(SWEEP, columns=["model"])["model"].unique().to_list()
    assert models == ["llama-3.1-8b"]
    qwen = gunzipped(FIXTURES / "models" / "qwen3-30b-a3b_serve_r16_s0_eager.sqlite.gz")
    r = CliRunner().invoke(app, ["budget", str(qwen), "--cells", str(SWEEP), "--model", "qwen3-30b-a3b",
                                 "--batch", "16", "--context", "512", "--phase", "decode", "--json"])
    assert r.exit_code == 0, r.output
    first = json.loads(r.stdout)["warnings"][0]
    assert first.startswith("the cells were measured on llama-3.1-8b, not on qwen3-30b-a3b")
    assert "stepscope cells run --model qwen3-30b-a3b" in first
    same = _run(["budget", need(EAGER), "--cells", SWEEP, "--json"], EAGER)
    assert same.exit_code == 0, same.output
    assert not [w for w in json.loads(same.stdout)["warnings"] if "were measured on" in w]
