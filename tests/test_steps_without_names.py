"""Steps without help from names (docs/DEFINITIONS.md, that section), on the torch-engine and vLLM
captures of fixtures/round5 and fixtures/vllm: layers, whole steps in one capture, phase evidence,
the classes of anonymous and graph kernels, framework op families and the representative step that
the trace's names do not give away, each checked against plain SQL over the same export."""

from __future__ import annotations

import polars as pl

from stepscope.api import open_trace
from tests.conftest import FIXTURES, need, ro

R5 = FIXTURES / "round5"
VLLM = FIXTURES / "vllm"


def _count(path, where: str) -> int:
    return ro(path).execute(f"""SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k
                                JOIN StringIds s ON s.id = k.shortName WHERE {where}""").fetchone()[0]


def test_compiled_step_has_its_eight_layers():
    """torch.compile numbers its kernels per call site (..._rsqrt_11, _12, _13, _14 for the norms
    of alternating layers): compared without the number, the 8-layer step repeats every layer.
    Hand check: one cuDNN SDPA kernel per layer, and 147 kernels = 8 layers x 18 + the final
    norm, the LM head and the argmax."""
    path = need(R5 / "llama8b_decode_compiled_l8.sqlite")
    s = open_trace(path).steps[0]
    per_layer = _count(path, "s.value LIKE 'cudnn_generated_fort_native_sdpa%'")
    assert s.layers == per_layer == 8
    assert s.kernels_per_layer == 18
    tail = _count(path, "s.value IN ('triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_15', "
                        "'nvjet_sm90_tst_256x8_64x6_2x1_v_bz_TNT', 'triton_red_fused_argmax_16')")
    assert s.n_kernels == s.layers * s.kernels_per_layer + tail == 147


def _three_steps_sql(path):
    """Per step, from SQL alone: the host synchronizations (cudaStreamSynchronize after each
    step's D2H copy of the sampled token) cut the capture; a step's kernels are those whose
    launching call starts before its sync and after the previous one."""
    con = ro(path)
    syncs = con.execute("""SELECT r.start, r.end FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s
                           ON s.id = r.nameId WHERE s.value LIKE 'cudaStreamSynchronize%' ORDER BY r.start""").fetchall()
    edges = [0] + [e for _, e in syncs]
    out = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        out.append(con.execute(f"""
            SELECT count(*), sum(CASE WHEN s.value LIKE 'cudnn_generated_fort_native_sdpa%' THEN 1 ELSE 0 END)
            FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName
            JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId
            WHERE r.start > {lo} AND r.start < {hi}""").fetchone())
    d2h = con.execute("SELECT start, end FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE copyKind = 2 ORDER BY start").fetchall()
    return syncs, out, d2h


def test_three_decode_steps_in_one_capture_are_three_steps():
    """One cudaProfilerStart/Stop range, no NVTX, three eager decode steps of Llama-3.2-1B, each
    ending with the sampled token's copy to the host and a sync: three steps of 16 layers."""
    path = need(R5 / "llama1b_decode_3steps_nonvtx.sqlite")
    a = open_trace(path)
    s = a.table
    syncs, per_step, d2h = _three_steps_sql(path)
    assert len(syncs) == len(d2h) == s.height == 3
    assert (s["delimiter"] == "sync").all()
    assert s["n_kernels"].to_list() == [n for n, _ in per_step] == [940, 942, 942]
    # each step has the model's 16 layers (one cuDNN SDPA launch per layer, by SQL)
    assert s["layers"].to_list() == [attn for _, attn in per_step] == [16, 16, 16]
    # each step's last GPU activity is its D2H copy of the sampled token
    assert s["last_end"].to_list() == [e for _, e in d2h]
    # the steps partition the capture: every kernel in exactly one step
    assert s["n_kernels"].sum() == ro(path).execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]


def test_three_decode_steps_without_any_marker_split_the_same_way():
    """The same trace with its profiler start call taken out: a process without markers, whose
    smallest repeat period is a layer (58 kernels); cut into whole steps at its syncs instead."""
    from stepscope.analysis.inventory import analyze_trace
    from stepscope.ingest import read_trace

    path = need(R5 / "llama1b_decode_3steps_nonvtx.sqlite")
    t = read_trace(path, cache=False)
    prof = [i for i, v in t.string_map().items() if v.startswith(("cuProfiler", "cudaProfiler"))]
    t.api = t.api.filter(~pl.col("name_id").is_in(prof))
    s = analyze_trace(t).steps
    _, per_step, _ = _three_steps_sql(path)
    assert (s["delimiter"] == "sync").all()
    assert s["n_kernels"].to_list() == [n for n, _ in per_step]
    assert s.select("layers", "kernels_per_layer").unique().rows() == [(16, 58)]


def _grid(path, like: str) -> set[tuple]:
    return set(ro(path).execute(f"""SELECT DISTINCT gridX, gridY, gridZ, blockY FROM CUPTI_ACTIVITY_KIND_KERNEL k
                                    JOIN StringIds s ON s.id = k.shortName WHERE s.value LIKE '{like}'""").fetchall())


def _cli_inventory(path):
    """What `stepscope analyze` computes: the trace read without grid/block, the evidence
    kernels' launch configuration read from the export on demand."""
    from stepscope.library import load

    return load(path, cache=False)


def test_bare_decode_step_is_decode_by_its_attention_launch():
    """A range named just `step`: the cuDNN SDPA kernel (one name for prefill and decode) runs
    8 blocks (SQL: grid 8x1x1) for 1 token (SQL: the rotary/norm/cache kernels, one block per
    token, grid x = 1): at least one block per token is decode."""
    path = need(R5 / "llama8b_decode_b1_bare.sqlite")
    assert _grid(path, "cudnn_generated_fort_native_sdpa%") == {(8, 1, 1, 1)}
    assert {g[0] for g in _grid(path, "rotary_embedding_kernel")} == {1}
    for inv in (open_trace(path).inventory, _cli_inventory(path)):
        s = inv.steps.row(0, named=True)
        assert s["name"] == "step" and s["phase"] == "decode" and s["phase_by"] == "launch" and s["tokens"] == 1
        att = inv.kernels.filter(pl.col("name").str.starts_with("cudnn_generated_fort_native_sdpa"))
        assert att["class"].to_list() == ["attention_decode"] and att["count"].sum() == 32
        assert "8 blocks for 1 token" in s["phase_detail"]
    assert not any("no recorded phase" in w for w in inv.warnings)


def test_bare_prefill_step_is_prefill_by_its_shape():
    """The same kernel in prefill runs a persistent grid of 132 blocks (= the H200's SMs: it
    decides nothing); 2048 tokens go through the layers (grid x of the per-token kernels) while
    the argmax covers at most grid x * block y = 1 row: only the last token is sampled."""
    path = need(R5 / "llama8b_prefill_b1_bare.sqlite")
    assert _grid(path, "cudnn_generated_fort_native_sdpa%") == {(132, 1, 1, 1)}
    assert {g[0] for g in _grid(path, "rotary_embedding_kernel")} == {2048}
    assert _grid(path, "reduce_kernel") == {(1, 1, 1, 1)}
    for inv in (open_trace(path).inventory, _cli_inventory(path)):
        s = inv.steps.row(0, named=True)
        assert s["phase"] == "prefill" and s["phase_by"] == "shape" and s["tokens"] == 2048
        att = inv.kernels.filter(pl.col("name").str.starts_with("cudnn_generated_fort_native_sdpa"))
        assert att["class"].to_list() == ["attention_prefill"]


def test_phase_evidence_agrees_with_every_recorded_phase():
    """On every committed capture whose step name records its phase (torch engine and vLLM,
    prefill and decode, eager, graph, compiled, TP=2), the evidence alone reaches the same phase."""
    from stepscope.analysis.classify import load_rules
    from stepscope.analysis.phase import phase_evidence

    rules = load_rules()
    paths = sorted(FIXTURES.glob("llama8b_*.sqlite")) + sorted(R5.glob("*.sqlite")) + sorted(VLLM.glob("*.sqlite"))
    seen = set()
    for path in paths:
        inv = open_trace(path).inventory
        names = inv.acts.filter(pl.col("is_kernel")).select(
            "short_id", "demangled_id", *[pl.col(c).cast(pl.String) for c in ("name", "demangled", "class")]
        ).unique(["short_id", "demangled_id"])
        # the trace was read without grid/block: the evidence reads them from the export, as the analysis does
        ev = phase_evidence(inv.acts, inv.steps["step"].to_list(), names, inv.trace.gpus, rules, inv.launch_config)
        j = inv.steps.select("step", "phase").join(ev.select("step", pl.col("phase").alias("ev"), "phase_by"), on="step")
        assert j.height == inv.steps.height, path.name
        assert (j["phase"] == j["ev"]).all(), (path.name, j.rows())
        seen |= set(zip(j["phase"], j["phase_by"]))
    # every rule took part: decode by combine pass and by launch, prefill by shape
    assert {("decode", "combine"), ("decode", "launch"), ("prefill", "shape")} <= seen


def _vllm_rope_sql(path) -> tuple[int, int, int]:
    """(anonymous Inductor kernels between the QKV GEMM and the KV-cache write, the layers'
    reshape_and_cache_flash launches, and all anonymous Inductor kernels) by SQL over launch
    order: the kernels launched after a GEMM and before the next cache write with nothing named
    in between."""
    rows = ro(path).execute("""SELECT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName
                               ORDER BY k.start""").fetchall()
    import re

    anon = re.compile(r"^triton_poi_fused_\d+$")
    between, pending, after_gemm = 0, 0, False
    for (name,) in rows:
        if anon.match(name):
            pending += after_gemm
            continue
        if name.startswith("reshape_and_cache") and after_gemm:
            between += pending
        pending, after_gemm = 0, name.startswith("nvjet")
    caches = sum(1 for (n,) in rows if n.startswith("reshape_and_cache"))
    return between, caches, sum(1 for (n,) in rows if anon.match(n))


def test_vllm_graph_steps_have_the_classes_of_their_eager_twins():
    """vLLM's graph mode compiles the light ops with Inductor; the RoPE kernels come out as
    triton_poi_fused_1..4, named after no op. Placed by their position (between the QKV GEMM and
    the KV-cache write), every graph step has rope, activation, norm and kv_cache_write like its
    eager twin, and the report says which kernels were named by position."""
    for model in ("llama8b_decode_b1", "llama8b_decode_b8", "llama8b_prefill_b1", "qwen7b_decode_b1"):
        eager = open_trace(need(VLLM / f"{model}_eager.sqlite")).inventory
        graph_path = need(VLLM / f"{model}_graph.sqlite")
        graph = open_trace(graph_path).inventory
        ce = dict(eager.classes.select("class", "count").iter_rows())
        cg = dict(graph.classes.select("class", "count").iter_rows())
        for cls in ("rope", "activation", "norm", "kv_cache_write"):
            assert cg.get(cls, 0) > 0 and ce.get(cls, 0) > 0, (model, cls)
        layers = graph.steps["layers"][0]
        between, caches, anonymous = _vllm_rope_sql(graph_path)
        # one RoPE kernel for q and one for k per layer; every anonymous kernel is one of them
        assert cg["rope"] == between == anonymous == 2 * layers == 2 * caches
        assert ce["rope"] == layers and cg["kv_cache_write"] == ce["kv_cache_write"] == layers
        assert set(graph.class_by["class"]) == {"rope"}
        assert graph.class_by["class_by"].str.contains("between gemm and kv_cache_write").all()
        k = graph.kernels.filter(pl.col("name").str.contains(r"^triton_poi_fused_\d+$"))
        assert set(k["class"]) == {"rope"} and k["class_by"].null_count() == 0


def test_anonymous_kernels_take_the_class_their_other_layers_run(tmp_path):
    """When a rule names the first layer's two RoPE kernels (here a user rule, as a descriptive
    Inductor name would), the other 31 layers' anonymous kernels at the same positions of the
    layer pattern take that class from them."""
    path = need(VLLM / "llama8b_decode_b1_graph.sqlite")
    rules = tmp_path / "r.toml"
    rules.write_text('[[rule]]\nclass = "rope"\nfield = "short"\npattern = "^triton_poi_fused_[12]$"\n'
                     '[[position]]\nclass = "activation"\nafter = "^gemm$"\nbefore = "^kv_cache_write$"\n')
    inv = open_trace(path, rules=rules).inventory
    by = dict(zip(inv.class_by["name"], inv.class_by["class_by"]))
    assert set(by) == {"triton_poi_fused_3", "triton_poi_fused_4"}
    assert all(v == "the step's other layers run rope at this position" for v in by.values())
    k = inv.kernels.filter(pl.col("name").is_in(["triton_poi_fused_3", "triton_poi_fused_4"]))
    assert set(k["class"]) == {"rope"} and k["count"].sum() == 2 * 31


OUTERMOST_OP_SQL = """
WITH calls AS (
  SELECT k.correlationId AS corr, r.start AS ls, r.globalTid AS gtid, s.value AS kname
  FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.demangledName
  JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId
       AND ((r.globalTid >> 24) & 16777215) = ((k.globalPid >> 24) & 16777215)
), ops AS (
  SELECT c.corr, c.kname, (SELECT substr(n.text, 1, instr(n.text, ',') - 1) FROM NVTX_EVENTS n
          WHERE n.globalTid = c.gtid AND n.text LIKE 'aten::%' AND c.ls BETWEEN n.start AND n.end
          ORDER BY n.start, n.end DESC LIMIT 1) AS op
  FROM calls c
)
SELECT op, count(*) FROM ops WHERE op IS NOT NULL GROUP BY op
"""


def test_framework_by_op_family_and_launching_aten_op():
    """emit_nvtx wraps every op of the unfused torch-ops decode step in an `aten::` range; the
    outermost one around a launch call is the op the model called. By SQL (the earliest-starting
    aten:: range on the launching thread around each launch call): aten::to, mul, add, pow, cat,
    sub, mean launch only glue, and exactly as many kernels as stepscope attributes to them."""
    path = need(R5 / "llama1b_decode_emit_nvtx.sqlite")
    inv = open_trace(path).inventory
    ops = dict(zip(inv.framework_ops["op"], inv.framework_ops["count"]))
    sql = dict(ro(path).execute(OUTERMOST_OP_SQL).fetchall())
    glue_ops = ("aten::to", "aten::mul", "aten::add", "aten::pow", "aten::cat", "aten::sub", "aten::mean")
    assert {op: ops[op] for op in glue_ops} == {op: sql[op] for op in glue_ops}
    assert set(ops) == set(glue_ops)
    assert inv.framework_ops.row(0, named=True)["op"] == "aten::to"
    fam = dict(zip(inv.framework["family"], inv.framework["count"]))
    n_framework = inv.classes.filter(pl.col("class") == "framework")["count"].item()
    assert sum(fam.values()) == sum(ops.values()) == n_framework == 744
    assert fam["concat"] == _count(path, "s.value LIKE 'CatArrayBatchedCopy%'") == ops["aten::cat"] == 32
    assert fam["reduce"] == ops["aten::mean"] == 33
    doc = open_trace(path).to_dict()["steps"][0]["framework"]
    assert doc["count"] == 744 and doc["families"]["copy"]["count"] == fam["copy"]
    assert doc["ops"][0] == {"op": "aten::to", "family": "copy", "count": ops["aten::to"],
                             "time_ns": inv.framework_ops.row(0, named=True)["time_ns"]}


def test_vllm_bookkeeping_is_the_engine_family():
    path = need(VLLM / "llama8b_decode_b8_eager.sqlite")
    inv = open_trace(path).inventory
    fam = dict(zip(inv.framework["family"], inv.framework["count"]))
    n = _count(path, "s.value IN ('_prepare_pos_seq_lens_kernel', '_combine_sampled_and_draft_tokens_kernel', "
                     "'_gather_block_tables_kernel', '_compute_slot_mappings_kernel', '_post_update_kernel', "
                     "'_get_num_sampled_and_rejected_kernel')")
    assert fam["engine"] == n == 6


def test_one_representative_step_everywhere(tmp_path):
    """Three decode steps: step 0 (940 kernels) is a kind of its own, steps 1 and 2 (942: two
    input updates more) the most common kind. The step that stands for the trace is the median
    by step time of that kind, the lower of two: the faster of steps 1 and 2 (by the table's step
    times). The terminal's verdict and summary line, report, compare and tp all quote it, and
    every figure compare gives is that step's own, not a per-figure median."""
    import re

    from tests.conftest import CliRunner

    from stepscope.analysis.compare import compare
    from stepscope.analysis.diagnosis import diagnose
    from stepscope.analysis.representative import representative
    from stepscope.cli import app
    from stepscope.render.report_data import pick_step

    path = need(R5 / "llama1b_decode_3steps_nonvtx.sqlite")
    inv = open_trace(path).inventory
    s = inv.steps.sort("step")
    assert s["n_kernels"].to_list() == [940, 942, 942]
    t1, t2 = s["step_time_ns"][1], s["step_time_ns"][2]
    want = 1 if (t1, 1) < (t2, 2) else 2
    d = diagnose(inv)
    assert representative(inv, d)["step"] == pick_step(inv, None, d) == want
    row = s.filter(pl.col("step") == want).row(0, named=True)
    a = compare(d, d)["a"]
    assert a["step"] == want and a["steps"] == 3
    assert {k: a[k] for k in ("step_time_ns", "gpu_busy_ns", "idle_ns", "n_kernels")} == \
        {k: row[k] for k in ("step_time_ns", "gpu_busy_ns", "idle_ns", "n_kernels")}
    fw = inv.classes.filter((pl.col("step") == want) & (pl.col("class") == "framework")).row(0, named=True)
    assert a["classes"]["framework"] == {"count": fw["count"], "time_ns": fw["time_ns"]}
    runner = CliRunner()
    out = runner.invoke(app, ["analyze", str(path)], env={"COLUMNS": "300"}).output
    block = out[out.index("2 steps"):]
    ms = f"{row['step_time_ns'] / 1e6:,.3f} ms"
    # the capture's sidecar gives the untraced step first, the traced one (this step's) beside it
    assert re.search(rf"Verdict: decode step ≈ [0-9.,]+ ms untraced \({re.escape(ms)} under nsys\): launch-bound",
                     block)
    assert f"step time {ms}" in block and f"(step {want}: the median by step time of the 2 steps" in block
    md = tmp_path / "r.md"
    assert runner.invoke(app, ["report", str(path), "-o", str(md)]).exit_code == 0
    assert f"step {want} · 3 steps in the trace (the median by step time of the 2 steps of the most common kind" in md.read_text()
    tp = runner.invoke(app, ["tp", str(path)], env={"COLUMNS": "300"}).output
    assert f"projected step: {want}, the median by step time" in tp
