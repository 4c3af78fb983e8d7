"""A step's tokens and phase from the trace alone, on the MoE, FP8 and MLA captures (no step
names): the tokens are the grid of the KV-cache write (one block per token by construction),
not Inductor's norm reductions (two rows per block at hidden size 2048) nor an MoE layer's
act_and_mul (tokens x top-k rows); MLA's prefill runs FA3's split-KV combine too, and is
prefill. Checked against plain SQL over each file and against the workload the engine logged."""

from __future__ import annotations

import json
import re
import sqlite3

import polars as pl
import pytest

from stepscope.api import open_trace
from tests.conftest import FIXTURES, gunzipped

MODELS = {"qwen3": ("qwen3-30b-a3b_r32_graph_plain", "reshape_and_cache_flash_kernel"),
          "deepseek": ("deepseek-v2-lite_r32_graph_plain", "concat_and_cache_mla_kernel"),
          "fp8": ("llama-3.1-8b-fp8_r32_graph_plain", "reshape_and_cache_flash_kernel")}


def _workload(stem: str) -> dict:
    log = (FIXTURES / "models" / f"{stem}.engine.log").read_text()
    return json.loads(re.search(r"stepscope-engine: result=(\{.*\})", log).group(1))["workload"]


@pytest.fixture(scope="module", params=sorted(MODELS))
def case(request):
    stem, cache_kernel = MODELS[request.param]
    path = gunzipped(FIXTURES / "models" / f"{stem}.sqlite.gz")
    return request.param, stem, cache_kernel, path, open_trace(path, cache=False).inventory


def _cache_write_grid(path, cache_kernel, steps: pl.DataFrame) -> dict[int, int]:
    """Per step: the grid x of its KV-cache writes (all equal within a step), in SQL."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    out = {}
    for step, b, e in steps.select("step", "step_begin", "step_end").iter_rows():
        g = con.execute("SELECT DISTINCT k.gridX FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName "
                        "WHERE s.value = ? AND k.start >= ? AND k.start < ?", (cache_kernel, b, e)).fetchall()
        assert len(g) == 1, (step, g)
        out[step] = g[0][0]
    return out


def test_tokens_are_the_cache_writes_grid(case):
    name, stem, cache_kernel, path, inv = case
    grid = _cache_write_grid(path, cache_kernel, inv.steps)
    got = dict(inv.steps.select("step", "tokens").iter_rows())
    assert got == grid


def test_tokens_through_the_model_are_the_workloads(case):
    """Every prompt token once and every output token but each request's last once, plus the
    padding of the replayed decode graphs (vLLM pads a batch to its capture size): within 1 %."""
    name, stem, cache_kernel, path, inv = case
    w = _workload(stem)
    want = w["prompt_tokens"] + w["output_tokens"] - w["requests"]
    total = inv.steps["tokens"].sum()
    assert want <= total <= 1.01 * want


def test_prompt_steps_are_prefill(case):
    """The steps whose cache write holds the 2048-token budget (the prompt chunks, in SQL) are
    prefill, whatever split-KV combine ran beside them; a step of one token per sampled
    sequence is decode."""
    name, stem, cache_kernel, path, inv = case
    grid = _cache_write_grid(path, cache_kernel, inv.steps)
    phase = dict(inv.steps.select("step", "phase").iter_rows())
    full = [s for s, g in grid.items() if g == 2048]
    assert len(full) == 10
    assert all(phase[s] == "prefill" for s in full)
    small = [s for s, g in grid.items() if g <= 32]
    assert small and all(phase[s] == "decode" for s in small)
