"""A step's phase (prefill or decode) from the trace itself, when its name records none.

Prefill and decode often run the same attention kernel, so its name cannot tell them apart;
the step's shape can (docs/DEFINITIONS.md, "Phase evidence"). Rules, in order; the first that
decides names itself in `phase_by`:

  name     the step's NVTX name (phase=..., vLLM's execute_context counts): not evidence, a record
  combine  a split-KV combine pass ran in the step: decode's way of spreading one query over
           the KV cache (unless the step's shape shows twice as many tokens as sampled rows or
           more: FA3 splits a prompt's KV too, as vLLM's MLA prefill does; then `shape` decides)
  launch   the attention kernel's launch configuration against the step's tokens:
           FA2-layout grids count query tiles per head and sequence (> 1: prefill); otherwise
           at least one attention block per token is decode (one query row per sequence), and
           fewer blocks than tokens on a grid below the GPU's SM count is prefill (a block's
           query tile spans several tokens of one sequence); a grid at the SM count is a
           persistent kernel and decides nothing
  shape    tokens through the layers against sequences sampled: more tokens than sampled rows
           is prefill (only each sequence's last token is sampled); one token is decode

Tokens per step come from kernels launched with one block per token (vLLM's custom ops,
Inductor's row reductions: grid x), or, as an upper bound, from cuBLASLt's skinny GEMM tiles
(`nvjet_…_64x8_…`: at most 8 tokens). Every figure is read per step from a handful of kernels
(the `[phase]` patterns of rules.toml); the decision loops over steps, never over kernels.
"""

from __future__ import annotations

import re

import polars as pl

from stepscope.analysis.classify import ATTENTION, RuleSet

PHASE_SCHEMA = {"step": pl.Int64, "phase": pl.String, "phase_by": pl.String, "phase_detail": pl.String,
                "tokens": pl.Int64}
# a GEMM tile this narrow is chosen for few tokens: its width bounds the step's tokens
SKINNY_TILE = 16
LAUNCH_COLS = ("grid_x", "grid_y", "grid_z", "block_y")


def roles(names: pl.DataFrame, rules: RuleSet) -> pl.DataFrame:
    """(short_id, demangled_id, role, tile_n, label) for the kernel names that carry phase
    evidence: role attention | combine | per_token | rows | rows_bound | query_tiles | gemm_tile;
    label: the name to quote (a combine pass by the words that matched: FA3's short name is
    just `device_kernel`)."""
    out = []
    pat = {k: rules.phase_pattern(k) for k in ("combine", "per_token", "per_token_exact", "rows", "rows_bound",
                                               "query_tiles", "gemm_tile")}

    def hit(key, short, dem):
        p = pat[key]
        return p is not None and bool(p.search(short) or p.search(dem))

    for r in names.iter_rows(named=True):
        short, dem = r["name"] or "", r["demangled"] or r["name"] or ""
        role, tile_n, label = None, None, short
        if hit("combine", short, dem):
            role = "combine"
            label = (pat["combine"].search(short) or pat["combine"].search(dem)).group(0)
        elif hit("query_tiles", short, dem):
            role = "query_tiles"
        elif r["class"] in ATTENTION:
            role = "attention"
        elif hit("per_token_exact", short, dem):
            role = "per_token_exact"
        elif hit("per_token", short, dem):
            role = "per_token"
        elif hit("rows", short, dem):
            role = "rows"
        elif hit("rows_bound", short, dem):
            role = "rows_bound"
        elif r["class"] == "gemm" and pat["gemm_tile"] is not None:
            m = pat["gemm_tile"].search(short) or pat["gemm_tile"].search(dem)
            if m:
                role, tile_n = "gemm_tile", int(m.group(2))
        if role is not None:
            out.append((r["short_id"], r["demangled_id"], role, tile_n, label))
    return pl.DataFrame(out, schema={"short_id": pl.Int32, "demangled_id": pl.Int32, "role": pl.String,
                                     "tile_n": pl.Int64, "label": pl.String}, orient="row")


def main_attention(k: pl.DataFrame) -> pl.DataFrame:
    """(step, name, short_id) of each step's main attention kernel among the evidence kernels
    `k`: the attention name with the most time (as step_evidence chooses it, before any grid is
    known: the time decides, the launch configuration is only read for it)."""
    att = k.filter(pl.col("role").is_in(["attention", "query_tiles"]))
    chosen = (att.group_by("step", "name", "role").agg((pl.col("end") - pl.col("start")).sum().alias("t"))
              .sort("step", "t", "name", descending=[False, True, False]).group_by("step", maintain_order=True).first()
              .select("step", "name", "role"))
    return att.join(chosen, on=["step", "name", "role"], how="semi").select("step", "name", "short_id").unique()


def step_evidence(k: pl.DataFrame, sm_count: dict[int, int]) -> pl.DataFrame:
    """PHASE_SCHEMA per step from its evidence kernels `k`: step, device, role, name, tile_n,
    start, end and the LAUNCH_COLS (null when unknown)."""
    if k.is_empty():
        return pl.DataFrame(schema=PHASE_SCHEMA)
    blocks = (pl.col("grid_x") * pl.col("grid_y") * pl.col("grid_z"))
    per = k.group_by("step").agg(
        device=pl.col("device").first(),
        combine=pl.col("label").filter(pl.col("role") == "combine").first(),
        tokens=pl.col("grid_x").filter(pl.col("role").is_in(["per_token", "per_token_exact"])).drop_nulls().mode().max(),
        tile_max=pl.col("tile_n").filter(pl.col("role") == "gemm_tile").max(),
        rows=pl.col("grid_x").filter(pl.col("role") == "rows").drop_nulls().mode().max(),
        rows_bound=(pl.col("grid_x") * pl.col("block_y")).filter(pl.col("role") == "rows_bound").max(),
    )
    # the step's main attention kernel: the attention name with the most time, at its most
    # common launch configuration
    att = k.filter(pl.col("role").is_in(["attention", "query_tiles"]))
    main = (att.group_by("step", "name", "role").agg((pl.col("end") - pl.col("start")).sum().alias("t"),
                                                      pl.col("grid_x").drop_nulls().mode().max().alias("gx"),
                                                      pl.col("grid_y").drop_nulls().mode().max().alias("gy"),
                                                      blocks.drop_nulls().mode().max().alias("blocks"))
            .sort("step", "t", "name", descending=[False, True, False]).group_by("step", maintain_order=True).first()
            .select("step", pl.col("name").alias("attention"), pl.col("role").alias("att_role"), "gx", "gy", "blocks"))
    per = per.join(main, on="step", how="left")
    # decided once per distinct evidence: a run's thousands of steps show a few shapes
    shape = [c for c in per.columns if c != "step"]
    kinds = per.select(shape).unique(maintain_order=True)
    decided = pl.DataFrame([_decide(r, sm_count.get(r["device"])) for r in kinds.iter_rows(named=True)],
                           schema={"phase": pl.String, "phase_by": pl.String, "phase_detail": pl.String}, orient="row")
    kinds = pl.concat([kinds, decided], how="horizontal")
    return (per.select("step", *shape).join(kinds, on=shape, how="left", nulls_equal=True).sort("step")
            .select(list(PHASE_SCHEMA)).cast(PHASE_SCHEMA))


def _decide(r: dict, sms: int | None) -> tuple[str | None, str | None, str | None]:
    tokens, att = r["tokens"], r["attention"]
    # an upper bound on the tokens: exact from one-block-per-token kernels, else a skinny tile
    t_max, t_src = (tokens, f"{tokens} token(s) by the grid of the per-token kernels") if tokens else (None, None)
    if t_max is None and r["tile_max"] is not None and r["tile_max"] <= SKINNY_TILE:
        t_max, t_src = r["tile_max"], f"at most {r['tile_max']} tokens by the GEMMs' {r['tile_max']}-wide nvjet tiles"
    if r["combine"]:
        if tokens is not None and r["rows"] is not None and tokens >= 2 * r["rows"]:
            # FA3 splits a prompt's KV too (vLLM's MLA prefill, long contexts): a combine pass beside
            # at least twice as many tokens as sampled rows is a step of prompt tokens (a replayed
            # CUDA graph pads a decode batch to its capture size, below twice the batch: 9 -> 16)
            return "prefill", "shape", (f"{tokens} tokens through the layers (the per-token kernels' grid), "
                                        f"{r['rows']} sequence(s) sampled: only each sequence's last token is "
                                        f"sampled ({_short(r['combine'])}'s split-KV combine ran beside them)")
        return "decode", "combine", f"{_short(r['combine'])} ran: the combine pass of split-KV (decode) attention"
    if att is not None and r["att_role"] == "query_tiles" and r["gx"]:
        if r["gx"] > 1:
            return "prefill", "launch", (f"{_short(att)}: {r['gx']} query tiles per head and sequence "
                                         "(grid x): a query longer than one tile")
        if tokens is not None and r["gy"] and tokens == r["gy"]:
            return "decode", "launch", (f"{_short(att)}: one query tile per head and sequence, and {tokens} "
                                        f"token(s) for {r['gy']} sequence(s) (grid y)")
    if att is not None and r["blocks"]:
        b = r["blocks"]
        if t_max is not None and b >= t_max:
            return "decode", "launch", (f"{_short(att)}: {b} blocks for {t_src}: at least one attention block "
                                        "per token, one query row per sequence")
        if tokens is not None and b < tokens and sms and b < sms:
            return "prefill", "launch", (f"{_short(att)}: {b} blocks for {tokens} tokens (below the GPU's {sms} "
                                         "SMs): a block's query tile spans several tokens of one sequence")
    rows = r["rows"] if r["rows"] is not None else r["rows_bound"]
    if tokens is not None and rows is not None and tokens > rows:
        sampled = f"{rows} sequence(s) sampled" if r["rows"] is not None else f"at most {rows} sequence(s) sampled"
        return "prefill", "shape", (f"{tokens} tokens through the layers (the per-token kernels' grid), {sampled}: "
                                    "only each sequence's last token is sampled")
    if tokens == 1:
        return "decode", "shape", "1 token in the step (the per-token kernels' grid)"
    if att is None:
        return None, None, None
    return None, "kernel name", "no launch configuration, combine pass or step shape decided it"


def _short(name: str | None, n: int = 48) -> str:
    s = re.sub(r"\s+", " ", str(name or "?"))
    return s if len(s) <= n else s[: n - 1] + "…"


def phase_evidence(acts: pl.DataFrame, steps: list[int], names: pl.DataFrame, gpus: pl.DataFrame, rules: RuleSet,
                   launch_config=None) -> pl.DataFrame:
    """PHASE_SCHEMA for `steps` (those with attention or combine kernels) from the trace alone.

    acts: activities with step, device, pid, corr, start, end, is_kernel, short_id,
    demangled_id, name (and the LAUNCH_COLS when the trace was read with them); names: the
    distinct kernel names with their class by name. Without launch columns, `launch_config`
    (stepscope.launch_config) reads them for the evidence kernels alone."""
    ev_names = roles(names, rules)
    have = list(LAUNCH_COLS) if all(c in acts.columns for c in LAUNCH_COLS) else []

    def rows_of(chosen: pl.DataFrame, in_steps: list[int]) -> pl.LazyFrame:
        return (acts.lazy().filter(pl.col("is_kernel") & pl.col("demangled_id").is_in(chosen["demangled_id"].to_list())
                                   & pl.col("step").is_in(in_steps))
                .join(chosen.lazy(), on=["short_id", "demangled_id"]))

    def pick(chosen: pl.DataFrame, in_steps: list[int]) -> pl.DataFrame:
        return (rows_of(chosen, in_steps)
                .select("step", "device", "pid", "corr", "start", "end", "short_id", "demangled_id",
                        pl.col("label").alias("name"), "role", "tile_n", "label", *have).collect())

    def of_roles(*which: str) -> pl.DataFrame:
        return ev_names.filter(pl.col("role").is_in(list(which)))

    # one block-per-token kernel tells a step's tokens: the step's rarest such name, chosen
    # before any row is taken (a million-kernel trace keeps a few rows per step), by the step's
    # own kernels (a window of a long run decides it as the whole trace does)
    # (a kernel whose grid is the tokens by construction before one that approximates it)
    candidates = of_roles("per_token_exact", "per_token")
    per_token = (rows_of(candidates, steps).group_by("step", "demangled_id")
                 .agg(n=pl.len(), exact=(pl.col("role") == "per_token_exact").any())
                 .sort("step", "exact", "n", "demangled_id", descending=[False, True, False, False])
                 .group_by("step", maintain_order=True).first().select("step", "demangled_id").collect())
    k = pick(of_roles("attention", "query_tiles", "combine", "rows", "rows_bound"), steps)
    if per_token.height:
        rarest = pick(candidates.filter(pl.col("demangled_id").is_in(per_token["demangled_id"].unique().implode())),
                      per_token["step"].unique().to_list())
        rarest = rarest.join(per_token, on=["step", "demangled_id"], how="semi")
        k = pl.concat([k, rarest], how="vertical_relaxed")
    k = k.filter(pl.col("role").is_in(["attention", "query_tiles", "combine"]).any().over("step"))
    if k.is_empty():
        return pl.DataFrame(schema=PHASE_SCHEMA)
    # the GEMM tile bound, only for the steps whose tokens no per-token kernel tells
    blind = sorted(set(k["step"].unique().to_list())
                   - set(k.filter(pl.col("role").is_in(["per_token", "per_token_exact"]))["step"].to_list()))
    if blind:
        k = pl.concat([k, pick(of_roles("gemm_tile"), blind)], how="vertical_relaxed")
    if not have:
        if launch_config is not None:
            # combine passes and GEMMs tell by their names, and of the attention kernels only
            # each step's main one counts (chosen by time): only the others' grids are read,
            # four columns of them (a read of the export's whole kernel table either way)
            need = sorted(set(main_attention(k)["short_id"].to_list())
                          | set(k.filter(pl.col("role").is_in(["per_token", "per_token_exact", "rows", "rows_bound"]))["short_id"]
                                .unique().to_list()))
            cfg = launch_config(need, LAUNCH_COLS) if need else pl.DataFrame(
                schema={"pid": pl.Int64, "corr": pl.Int64, "start": pl.Int64, **dict.fromkeys(LAUNCH_COLS, pl.Int64)})
            k = k.join(cfg.select(pl.col("pid").cast(k.schema["pid"]), "corr", "start", *LAUNCH_COLS),
                       on=["pid", "corr", "start"], how="left")
        else:
            k = k.with_columns([pl.lit(None, pl.Int64).alias(c) for c in LAUNCH_COLS])
    sms = dict(zip(gpus["device"].to_list(), gpus["sm_count"].to_list())) if gpus.height else {}
    return step_evidence(k, sms)
