"""Captures whose CUDA graphs are recorded whole (nsys's default --cuda-graph-trace=graph): the
kernels inside a graph are no rows of the trace, so `compare` against a node-level twin says so
instead of calling them removed or the traces different models, and `tp` refuses to project a
width from a step whose graphs it cannot see into. The twins are one long-prompt llama-3.2-1b run
captured both ways on the H200 (fixtures/models, tenth round); which rows each holds is counted in
plain SQL."""

from __future__ import annotations

import json
import sqlite3

import pytest

from stepscope.cli import app
from tests.conftest import FIXTURES, CliRunner, gunzipped, sha256

GRAPH = FIXTURES / "models" / "llama-3.2-1b_r16_long_graph_plain.sqlite.gz"
NODE = FIXTURES / "models" / "llama-3.2-1b_r16_long_node_plain.sqlite.gz"


def _rows(path, sql: str) -> int:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return con.execute(sql).fetchone()[0]
    finally:
        con.close()


@pytest.fixture(scope="module")
def twins():
    graph, node = gunzipped(GRAPH), gunzipped(NODE)
    # graph level: graph launches are rows of their own, no kernel is a graph node; node level: the reverse
    assert _rows(graph, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_GRAPH_TRACE") > 0
    assert _rows(graph, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE graphNodeId IS NOT NULL") == 0
    assert _rows(node, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE graphNodeId IS NOT NULL") > 0
    return graph, node


@pytest.mark.parametrize("order", ["node_first", "graph_first"])
def test_compare_names_the_graph_level_side_not_another_model(twins, order):
    graph, node = twins
    a, b = (node, graph) if order == "node_first" else (graph, node)
    r = CliRunner().invoke(app, ["compare", str(a), str(b), "--json", "--no-cache"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    side = "B" if order == "node_first" else "A"
    assert doc["a"]["graph_level"] is (side == "A") and doc["b"]["graph_level"] is (side == "B")
    texts = " ".join(w if isinstance(w, str) else json.dumps(w) for w in doc["warnings"])
    assert f"{side} records its CUDA graphs whole" in texts
    assert "different models" not in texts and "share only" not in texts
    # the kernel counts are said to count each graph as one row on that side
    assert f"({side} counts each CUDA graph as one row)" in doc["verdict"]
    # on the terminal, the names the graph-level side does not show are not called removed
    t = CliRunner().invoke(app, ["compare", str(a), str(b), "--no-cache"], env={"COLUMNS": "200"})
    assert t.exit_code == 0
    flat = " ".join(t.output.split())
    assert ("kernels not recorded in B (inside its CUDA graphs" in flat) is (side == "B")
    assert ("kernels in B, not recorded in A" in flat) is (side == "A")
    # (A's graph replay rows are B's removals when A is the graph-level side: that much is true)
    assert ("kernels removed in B" in flat) is (side == "A")


def test_tp_refuses_a_step_of_graphs_recorded_whole(twins):
    graph, node = twins
    before = sha256(graph)
    r = CliRunner().invoke(app, ["tp", str(graph), "--no-cache"])
    assert r.exit_code == 2
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert len(lines) == 1 and "recorded whole (--cuda-graph-trace=graph)" in lines[0]
    assert "--cuda-graph-trace=node" in lines[0] and "Traceback" not in r.output
    assert sha256(graph) == before
    # the node-level twin of the same run projects, in graph mode (its graphs' kernels are rows)
    ok = CliRunner().invoke(app, ["tp", str(node), "--json", "--no-cache"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout)["mode"] == "graph"


def test_steps_replaying_graphs_recorded_whole_get_no_graph_what_if(twins):
    """A step that already replays CUDA graphs gets no 'CUDA graphs would cut it' (its predicted
    graph step is null), whether its graphs' kernels are rows (node level) or each graph is one
    row (graph level, class cuda_graph): the graph-level capture's steps without a prediction are
    exactly those its node-level twin of the same run knows as replays by their node rows."""
    graph, node = twins

    def doc(path):
        r = CliRunner().invoke(app, ["analyze", str(path), "--json", "--steps", "all", "--no-cache"])
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)

    g, n = doc(graph), doc(node)
    assert len(g["steps"]) == len(n["steps"]) == 89
    none_g = [s["index"] for s in g["steps"] if s["floors"]["predicted_graph_step_time_ns"] is None]
    none_n = [s["index"] for s in n["steps"] if s["floors"]["predicted_graph_step_time_ns"] is None]
    whole = [s["index"] for s in g["steps"] if "cuda_graph" in s["classes"]]
    assert none_g == none_n == whole and len(whole) == 77
    # the eager prefill steps between them keep their what-if
    assert all(s["floors"]["predicted_graph_step_time_ns"] for s in g["steps"] if s["index"] not in whole)
    t = CliRunner().invoke(app, ["analyze", str(graph), "--kinds", "--no-cache"], env={"COLUMNS": "200"})
    verdicts = [x for x in t.output.splitlines() if x.startswith("Verdict:") and "cuda_graph holds" in x]
    assert verdicts and not [v for v in verdicts if "CUDA graphs would cut" in v]
