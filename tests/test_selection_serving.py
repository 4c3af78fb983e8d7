"""--steps slowest, top:N, kind:…, last (issue 33, item 6) on the real 48-request serving runs
(fixtures/serving/), checked against plain SQL over the export's NVTX ranges and against the
steps of `analyze --json`."""

from __future__ import annotations

import json
import re
import sqlite3

import pytest
from typer.testing import CliRunner

from conftest import SERVING, gunzipped
from conftest import CliRunner as BoundaryRunner
from stepscope import library
from stepscope.cli import app
from stepscope.errors import InputError
from stepscope.selection import check_steps, parse_steps

STEP_NAME = re.compile(r"execute_context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)")
GRAPH = SERVING / "llama-3.1-8b_serve_r48_s0_graph.sqlite.gz"
_INV = {}


def inv():
    if "g" not in _INV:
        _INV["g"] = library.load(gunzipped(GRAPH), None, None, cache=False)
    return _INV["g"]


def sql_names(path) -> list[str]:
    """The execute_context range names in time order (plain SQL over NVTX_EVENTS)."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    rows = con.execute("""SELECT coalesce(n.text, s.value) FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId
                          WHERE coalesce(n.text, s.value) LIKE 'execute_context%' ORDER BY n.start""").fetchall()
    con.close()
    return [r[0] for r in rows]


def json_steps(spec: str) -> list[dict]:
    r = CliRunner().invoke(app, ["analyze", str(gunzipped(GRAPH)), "--json", "--no-cache", "--steps", spec])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)["steps"]


def test_top_and_slowest_are_the_largest_step_times_of_all_steps():
    all_steps = json_steps("all")
    by_time = sorted(all_steps, key=lambda s: (-s["step_time_ns"], s["index"]))
    want = sorted(s["index"] for s in by_time[:3])
    got = json_steps("top:3")
    assert [s["index"] for s in got] == want
    assert min(s["step_time_ns"] for s in got) >= max(s["step_time_ns"] for s in by_time[3:])
    assert [s["index"] for s in json_steps("slowest")] == [by_time[0]["index"]]
    assert [s["index"] for s in json_steps("last")] == [max(s["index"] for s in all_steps)]


def test_kind_mixed_is_the_steps_with_prompt_chunks_and_decodes_in_plain_sql():
    names = [n for n in sql_names(gunzipped(GRAPH))]
    mixed_names = [n for n in names if (m := STEP_NAME.search(n)) and int(m[1]) > 0 and int(m[3]) > 0]
    assert len(mixed_names) > 10  # the run holds chunked-prefill steps
    steps = inv().steps
    picked = parse_steps("kind:mixed", steps)
    got = steps.filter(steps["step"].is_in(picked))["name"].to_list()
    # every step of the run is one execute_context range: the same names, in the same order
    assert sorted(got) == sorted(n for n in mixed_names if n in set(steps["name"].to_list()))
    assert len(got) == len(mixed_names)
    # case and spacing do not matter; every word must occur
    assert parse_steps("kind:MIXED", steps) == picked
    full = parse_steps("kind:decode·full", steps)
    dec = parse_steps("kind:decode", steps)
    assert full and set(full) <= set(dec) and not set(dec) & set(picked)
    f = steps.filter(steps["step"].is_in(full))
    assert set(f["graph_mode"].to_list()) == {"full"} and set(f["phase"].to_list()) == {"decode"}
    # 17-32 (ASCII dash) reads as the label's 17–32; a union with a range keeps step order
    big = parse_steps("kind:decode 17-32", steps)
    assert big and set(steps.filter(steps["step"].is_in(big))["requests"].to_list()) <= set(range(17, 33))
    u = parse_steps(f"0,kind:decode 17-32,top:2", steps)
    assert u == sorted(set([0] + big + parse_steps("top:2", steps)))


@pytest.mark.parametrize("spec,needle", [
    ("top:0", "top:N takes a step count"), ("top:x", "top:N takes a step count"),
    ("kind:", "kind: takes the words"), ("slowestt", "--steps takes"),
])
def test_bad_selections_fail_before_the_trace_is_read(spec, needle):
    with pytest.raises(InputError, match=needle):
        check_steps(spec)


def test_a_kind_that_no_step_has_is_one_line_naming_the_kinds():
    with pytest.raises(InputError) as e:
        parse_steps("kind:prefill·piecewise", inv().steps)
    assert "no step of kind 'prefill piecewise'" in str(e.value) and "decode · full" in str(e.value)
    # the command line through main()'s boundary (an exception past it fails here)
    p = BoundaryRunner().invoke(app, ["analyze", str(gunzipped(GRAPH)), "--no-cache", "--steps", "kind:bogus"])
    assert p.exception is None or isinstance(p.exception, SystemExit), repr(p.exception)
    assert p.exit_code != 0 and "no step of kind 'bogus'" in p.stderr and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
