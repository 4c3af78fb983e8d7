"""Names by distinct value (issue 30, "linear cost"): a trace whose every kernel has its own name
classifies as its shared-name original does; a name beyond sanity.NAME_MAX characters is
shortened once at ingest, with its length and digest; the by-column rule search agrees with the
rules read one name at a time; the kernel table's packed-key sort is the plain sort."""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import sqlite3

import polars as pl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.conftest import CliRunner

from stepscope.analysis.classify import first_match, load_rules, name_columns
from stepscope.analysis.inventory import _by_step_and_time
from stepscope.cli import app
from stepscope.ingest.nsys_sqlite import read_nsys_sqlite
from stepscope.ingest.sanity import NAME_MAX
from tests.conftest import FIXTURES, need, sha256

EAGER = FIXTURES / "llama8b_decode_b1_eager.sqlite"
K = "CUPTI_ACTIVITY_KIND_KERNEL"
SETTINGS = settings(max_examples=25, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def _analyze(path) -> dict:
    r = CliRunner().invoke(app, ["analyze", str(path), "--json", "--steps", "all", "--no-cache"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def _distinct(tmp_path):
    """The eager fixture with its own StringIds rows for each kernel: '<its name>_<rowid>' and
    '<its demangled name>_<rowid>' (built by SQL, as benchmarks/names.py builds its 200k-name
    export)."""
    p = tmp_path / "distinct.sqlite"
    shutil.copy(need(EAGER), p)
    with sqlite3.connect(p) as con:
        base = con.execute("SELECT max(id) FROM StringIds").fetchone()[0] + 1
        n = con.execute(f"SELECT max(rowid) FROM {K}").fetchone()[0] + 1
        for col, at in (("shortName", base), ("demangledName", base + n)):
            con.execute(f"INSERT INTO StringIds (id, value) SELECT {at} + k.rowid, s.value || '_' || k.rowid "
                        f"FROM {K} k JOIN StringIds s ON s.id = k.{col}")
            con.execute(f"UPDATE {K} SET {col} = {at} + rowid")
    return p


def test_every_kernel_with_its_own_name_classifies_as_its_shared_name(tmp_path):
    p = _distinct(tmp_path)
    before = sha256(p)
    got, ref = _analyze(p), _analyze(EAGER)
    assert sha256(p) == before
    # the independent count: each kernel's name and its original's, by plain SQL
    with sqlite3.connect(f"file:{p}?mode=ro", uri=True) as con:
        pairs = con.execute(f"SELECT s.value FROM {K} k JOIN StringIds s ON s.id = k.shortName").fetchall()
    assert len(pairs) == sum(s["n_kernels"] for s in got["steps"]) == sum(s["n_kernels"] for s in ref["steps"])
    # the classes the names gave (not those an anonymous name took from its neighbours: a
    # numbered name is no longer anonymous)
    by_name = {k["name"]: (k["class"], k["count"]) for s in ref["steps"] for k in s["kernels"]
               if "class_by" not in k and k["class"] != "memops"}
    seen, counts = 0, {}
    for s in got["steps"]:
        for k in s["kernels"]:
            if k["class"] == "memops":
                continue
            assert k["count"] == 1  # every name its own
            seen += 1
            base = k["name"].rsplit("_", 1)[0]
            if base in by_name:
                assert k["class"] == by_name[base][0], k["name"]
                counts[base] = counts.get(base, 0) + 1
    assert seen == len(pairs)
    assert counts == {n: c for n, (_, c) in by_name.items()}


def test_names_fill_their_id_range_read_by_range(tmp_path):
    """200k distinct names are read by their id range (one pass, rowid slices), not by literal
    lists: the strings read are exactly those SQL joins to the kernels."""
    p = _distinct(tmp_path)
    t = read_nsys_sqlite(p, launch_config=False)
    with sqlite3.connect(f"file:{p}?mode=ro", uri=True) as con:
        want = dict(con.execute(f"SELECT DISTINCT s.id, s.value FROM {K} k JOIN StringIds s "
                                "ON s.id IN (k.shortName, k.demangledName)").fetchall())
        api = dict(con.execute("SELECT DISTINCT s.id, s.value FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s "
                               "ON s.id = r.nameId WHERE s.value GLOB 'cu*'").fetchall())
    got = dict(zip(t.strings["id"].to_list(), t.strings["value"].to_list()))
    assert {i: got[i] for i in want} == want
    kept = {i for i, v in api.items() if v.startswith(("cudaLaunch", "cudaMemcpy", "cudaMemset", "cudaStreamSynchronize",
                                                       "cudaDeviceSynchronize"))}
    assert kept <= set(got)  # the kept API calls' names were found by the one read too


def test_a_long_kernel_name_is_shortened_once_with_its_length_and_digest(tmp_path):
    p = tmp_path / "long.sqlite"
    shutil.copy(need(EAGER), p)
    tail = "<x" * 300_000  # 600k characters past the name
    with sqlite3.connect(p) as con:
        sid, name = con.execute(f"SELECT s.id, s.value FROM {K} k JOIN StringIds s ON s.id = k.shortName "
                                "WHERE s.value LIKE 'nvjet%' LIMIT 1").fetchone()
        # a second long name sharing the first one's first NAME_MAX characters
        other = con.execute(f"SELECT s.id FROM {K} k JOIN StringIds s ON s.id = k.shortName "
                            "WHERE s.value NOT LIKE 'nvjet%' LIMIT 1").fetchone()[0]
        con.execute("UPDATE StringIds SET value = ? WHERE id = ?", (name + tail, sid))
        con.execute("UPDATE StringIds SET value = ? WHERE id = ?", (name + tail + "y", other))
    doc, ref = _analyze(p), _analyze(EAGER)
    full = name + tail
    want = f"{full[:NAME_MAX]}…[{len(full):,} characters, sha256 {hashlib.sha256(full.encode()).hexdigest()[:16]}]"
    names = {k["name"] for s in doc["steps"] for k in s["kernels"]}
    assert want in names
    assert any(n.startswith(full[:NAME_MAX]) and n != want and f"{len(full) + 1:,} characters" in n for n in names)
    assert max(len(n) for n in names) < NAME_MAX + 100
    assert any("longer than 16,384 characters shortened" in w for w in doc["warnings"])
    # the shortened name still classifies as its start says (an nvjet GEMM)
    cls = {k["name"]: k["class"] for s in doc["steps"] for k in s["kernels"]}
    assert cls[want] == "gemm"
    # the document stays the size of the original's plus the names' bounded tails
    assert len(json.dumps(doc)) < min(len(json.dumps(ref)) + 8 * (NAME_MAX + 200), len(full))


# --- the by-column rule search agrees with the rules read one name at a time ---------------------

def _fixture_names() -> list[str]:
    out = set()
    for f in sorted(FIXTURES.glob("*.sqlite")):
        with sqlite3.connect(f"file:{f}?mode=ro", uri=True) as con:
            out |= {r[0] for r in con.execute(
                f"SELECT DISTINCT s.value FROM {K} k JOIN StringIds s ON s.id IN (k.shortName, k.demangledName)")}
    return sorted(out)


NAMES = _fixture_names()
WORDS = ["gemm", "GEMM", "rms_norm", "RoPE", "triton_poi_fused_", "triton_red_fused_mean_pow_", "_cos_", "flash",
         "Kernel2<", "nccl", "AllReduce", "sampl", "splitK", "triton_tem_fused_", "mm", "_cat_", "_mul_", "_neg_",
         "embedding", "copy", "x" * 40, "\u212a", "ſ", "İ"]
edits = st.lists(st.tuples(st.sampled_from(["prefix", "suffix", "insert", "case"]), st.sampled_from(WORDS),
                           st.integers(0, 10_000)), max_size=4)


def _edit(name: str, ops) -> str:
    for kind, word, at in ops:
        i = at % (len(name) + 1)
        name = {"prefix": word + name, "suffix": name + word, "insert": name[:i] + word + name[i:],
                "case": name.swapcase()}[kind]
    return name


@SETTINGS
@given(picks=st.lists(st.tuples(st.sampled_from(NAMES), st.sampled_from(NAMES), edits, edits), min_size=1, max_size=40))
def test_first_match_is_classify_name(picks):
    rules = load_rules()
    short = [_edit(a, ea) for a, _, ea, _ in picks]
    dem = [_edit(b, eb) if i % 3 else short[i] for i, (_, b, _, eb) in enumerate(picks)]  # a third with one name
    names = pl.DataFrame({"name": short, "demangled": dem})
    s, d = name_columns(names)
    got = first_match(s, d, [(r.cls, r.pattern, r.field) for r in rules.kernel_rules], "other").to_list()
    assert got == [rules.classify_name(a, b) for a, b in zip(short, dem)]
    fam = first_match(s, d, [(f.family, f.pattern, "any") for f in rules.families], "other").to_list()
    assert fam == [rules.family_of(a, b) for a, b in zip(short, dem)]


# --- the kernel table's sort ----------------------------------------------------------------------

@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(0, 300), times=st.integers(1, 50), steps=st.integers(1, 8))
def test_packed_sort_is_the_plain_sort(seed, n, times, steps):
    rnd = random.Random(seed)
    k = pl.DataFrame({
        "step": [rnd.randrange(steps) for _ in range(n)],
        "name": [rnd.choice(["a", "b", "c", "nvjet", "ab"]) for _ in range(n)],
        "demangled": [rnd.choice(["x", "y", "z"]) for _ in range(n)],
        "class": [rnd.choice(["gemm", "norm"]) for _ in range(n)],
        "count": [1] * n,
        "time_ns": [rnd.randrange(times) * 1000 for _ in range(n)],  # few values: many ties
    }, schema={"step": pl.Int64, "name": pl.String, "demangled": pl.String, "class": pl.String,
               "count": pl.Int64, "time_ns": pl.Int64})
    want = k.sort("step", "time_ns", "name", "demangled", "class", descending=[False, True, False, False, False])
    assert _by_step_and_time(k).equals(want)


USER_RULES = '''
[[rule]]
class = "sampling"
field = "short"
pattern = "^nvjet.*TNT$"

[[rule]]
class = "norm"
field = "demangled"
pattern = "(?i)kernel<"

[[rule]]
class = "rope"
field = "any"
pattern = "x{3,}|_cos_"
'''


@SETTINGS
@given(picks=st.lists(st.tuples(st.sampled_from(NAMES), st.sampled_from(NAMES), edits, edits), min_size=1, max_size=40))
def test_first_match_with_a_users_rules_is_classify_name(picks):
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "rules.toml"
        f.write_text(USER_RULES)
        rules = load_rules(f)
    short = [_edit(a, ea) for a, _, ea, _ in picks]
    dem = [_edit(b, eb) if i % 3 else short[i] for i, (_, b, _, eb) in enumerate(picks)]
    s, d_ = name_columns(pl.DataFrame({"name": short, "demangled": dem}))
    got = first_match(s, d_, [(r.cls, r.pattern, r.field) for r in rules.kernel_rules], "other").to_list()
    assert got == [rules.classify_name(a, b) for a, b in zip(short, dem)]
