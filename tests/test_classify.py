"""Classification rules on real kernel names, covering every trap of KERNEL_CLASSES.md."""

from __future__ import annotations

import polars as pl
import pytest

from stepscope.analysis.classify import load_rules
from stepscope.api import open_trace
from stepscope.errors import InputError
from tests.conftest import EXTERNAL, FIXTURES, need, ro

RULES = load_rules()

# (short name, demangled name, class). Names are real: from the committed H200 fixtures, the
# foreign exports in ../shared/external, or KERNEL_CLASSES.md's "real names seen" column.
REAL = [
    # trap: FA3 is cutlass::device_kernel<flash::...>; attention must win over "cutlass = GEMM"
    ("device_kernel", "cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<"
     "flash::CollectiveMainloopFwdSm90<2, cute::tuple<cute::C<1>, cute::C<1>, cute::C<1>>>>>>",
     "attention_prefill"),
    ("cutlass_3x_gemm", "void cutlass::device_kernel<cutlass_3x_gemm_bf16_128x128>(T1::Params)", "gemm"),
    # trap: reshape_and_cache_flash_kernel contains "flash" but writes the KV cache
    ("reshape_and_cache_flash_kernel",
     "void vllm::reshape_and_cache_flash_kernel<__nv_bfloat16, __nv_bfloat16, (vllm::Fp8KVCacheDataType)0>"
     "(const T1 *, const T1 *, T2 *, T2 *, const long *, long, long, long, long, int, int, int, const float *, const float *)",
     "kv_cache_write"),
    ("reshape_and_cache_kernel", "reshape_and_cache_kernel", "kv_cache_write"),  # H200 fixture (Triton)
    # trap: splitKreduce_kernel contains "reduce_kernel" but is split-K, not sampling
    ("splitKreduce_kernel", "void cublasLt::splitKreduce_kernel<(int)32, (int)16, int, float, __nv_bfloat16, float, "
     "__nv_bfloat16, (bool)0, float, __nv_bfloat16, __nv_bfloat16, (bool)1, (bool)0, (bool)0>("
     "cublasLt::cublasSplitKParams<T4>, const T3 *, const T5 *, T7 *, const T4 *, const T4 *, const T9 *, "
     "const T5 *, T9 *, void *, long, T4 *, int *, T4 *, T4 *, const T4 *, const T4 *, const T4 *, const T4 *, const T4 *)",
     "splitk_reduce"),
    # the argmax reduce_kernel is told by ArgMaxOps in its demangled name; a mean reduce is glue
    ("reduce_kernel", "void at::native::reduce_kernel<(int)512, (int)1, at::native::ReduceOp<float, "
     "at::native::ArgMaxOps<float>, unsigned int, long, (int)4, (int)4>>(T3)", "sampling"),
    ("reduce_kernel", "void at::native::reduce_kernel<(int)512, (int)1, at::native::ReduceOp<float, "
     "at::native::MeanOps<float, float, float, float>, unsigned int, float, (int)4, (int)4>>(T3)", "framework"),
    # trap: a generic shortName; the demangled name tells silu / add / copy apart
    ("vectorized_elementwise_kernel", "void at::native::vectorized_elementwise_kernel<(int)4, "
     "at::native::silu_kernel(at::TensorIteratorBase &)::[lambda() (instance 1)]::operator ()() const::"
     "[lambda() (instance 8)]::operator ()() const::[lambda(c10::BFloat16) (instance 1)], std::array<char *, "
     "(unsigned long)2>>(int, T2, T3)", "activation"),
    ("vectorized_elementwise_kernel", "void at::native::vectorized_elementwise_kernel<(int)4, "
     "at::native::CUDAFunctor_add<float>, std::array<char *, (unsigned long)3>>(int, T2, T3)", "framework"),
    # torch.compile: fused Triton kernels named after their ops
    ("triton_red_fused_add_mean_mul_pow_rsqrt_0", "triton_red_fused_add_mean_mul_pow_rsqrt_0", "norm"),
    ("triton_poi_fused_mul_silu_1", "triton_poi_fused_mul_silu_1", "activation"),
    # torch.compile (Inductor) of stepscope's torch-ops step (fixtures/round5/llama8b_decode_compiled_l8):
    # RoPE written out from a cos/sin cache (cat, mul, sub), the same fused with the cache write, the
    # cache write by index_copy, RMSNorm as mean of pow then rsqrt; a plain copy stays glue
    ("triton_poi_fused__to_copy_add_cat_index_select_mul_slice_sub_unsqueeze_view_1",
     "triton_poi_fused__to_copy_add_cat_index_select_mul_slice_sub_unsqueeze_view_1", "rope"),
    ("triton_poi_fused__to_copy_add_cat_copy_index_copy_index_select_mul_slice_sub_unsqueeze_view_3",
     "triton_poi_fused__to_copy_add_cat_copy_index_copy_index_select_mul_slice_sub_unsqueeze_view_3", "rope"),
    ("triton_poi_fused__to_copy_copy_index_copy_slice_view_2", "triton_poi_fused__to_copy_copy_index_copy_slice_view_2",
     "kv_cache_write"),
    ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_11", "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_11",
     "norm"),
    ("triton_poi_fused_copy__view_4", "triton_poi_fused_copy__view_4", "framework"),
    ("triton_red_fused_argmax_16", "triton_red_fused_argmax_16", "sampling"),
    # vLLM 0.26 graph mode (fixtures/vllm/*_graph): Inductor names that keep their ops
    ("triton_red_fused__to_copy_embedding_rms_norm_0", "triton_red_fused__to_copy_embedding_rms_norm_0", "norm"),
    ("triton_poi_fused_mul_silu_slice_1", "triton_poi_fused_mul_silu_slice_1", "activation"),
    # the unfused torch-ops step (fixtures/round5/llama1b_*): the KV cache written by index_copy_
    ("index_elementwise_kernel", "void at::native::index_elementwise_kernel<(int)128, (int)4, void "
     "at::native::index_copy_kernel_impl<at::native::OpaqueType<(int)2>>(at::TensorIterator &, long, long, long)"
     "::[lambda(char *, const char *, long) (instance 1)]>(long, T3)", "kv_cache_write"),
    # vLLM 0.26's engine bookkeeping (model runner V2 Triton kernels): input preparation and sampler
    # bookkeeping are glue, not sampling (two of them contain "sampl") and not unknown
    ("_prepare_pos_seq_lens_kernel", "_prepare_pos_seq_lens_kernel", "framework"),
    ("_prepare_prefill_inputs_kernel", "_prepare_prefill_inputs_kernel", "framework"),
    ("_combine_sampled_and_draft_tokens_kernel", "_combine_sampled_and_draft_tokens_kernel", "framework"),
    ("_gather_block_tables_kernel", "_gather_block_tables_kernel", "framework"),
    ("_compute_slot_mappings_kernel", "_compute_slot_mappings_kernel", "framework"),
    ("_apply_write_kernel", "_apply_write_kernel", "framework"),
    ("_post_update_kernel", "_post_update_kernel", "framework"),
    ("_get_num_sampled_and_rejected_kernel", "_get_num_sampled_and_rejected_kernel", "framework"),
    ("_gumbel_sample_kernel", "_gumbel_sample_kernel", "sampling"),
    # round nine (fixtures/models, vLLM 0.26): the MoE layer's routing and expert GEMMs. trap:
    # topkGating contains "topk" and is the router's, not sampling
    ("fused_moe_kernel", "fused_moe_kernel", "moe_gemm"),
    ("topkGating", "void vllm::moe::topkGating<(int)8, (int)128, (int)4, (int)16, (int)32, int, __nv_bfloat16, "
     "(vllm::moe::ScoringFunc)0>(const T7 *, const bool *, float *, int, T6 *, int *, int, int, int, bool, "
     "const float *, double)", "moe_routing"),
    ("moe_align_block_size_kernel", "void vllm::moe::moe_align_block_size_kernel<int>(const T1 *, int *, int *, "
     "int *, int *, int, int, int, int, unsigned long, int *, int, int, bool)", "moe_routing"),
    ("moe_align_block_size_small_batch_expert_kernel", "void vllm::moe::moe_align_block_size_small_batch_expert_"
     "kernel<int, (int)256>(const T1 *, int *, int *, int *, int *, int, int, unsigned long, int, int, bool)",
     "moe_routing"),
    ("count_and_sort_expert_tokens_kernel", "void vllm::moe::count_and_sort_expert_tokens_kernel<int>(const T1 *, "
     "int *, int *, int *, unsigned long, int, int, int, bool)", "moe_routing"),
    ("moe_sum_vec_kernel", "void vllm::moe::moe_sum_vec_kernel<c10::BFloat16, int, (int)8, (bool)0>(T1 *, const "
     "T1 *, long, int, long, long, const T2 *, const int *, long, long)", "moe_routing"),
    # vLLM's source (csrc/moe, fused_moe/): grouped top-k, permute, the other expert GEMMs; trap:
    # the CUTLASS grouped GEMM and DeepGEMM's m-grouped GEMM contain cutlass / gemm
    ("grouped_topk_kernel", "grouped_topk_kernel", "moe_routing"),
    # triton_kernels (gpt-oss): matmul_ogs contains "matmul" and is the experts' GEMM
    ("_matmul_ogs", "_matmul_ogs", "moe_gemm"),
    ("_p_matmul_ogs", "_p_matmul_ogs", "moe_gemm"),
    ("_combined_routing_compute", "_combined_routing_compute", "moe_routing"),
    ("_sum_bitmatrix_rows", "_sum_bitmatrix_rows", "moe_routing"),
    ("expandInputRowsKernel", "expandInputRowsKernel", "moe_routing"),
    ("fused_moe_kernel_gptq_awq", "fused_moe_kernel_gptq_awq", "moe_gemm"),
    ("device_kernel", "void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cutlass::gemm::"
     "GroupProblemShape<cute::tuple<int, int, int>>, …>>(T1::Params)", "moe_gemm"),
    ("sm90_fp8_gemm_1d2d_impl", "void deep_gemm::sm90_fp8_gemm_1d2d_impl<…, (deep_gemm::GemmType)1, "
     "deep_gemm::GemmType::MGroupedContiguous>(…)", "moe_gemm"),
    # MLA (DeepSeek-V2-Lite on FLASH_ATTN_MLA): the latent cache write, the chunked prefill's merge
    ("concat_and_cache_mla_kernel", "void vllm::concat_and_cache_mla_kernel<__nv_bfloat16, __nv_bfloat16, "
     "(vllm::Fp8KVCacheDataType)0>(const T1 *, const T1 *, T2 *, const long *, int, int, int, int, int, int, int, "
     "const float *)", "kv_cache_write"),
    ("merge_attn_states_kernel", "void vllm::merge_attn_states_kernel<__nv_bfloat16, __nv_bfloat16, (unsigned "
     "int)128, (bool)0>(T2 *, float *, const T1 *, const float *, const T1 *, const float *, unsigned int, "
     "unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, const float *)", "attention_prefill"),
    ("flash_fwd_splitkv_mla_kernel", "flash_fwd_splitkv_mla_kernel", "attention_decode"),  # FlashMLA (source)
    ("_fwd_grouped_kernel_stage1", "_fwd_grouped_kernel_stage1", "attention_decode"),  # Triton MLA decode
    # FP8 (llama-3.1-8b-fp8): trap: Inductor's fused per-token quantization holds "cutlass_scaled_mm"
    # in its name and is a Triton reduction, never the GEMM; vLLM's quant kernels; the scaled-mm is GEMM
    ("triton_red_fused__to_copy_abs_clamp_cutlass_scaled_mm_div_fused_add_rms_norm_max_mul_reciprocal_unsqueeze_1",
     "triton_red_fused__to_copy_abs_clamp_cutlass_scaled_mm_div_fused_add_rms_norm_max_mul_reciprocal_unsqueeze_1",
     "quantization"),
    ("triton_red_fused__to_copy_abs_clamp_cutlass_scaled_mm_div_max_mul_reciprocal_silu_slice_unsqueeze_2",
     "triton_red_fused__to_copy_abs_clamp_cutlass_scaled_mm_div_max_mul_reciprocal_silu_slice_unsqueeze_2",
     "quantization"),
    ("segmented_max_reduction_strided", "void vllm::segmented_max_reduction_strided<c10::BFloat16, "
     "c10::Float8_e4m3fn>(float *, const T1 *, int, long, long)", "quantization"),
    ("scaled_fp8_quant_kernel_strided_dynamic", "void vllm::scaled_fp8_quant_kernel_strided_dynamic<c10::BFloat16, "
     "c10::Float8_e4m3fn>(T2 *, const T1 *, const float *, int, long, long)", "quantization"),
    ("device_kernel", "void cutlass::device_kernel<vllm::cutlass_3x_gemm_sm90_fp8<cutlass::float_e4m3_t, "
     "cutlass::bfloat16_t, vllm::c3x::ScaledEpilogue, cute::tuple<cute::C<(int)128>, cute::C<(int)128>, "
     "cute::C<(int)128>>>>(T1::Params)", "gemm"),
    # trap: vLLM's fused norm + quant kernels (source) quantize: not norm
    ("rms_norm_dynamic_per_token_quant_kernel", "rms_norm_dynamic_per_token_quant_kernel", "quantization"),
    ("per_token_group_quant_8bit_kernel", "per_token_group_quant_8bit_kernel", "quantization"),
    # speculative decoding (vLLM's rejection sampler): trap: contains "sampl"
    ("rejection_greedy_sample_kernel", "rejection_greedy_sample_kernel", "spec_decode"),
    ("_rejection_sample_kernel", "_rejection_sample_kernel", "spec_decode"),
    # vLLM's sampler processors and a model runner kernel, in every round-nine warm-up
    ("_min_p_kernel", "_min_p_kernel", "sampling"),
    ("_penalties_kernel", "_penalties_kernel", "sampling"),
    ("_compute_slot_mapping_kernel", "_compute_slot_mapping_kernel", "framework"),
    ("triton_", "triton_", "framework"),  # torch.compile's autotuning runs, start-up
    # vLLM custom ops
    ("fused_add_rms_norm_kernel", "void vllm::fused_add_rms_norm_kernel<c10::BFloat16, (int)8>(T1 *, T1 *, "
     "const T1 *, float, int, int)", "norm"),
    ("rotary_embedding_kernel", "void vllm::rotary_embedding_kernel<c10::BFloat16, (bool)1>(const long *, T1 *, "
     "T1 *, const T1 *, int, long, long, int, int, int)", "rope"),
    ("act_and_mul_kernel", "void vllm::act_and_mul_kernel<c10::BFloat16, &vllm::silu_kernel<c10::BFloat16>, "
     "(bool)1>(T1 *, const T1 *, int)", "activation"),
    # decode attention, its combine, cuDNN's reduction pass
    ("flash_fwd_splitkv_kernel", "void flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4, "
     "false, false, cutlass::bfloat16_t, Flash_kernel_traits<128, 64, 128, 4, cutlass::bfloat16_t>>, false, "
     "false, false, false, true, true, false, false>(flash::Flash_fwd_params)", "attention_decode"),
    ("lean_reduction_kernel", "void cudnn::fusion::lean_reduction_kernel<float, float, float, (int)128, (int)4>"
     "(cudnn::fusion::LeanReductionParams)", "attention_decode"),
    # GEMMs: Hopper nvjet, cuBLAS xmma (incl. its in-kernel split-K), A100 ampere
    ("nvjet_sm90_tst_64x8_64x16_2x1_v_bz_splitK_TNT", "nvjet_sm90_tst_64x8_64x16_2x1_v_bz_splitK_TNT", "gemm"),
    ("sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize64x256x8_stage3_warpsize1x4x1_ffma_aligna4_alignc4_execute_split_k_kernel__5x_cublas",
     "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize64x256x8_stage3_warpsize1x4x1_ffma_aligna4_alignc4_execute_split_k_kernel__5x_cublas",
     "gemm"),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<(unsigned long)4096>)", "comm"),
    ("indexSelectSmallIndex", "void at::native::indexSelectSmallIndex<c10::BFloat16, long, unsigned int, (int)2, "
     "(int)2, (int)-2, (bool)1>(cuda::detail::TensorInfo<T1, T3>, cuda::detail::TensorInfo<const T1, T3>, "
     "cuda::detail::TensorInfo<const T2, T3>, int, int, T3, long)", "embedding"),
    # a bare softmax may be unfused attention math or sampling: not guessed, listed as other
    ("softmax_warp_forward", "void <unnamed>::softmax_warp_forward<float, float, float, (int)6, (bool)0, (bool)0>"
     "(T2 *, const T1 *, int, int, int, const bool *, int, bool)", "other"),
    ("par_ranged2d_kernel", "void clover::par_ranged2d_kernel<build_field(global_variables &)::[lambda(int, int) "
     "(instance 1)]>(clover::Range2d, T1)", "other"),
]


@pytest.mark.parametrize("short,demangled,cls", REAL, ids=[f"{r[0][:28]}->{r[2]}" for r in REAL])
def test_real_names(short, demangled, cls):
    assert RULES.classify_name(short, demangled) == cls


def test_every_fixture_kernel_name_is_classified():
    """No kernel name of the H200 fixtures falls to `other`."""
    for path in sorted(FIXTURES.glob("llama8b_*.sqlite")):
        k = open_trace(path).inventory.kernels
        assert k.filter(pl.col("class") == "other").is_empty(), path.name


ROUND5 = sorted((FIXTURES / "round5").glob("*.sqlite")) + sorted((FIXTURES / "vllm").glob("*.sqlite"))


@pytest.mark.parametrize("path", ROUND5, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_fifth_round_fixtures_leave_nothing_unclassified(path):
    """Real vLLM 0.26 and torch-engine steps: no kernel falls to `other`; the count of vLLM's
    bookkeeping kernels (their names, by SQL) is what the class framework holds of them."""
    inv = open_trace(path).inventory
    assert inv.kernels.filter(pl.col("class") == "other").is_empty()
    n_sql = ro(path).execute("""
        SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName
        WHERE s.value IN ('_prepare_pos_seq_lens_kernel', '_prepare_prefill_inputs_kernel', '_post_update_kernel',
                          '_combine_sampled_and_draft_tokens_kernel', '_gather_block_tables_kernel',
                          '_compute_slot_mappings_kernel', '_apply_write_kernel', '_get_num_sampled_and_rejected_kernel')
    """).fetchone()[0]
    ours = inv.acts.filter(pl.col("name").cast(pl.String).str.contains(
        "^_(prepare_|post_update|combine_sampled|gather_block|compute_slot|apply_write|get_num_sampled)"))
    assert ours.height == n_sql and (ours["class"] == "framework").all()


def test_same_attention_kernel_is_prefill_or_decode_by_step_shape():
    """One kernel name, two step names: the phase in the step's name decides the class."""
    name = "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1_cga1x1x1_kernel0_0"
    assert RULES.classify_name(name, name) == "attention_prefill"  # hint only
    decode = open_trace(need(FIXTURES / "llama8b_decode_b1_eager.sqlite"))
    prefill = open_trace(need(FIXTURES / "llama8b_prefill_b1_eager.sqlite"))
    d = decode.inventory.kernels.filter(pl.col("name").str.starts_with("cudnn_generated_fort_native_sdpa"))
    p = prefill.inventory.kernels.filter(pl.col("name").str.starts_with("cudnn_generated_fort_native_sdpa"))
    assert set(d["class"]) == {"attention_decode"} and set(p["class"]) == {"attention_prefill"}


def test_nvtx_module_ranges_beat_the_kernel_name(tmp_path):
    """emit_nvtx-style ranges (aten::pow/mean/rsqrt of an unfused RMSNorm) attribute their
    kernels to `norm`; the independent count is SQL over kernels whose launching call sits in
    such a range on the same thread."""
    path = need(EXTERNAL / "nsysai_h100_2gpu_1s.sqlite")
    rules = tmp_path / "r.toml"
    rules.write_text('[[nvtx]]\nclass = "norm"\npattern = "^aten::(pow|mean|rsqrt),"\n')
    plain = open_trace(path).inventory.acts
    attributed = open_trace(path, rules=rules).inventory.acts
    moved = plain.join(attributed.select("row", pl.col("class").alias("new")), on="row").filter(
        (pl.col("class") != "norm") & (pl.col("new") == "norm"))
    n_sql = ro(path).execute("""
        SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k
        JOIN StringIds d ON d.id = k.demangledName
        JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId
             AND ((r.globalTid >> 24) & 16777215) = ((k.globalPid >> 24) & 16777215)
        WHERE d.value NOT LIKE '%rsqrt%' AND EXISTS (
            SELECT 1 FROM NVTX_EVENTS n WHERE n.globalTid = r.globalTid AND r.start BETWEEN n.start AND n.end
              AND (n.text LIKE 'aten::pow,%' OR n.text LIKE 'aten::mean,%' OR n.text LIKE 'aten::rsqrt,%'))
    """).fetchone()[0]
    assert moved.height == n_sql > 0


def test_user_rules_come_first_and_bad_rules_fail_clearly(tmp_path):
    f = tmp_path / "r.toml"
    f.write_text('[[rule]]\nclass = "norm"\nfield = "short"\npattern = "^par_ranged2d_kernel$"\n')
    r = load_rules(f)
    assert r.classify_name("par_ranged2d_kernel", "x") == "norm"
    f.write_text('[[rule]]\nclass = "gemm"\npattern = "nvjet(("\n')
    with pytest.raises(InputError, match="bad regex"):
        load_rules(f)
    f.write_text('[[rule]]\nclass = "gpu_magic"\npattern = "x"\n')
    with pytest.raises(InputError, match="unknown class"):
        load_rules(f)
    f.write_text("not toml [[[")
    with pytest.raises(InputError, match="not a valid TOML"):
        load_rules(f)


def test_names_met_before_are_labelled_from_the_rule_sets_memo(monkeypatch):
    """A long run's windows meet the same names again: a rule set labels each distinct name once
    (rules.memo: kernel classes and framework families alike), and a name labelled before gets
    the label a fresh rule set gives it, without a pattern searched again."""
    import sqlite3

    import stepscope.analysis.classify as classify
    from stepscope.analysis.framework import family_table
    from tests.conftest import gunzipped

    path = gunzipped(need(FIXTURES / "models" / "qwen3-30b-a3b_r32_graph_plain.sqlite.gz"))
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    names = pl.DataFrame(con.execute(
        "SELECT DISTINCT k.shortName, k.demangledName, s.value, d.value FROM CUPTI_ACTIVITY_KIND_KERNEL k "
        "JOIN StringIds s ON s.id = k.shortName JOIN StringIds d ON d.id = k.demangledName").fetchall(),
        schema={"short_id": pl.Int32, "demangled_id": pl.Int32, "name": pl.String, "demangled": pl.String},
        orient="row").sort("short_id", "demangled_id")
    con.close()
    assert names.height > 40
    first, rest = names.head(names.height // 2), names.tail(names.height - names.height // 3)  # they overlap
    fresh = load_rules()  # (load_rules may hand back one RuleSet for every call: its memo emptied)
    fresh.memo.clear()
    want = {"class": classify.classify_names(names, fresh)["class"], "family": family_table(names, fresh)["family"]}
    rules = load_rules()
    rules.memo.clear()
    classify.classify_names(first, rules), family_table(first, rules)
    assert {k: v.height for k, v in rules.memo.items()} == {"class": first.height, "family": first.height}
    got = {"class": classify.classify_names(names, rules)["class"], "family": family_table(names, rules)["family"]}
    for label in want:
        assert got[label].to_list() == want[label].to_list(), label
        assert rules.memo[label].height == names.height  # each name once
    assert set(want["class"].to_list()) - {"other"} and set(want["family"].to_list()) - {"other"}

    def searched(*a, **k):
        raise AssertionError("a name met before was matched again")

    monkeypatch.setattr(classify, "first_match", searched)
    assert classify.classify_names(rest, rules)["class"].to_list() == want["class"].tail(rest.height).to_list()
    assert family_table(rest, rules)["family"].to_list() == want["family"].tail(rest.height).to_list()
