"""Limits on patterns and long names: stepscope's own patterns are linear in the name's length, a
user's pattern runs under a time budget and one with counted repetitions past the bounds is refused
before it is compiled (memory), and long names are cut for display."""

from __future__ import annotations

import re
import shutil
import sqlite3
import time

import pytest
from tests.conftest import CliRunner

from stepscope import apinames, patterns
from stepscope.analysis import steps
from stepscope.analysis.classify import load_rules
from stepscope.bytes import hbm
from stepscope.cli import app
from tests.conftest import FIXTURES, eager_copy, one_line_2, need, sha256

EAGER = FIXTURES / "llama8b_decode_b1_eager.sqlite"
N = 256 * 1024  # a quadratic pattern takes seconds here (the old gemm rule: 2 s), a linear one ms


def _ours() -> list[tuple[str, re.Pattern]]:
    rules = load_rules()
    out = [(f"[[rule]] {r.cls}", r.pattern) for r in rules.kernel_rules]
    out += [(f"[[nvtx]] {r.cls}", r.pattern) for r in rules.nvtx_rules]
    out += [("step regex", re.compile(steps.DEFAULT_STEP_REGEX)), ("vLLM step name", steps._VLLM),
            ("key=value", steps._KV), ("blocking copy", apinames.BLOCKING_COPY)]
    out += [(f"GPU {canon}", re.compile(p)) for p, _, canon in hbm._TABLE]
    return out


def _adversarial(p: re.Pattern) -> dict[str, str]:
    """Names built to make a backtracking matcher retry: each literal piece of the pattern
    repeated (a prefix that matches everywhere and a suffix that never comes), and plain runs."""
    lits = {x for x in re.split(r"[|()?:\\*+.\[\]{}^$<>!=]", p.pattern) if len(x) >= 2}
    out = {"a": "a" * N, "digits": "1" * N, "spaces": " " * N, "a=": "a=" * (N // 2),
           "step": "step " + "x" * N, "step+newline": "step " + "x" * N + "\nz",
           "vllm": "execute_context_1(1)_generation_1(" * (N // 34)}
    for lit in lits:
        out[lit] = (lit * (N // len(lit) + 1))[:N]
        out[lit + " "] = ((lit + " ") * (N // (len(lit) + 1) + 1))[:N]
    return out


@pytest.mark.parametrize("name,pattern", _ours(), ids=[n for n, _ in _ours()])
def test_our_patterns_are_linear_on_long_names(name, pattern):
    worst = (0.0, "")
    for label, text in _adversarial(pattern).items():
        t = time.perf_counter()
        pattern.findall(text) if pattern is steps._KV else pattern.search(text)
        worst = max(worst, (time.perf_counter() - t, label))
    assert worst[0] < 0.5, f"{name} took {worst[0]:.2f} s on a {N:,}-character name of {worst[1]!r}"


def test_the_anchored_gemm_rule_still_finds_inductor_mm_templates():
    rules = load_rules()
    for name in ("triton_tem_fused_mm_0", "triton_tem_fused_addmm_relu_3", "x_triton_tem_fused__to_copy_mm_2"):
        assert rules.classify_name(name, name) == "gemm", name
    assert rules.classify_name("triton_tem_fused_add_0", "triton_tem_fused_add_0") != "gemm"


def test_step_shape_of_a_megabyte_name():
    name = "step phase=decode batch=8 " + "x" * 1_000_000 + " context=2048"
    t = time.perf_counter()
    shape = steps.step_shape(name)
    assert time.perf_counter() - t < 1.0
    assert shape == {"phase": "decode", "batch": 8, "context": 2048}
    assert steps.step_shape("a.b=1 key=v/x-y z==3") == {"b": 1, "key": "v/x-y"}  # as the old pattern read it


@pytest.fixture
def huge(tmp_path):
    """The eager fixture with a 1 MB step name and one kernel of 1 MB names that match no rule."""
    p = tmp_path / "huge.sqlite"
    shutil.copy(need(EAGER), p)
    con = sqlite3.connect(p)
    con.execute("UPDATE NVTX_EVENTS SET text = text || ' ' || replace(hex(zeroblob(500000)), '0', 'a')")
    con.execute("""UPDATE StringIds SET value = replace(hex(zeroblob(500000)), '0', 'z')
                   WHERE id IN (SELECT shortName FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE rowid = 200
                                UNION SELECT demangledName FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE rowid = 200)""")
    con.commit()
    con.close()
    return p


def test_megabyte_names_render_fast_and_cut(huge, tmp_path):
    before = sha256(huge)
    t = time.perf_counter()
    r = CliRunner().invoke(app, ["analyze", str(huge)])
    assert r.exit_code == 0, r.output
    assert "(1,000,000 characters)" in r.stdout and len(r.stdout) < 20_000  # cut, and said so
    assert "launch-bound" in r.stdout
    r = CliRunner().invoke(app, ["report", str(huge), "-o", str(tmp_path / "r.html")])
    assert r.exit_code == 0 and (tmp_path / "r.html").stat().st_size < 5_000_000
    r = CliRunner().invoke(app, ["export", str(huge), "-o", str(tmp_path / "p.json")])
    assert r.exit_code == 0 and (tmp_path / "p.json").stat().st_size < 5_000_000
    assert time.perf_counter() - t < 30
    # the JSON document holds the names as ingest shortened them (sanity.NAME_MAX): their first
    # NAME_MAX characters, the whole name's length and its digest
    import hashlib
    import json

    from stepscope.ingest.sanity import NAME_MAX

    doc = json.loads(CliRunner().invoke(app, ["analyze", str(huge), "--json"]).stdout)
    with sqlite3.connect(f"file:{huge}?mode=ro", uri=True) as con:
        step_name = con.execute("SELECT text FROM NVTX_EVENTS WHERE text LIKE 'step %' LIMIT 1").fetchone()[0]
    digest = hashlib.sha256(step_name.encode()).hexdigest()[:16]
    assert doc["steps"][0]["name"] == f"{step_name[:NAME_MAX]}…[{len(step_name):,} characters, sha256 {digest}]"
    longest = max((k["name"] for k in doc["steps"][0]["kernels"]), key=len)
    assert longest == "z" * NAME_MAX + f"…[1,000,000 characters, sha256 {hashlib.sha256(b'z' * 1_000_000).hexdigest()[:16]}]"
    assert sha256(huge) == before


def test_a_runaway_step_regex_is_stopped_and_named(huge, monkeypatch):
    monkeypatch.setattr(patterns, "BUDGET_S", 0.5)
    con = sqlite3.connect(huge)
    con.execute("UPDATE NVTX_EVENTS SET text = ?", ("a" * 60 + "b",))
    con.commit()
    con.close()
    t = time.perf_counter()
    r = CliRunner().invoke(app, ["analyze", str(huge), "--step-regex", "^(a|aa)+$"])
    assert time.perf_counter() - t < 10
    assert r.exit_code == 2 and "--step-regex" in r.output and "(a|aa)+" in r.output, r.output
    assert "backtracks" in r.output and len(r.output.strip().splitlines()) == 1


def test_a_runaway_rules_pattern_is_stopped_and_named(tmp_path, monkeypatch):
    monkeypatch.setattr(patterns, "BUDGET_S", 0.5)
    p = tmp_path / "t.sqlite"
    shutil.copy(need(EAGER), p)
    con = sqlite3.connect(p)
    con.execute("""UPDATE StringIds SET value = ? WHERE id =
                   (SELECT shortName FROM CUPTI_ACTIVITY_KIND_KERNEL LIMIT 1)""", ("a" * 60 + "b",))
    con.commit()
    con.close()
    rules = tmp_path / "rules.toml"
    rules.write_text('[[rule]]\nclass = "gemm"\nfield = "short"\npattern = "^(a|aa)+$"\n')
    for cmd in (["analyze", str(p)], ["export", str(p), "-o", str(tmp_path / "x.json")]):
        r = CliRunner().invoke(app, [*cmd, "--rules", str(rules)])
        assert r.exit_code == 2 and "[[rule]] #1" in r.output and "(a|aa)+" in r.output, r.output
    # a user pattern that is fine still classifies, with the user's rule first
    rules.write_text('[[rule]]\nclass = "sampling"\nfield = "short"\npattern = "^a+b$"\n')
    r = CliRunner().invoke(app, ["analyze", str(p), "--json", "--rules", str(rules)])
    assert r.exit_code == 0 and '"sampling"' in r.stdout


def test_user_patterns_keep_re_semantics():
    p = patterns.UserPattern(r"(?i:rms_?norm)|^x\d+$", "test")
    assert p.search("fused_RMSNorm_kernel") and p.search("x12") and not p.search("x12y")
    with pytest.raises(patterns.PatternError, match="bad regex"):
        patterns.UserPattern("((", "test")


def test_names_that_look_like_rich_markup_are_shown_as_they_are(tmp_path):
    """rich read "[/]" in a kernel or step name as a closing tag: MarkupError, exit 3."""
    p = tmp_path / "m[red]x.sqlite"
    shutil.copy(need(EAGER), p)
    con = sqlite3.connect(p)
    con.execute("UPDATE NVTX_EVENTS SET text = 'step [/bold] phase=decode [red'")
    con.execute("""UPDATE StringIds SET value = '[/]zz' WHERE id IN (SELECT shortName FROM
                   CUPTI_ACTIVITY_KIND_KERNEL WHERE rowid = 200 UNION SELECT demangledName FROM
                   CUPTI_ACTIVITY_KIND_KERNEL WHERE rowid = 200)""")
    con.commit()
    con.close()
    # wide: the path under pytest's tmp folder (longer under xdist's workers) is not wrapped
    r = CliRunner().invoke(app, ["analyze", str(p)], env={"COLUMNS": "400"})
    assert r.exit_code == 0, r.output
    assert "“step [/bold] phase=decode [red”" in r.stdout and "×32  [/]zz" in r.stdout and "m[red]x.sqlite" in r.stdout
    assert CliRunner().invoke(app, ["compare", str(p), str(EAGER)]).exit_code == 0
    cells = FIXTURES / "ncu" / "h200_llama8b_sweep.parquet"
    r = CliRunner().invoke(app, ["budget", str(p), "--cells", str(cells), "--model", "llama-3.1-8b", "--batch", "1",
                                 "--context", "2048", "--phase", "decode"])
    assert r.exit_code == 0 and "32× [/]zz" in r.stdout, r.output


# --- counted repetitions, refused before they are compiled (found past the fault campaign, issue 30)

@pytest.fixture
def trace(tmp_path):
    return eager_copy(tmp_path)




@pytest.mark.parametrize("pattern,says", [("a{99999999}", "exceeds"), ("(?:a{500}){500}", "multiply"),
                                          ("x{0,99999999}", "exceeds")])
def test_a_counted_repetition_is_refused_before_it_is_compiled(trace, pattern, says):
    t0 = time.perf_counter()
    r = CliRunner().invoke(app, ["analyze", str(trace), "--step-regex", pattern])
    one_line_2(r, says, "--step-regex")
    assert time.perf_counter() - t0 < 60  # it took 40 s and 5 GiB before a MemoryError


def test_a_counted_repetition_in_rules_is_refused(trace, tmp_path):
    rules = tmp_path / "rules.toml"
    rules.write_text('[[rule]]\nclass = "gemm"\npattern = "b{1000000}"\n')
    r = CliRunner().invoke(app, ["analyze", str(trace), "--rules", str(rules)])
    assert r.exit_code == 2 and "exceeds" in r.output and "Traceback" not in r.output, r.output


def test_small_counts_still_work(trace):
    r = CliRunner().invoke(app, ["analyze", str(trace), "--step-regex", r"^step .{3,200}$", "--json"])
    assert r.exit_code == 0, r.output
