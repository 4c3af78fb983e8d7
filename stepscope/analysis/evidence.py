"""Kernels whose name says nothing of their op, classed by where they run in their layer.

torch.compile names some fused kernels after their ops and others just `triton_poi_fused_3`.
Such an anonymous kernel (the `[evidence] anonymous` pattern of rules.toml) takes, in order:

  layer    the class the step's other layers run at the same position of the layer pattern
           (layers.layer_pattern), when named kernels sit there;
  position the class of a `[[position]]` rule whose neighbours match: the nearest named
           kernels before and after it in the step (e.g. between the QKV GEMM and the KV-cache
           write a decoder layer applies RoPE);

and keeps its class by name (framework) otherwise. A kernel a rule classes (a user's --rules
included) is not anonymous, whatever its name. Each decision is reported (`class_by`),
never made silently. Work is per step and per distinct (neighbour, neighbour) pair, over the
steps that hold anonymous kernels only.

Two more decisions by evidence other than the name live here: a top-k, sort or softmax kernel is
the MoE router's or the sampler's by its place (place_router, the [[router]] rules), and a kernel
that fused another class's op into it names that op (fused_notes, the [[fused]] rules).
"""

from __future__ import annotations

import polars as pl

from stepscope.analysis.classify import CLASS_DTYPE, RuleSet
from stepscope.classes import CLASSES, GLUE, UNTELLING

EVIDENCE_SCHEMA = {"name": pl.String, "demangled": pl.String, "class": pl.String, "class_by": pl.String}


def place_anonymous(acts: pl.DataFrame, names: pl.DataFrame, rules: RuleSet,
                    layers: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(acts with the anonymous kernels re-classed, EVIDENCE_SCHEMA rows for them).

    acts: sorted by (step, start), with row, step, is_kernel, demangled_id, class; names: the
    distinct kernel names (demangled_id, name); layers: (step, layers, kernels_per_layer,
    layer_start) over each step's kernels."""
    # anonymous: the name says nothing and no rule (a user's included) gave it a class
    from stepscope.analysis.classify import column_hits

    anon = []
    if rules.anonymous is not None:
        said = column_hits(rules.anonymous, names["name"].fill_null(""))
        anon = names.filter(said & names["class"].is_in(["framework", "other"]))["demangled_id"].to_list()
    if not anon or acts["step"].null_count() == acts.height:
        return acts, pl.DataFrame(schema=EVIDENCE_SCHEMA)
    is_anon = pl.col("demangled_id").is_in(anon) & pl.col("is_kernel")
    steps = acts.filter(is_anon & pl.col("step").is_not_null())["step"].unique()
    # the classes as their Enum codes and the names by id: no string per kernel row (a serving
    # run's steps nearly all hold an anonymous kernel, so this is every kernel of the run)
    code = {c: i for i, c in enumerate(CLASSES)}
    by_name = sorted(CLASSES)  # a vote's ties go to the class first by name
    codes = list(range(len(CLASSES)))
    k = (acts.lazy().filter(pl.col("is_kernel") & pl.col("step").is_in(steps.implode()))
         .select("row", "step", "short_id", "demangled_id", pl.col("class").to_physical().cast(pl.Int16).alias("c"),
                 is_anon.alias("anon"))
         # the kernel's index in its step: acts are in step order, so a step's rows are
         # consecutive (no window function over steps: a serving run has tens of thousands)
         .with_row_index("_r")
         .with_columns(idx=pl.col("_r") - pl.when(pl.col("step") != pl.col("step").shift(1, fill_value=-1))
                       .then(pl.col("_r")).forward_fill())
         .drop("_r")
         # --- the same position in the step's other layers
         .join(layers.lazy().select("step", pl.col("kernels_per_layer").alias("p"), pl.col("layer_start").alias("s"),
                                    pl.col("layers").alias("n")), on="step", how="left", maintain_order="left"))
    inside = (pl.col("idx") >= pl.col("s")) & (pl.col("idx") < pl.col("s") + pl.col("n") * pl.col("p"))
    k = k.with_columns(pos=pl.when(inside).then((pl.col("idx") - pl.col("s")) % pl.col("p"))).drop("p", "s", "n", "idx")
    # --- the nearest named kernels around it (-1: none)
    # (the last named kernel before it over the whole run, kept where it is of the same step)
    named = pl.when(~pl.col("anon")).then(pl.col("c"))
    named_step = pl.when(named.is_not_null()).then(pl.col("step"))
    same = pl.col("step")
    k = k.with_columns(prev=pl.when(named_step.shift(1).forward_fill() == same)
                       .then(named.shift(1).forward_fill()).otherwise(-1),
                       next=pl.when(named_step.shift(-1).backward_fill() == same)
                       .then(named.shift(-1).backward_fill()).otherwise(-1)).collect()
    untelling = [code[c] for c in UNTELLING]
    # the votes are counted only at the places an anonymous kernel holds (the other kernels
    # of a serving run's steps are most of its kernels: a semi join is cheaper than their groups)
    mine = k.lazy().filter(pl.col("anon") & pl.col("pos").is_not_null()).select("step", "pos").unique()
    votes = (k.lazy().filter(~pl.col("anon") & pl.col("pos").is_not_null() & ~pl.col("c").is_in(untelling))
             .join(mine, on=["step", "pos"], how="semi")
             .group_by("step", "pos", "c").len()
             .with_columns(r=pl.col("c").replace_strict(codes,
                                                        [by_name.index(c) for c in CLASSES], return_dtype=pl.Int16))
             .sort("step", "pos", "len", "r", descending=[False, False, True, False])
             .unique(["step", "pos"], keep="first", maintain_order=True)
             .select("step", "pos", pl.col("c").alias("by_layer")))
    # the vote of each anonymous kernel's place (only theirs are joined)
    k = (k.lazy().filter(pl.col("anon")).join(votes, on=["step", "pos"], how="left", maintain_order="left")
         .drop("anon", "pos").collect())
    pairs = k.select("prev", "next").unique(maintain_order=True)
    rule_of = []
    for i, (p, n) in enumerate(pairs.iter_rows()):
        prev, nxt = (CLASSES[p] if p >= 0 else ""), (CLASSES[n] if n >= 0 else "")
        hit = next((r for r in rules.positions if prev and nxt and r.after.search(prev) and r.before.search(nxt)), None)
        rule_of.append((p, n, code[hit.cls] if hit else None,
                        f"between {prev} and {nxt}, where a decoder layer runs {hit.cls}" if hit else None, i))
    pairs = pl.DataFrame(rule_of, schema={"prev": pl.Int16, "next": pl.Int16, "by_position": pl.Int16,
                                          "why": pl.String, "pair": pl.Int64}, orient="row")
    k = k.join(pairs, on=["prev", "next"], how="left", maintain_order="left").with_columns(
        new=pl.coalesce("by_layer", "by_position"),
        # what placed it: the layer vote (its class), else the position rule (its pair)
        key=pl.when(pl.col("by_layer").is_not_null()).then(pl.col("by_layer").cast(pl.Int64))
        .otherwise(len(CLASSES) + pl.col("pair")),
    ).filter(pl.col("new").is_not_null())
    if k.is_empty():
        return acts, pl.DataFrame(schema=EVIDENCE_SCHEMA)
    acts = _with_classes(acts, k.select("row", pl.col("new").replace_strict(codes, CLASSES, return_dtype=CLASS_DTYPE)))
    why = pairs.select(pl.col("pair") + len(CLASSES), "why").rename({"pair": "key"})
    ids = ["short_id", "demangled_id"]
    ev = (k.select(*ids, "new", "key").unique(maintain_order=True)
          .join(names.select(*ids, pl.col("name").cast(pl.String), pl.col("demangled").cast(pl.String))
                .unique(ids, keep="first", maintain_order=True), on=ids, how="left", maintain_order="left")
          .join(why, on="key", how="left", maintain_order="left")
          .with_columns(pl.col("new").replace_strict(codes, CLASSES, return_dtype=pl.String).alias("class"))
          .select("name", "demangled", "class",
                  pl.when(pl.col("key") < len(CLASSES))
                  .then(pl.concat_str(pl.lit("the step's other layers run "), pl.col("class"), pl.lit(" at this position")))
                  .otherwise(pl.col("why")).alias("class_by")))
    return acts, ev


def _with_classes(acts: pl.DataFrame, rows: pl.DataFrame) -> pl.DataFrame:
    """`acts` with each row of `rows` (row, new: CLASS_DTYPE) taking class `new`."""
    return (acts.join(rows, on="row", how="left", maintain_order="left")
            .with_columns(pl.coalesce("new", "class").alias("class")).drop("new"))


def _reclassed(acts: pl.DataFrame, k: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """`acts` with the rows of `k` (row, new, name, demangled, class_by) taking class `new`, and
    the evidence frame that says why (EVIDENCE_SCHEMA)."""
    if k.is_empty():
        return acts, pl.DataFrame(schema=EVIDENCE_SCHEMA)
    acts = _with_classes(acts, k.select("row", pl.col("new").cast(CLASS_DTYPE)))
    ev = k.select(pl.col("name").cast(pl.String), pl.col("demangled").cast(pl.String), pl.col("new").alias("class"),
                  "class_by").unique(maintain_order=True)
    return acts, ev


def place_router(acts: pl.DataFrame, names: pl.DataFrame, rules: RuleSet) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(acts with the router's top-k / sort / softmax kernels re-classed, EVIDENCE_SCHEMA rows).

    torch.topk's gatherTopK is the sampler's over the logits at the end of a step and the router's
    inside an MoE layer: the name cannot tell them apart, the place can. A kernel classed sampling
    or framework by its name that matches `[evidence] router` takes the class of the first
    [[router]] rule that the nearest kernels of a telling class around it match, on its stream in
    its step (a process's start-up, for a kernel of no step), other such kernels skipped: the
    router's softmax sits between its GEMM and its top-k.
    acts: sorted by (step, start), with row, step, pid, stream, is_kernel, demangled_id, class, name,
    demangled."""
    from stepscope.analysis.classify import column_hits

    if rules.router is None or not rules.routers or acts.is_empty():
        return acts, pl.DataFrame(schema=EVIDENCE_SCHEMA)
    cand = names.filter(names["class"].is_in(["sampling", GLUE]))
    said = column_hits(rules.router, cand["name"].fill_null("")) | column_hits(
        rules.router, cand["demangled"].fill_null(""))
    ids = cand.filter(said)["demangled_id"].to_list()
    if not ids:
        return acts, pl.DataFrame(schema=EVIDENCE_SCHEMA)
    is_cand = pl.col("demangled_id").is_in(ids) & pl.col("is_kernel")
    # per step; the kernels of no step (start-up: the warm-up runs the router and the sampler
    # too) per process
    group = pl.coalesce(pl.col("step"), -1 - pl.col("pid").cast(pl.Int64)).alias("g")
    groups = acts.filter(is_cand).select(group.unique())["g"]
    k = (acts.filter(pl.col("is_kernel")).with_columns(group).filter(pl.col("g").is_in(groups.implode()))
         .select("row", "g", "stream", "name", "demangled", pl.col("class").cast(pl.String), is_cand.alias("cand")))
    telling = pl.when(~pl.col("cand") & ~pl.col("class").is_in(list(UNTELLING))).then(pl.col("class"))
    # in launch order on its own stream: a graph replay runs the shared experts on a second
    # stream, interleaved in time with the router's kernels
    k = k.with_columns(prev=telling.shift(1).forward_fill().over("g", "stream").fill_null(""),
                       next=telling.shift(-1).backward_fill().over("g", "stream").fill_null(""))
    pairs = k.filter(pl.col("cand")).select("prev", "next").unique()
    rule_of = []
    for prev, nxt in pairs.iter_rows():
        hit = next((r for r in rules.routers if prev and nxt and r.after.search(prev) and r.before.search(nxt)), None)
        rule_of.append((prev, nxt, hit.cls if hit else None,
                        f"after {prev}, before {nxt} on its stream: inside a layer, not after the LM head "
                        "where the sampler runs" if hit else None))
    pairs = pl.DataFrame(rule_of, schema={"prev": pl.String, "next": pl.String, "new": pl.String, "class_by": pl.String},
                         orient="row")
    # in acts' order (the first of a name's reasons is the one said: the same however the trace
    # is cut, whole or by windows)
    k = k.filter(pl.col("cand")).join(pairs, on=["prev", "next"], how="left", maintain_order="left").filter(
        pl.col("new").is_not_null() & (pl.col("new") != pl.col("class")))
    return _reclassed(acts, k)


def fused_notes(names: pl.DataFrame, rules: RuleSet) -> pl.DataFrame:
    """EVIDENCE_SCHEMA rows for the kernels that run another class's work fused into them
    ([[fused]] rules: Inductor's per-token quantization reduction with the add+RMSNorm before it
    fused in), so that the class that shrank is explained where the kernel is listed."""
    from stepscope.analysis.classify import column_hits

    if not rules.fused or names.is_empty():
        return pl.DataFrame(schema=EVIDENCE_SCHEMA)
    text = names["name"].fill_null("")
    parts = []
    for f in rules.fused:
        hit = (names["class"] == f.cls).fill_null(False)
        if hit.any():
            hit = hit & column_hits(f.pattern, text, hit)
            parts.append(pl.when(hit).then(pl.lit(f.op)).alias(f"_f{len(parts)}"))
    if not parts:
        return pl.DataFrame(schema=EVIDENCE_SCHEMA)
    got = names.select(pl.col("name").cast(pl.String), pl.col("demangled").cast(pl.String),
                       pl.col("class").cast(pl.String), pl.concat_list(parts).list.drop_nulls().alias("ops"))
    got = got.filter(pl.col("ops").list.len() > 0)
    return got.select("name", "demangled", "class", pl.concat_str(
        pl.lit("its name holds the "), pl.col("ops").list.join(" and "),
        pl.lit(" fused into it: that time counts here, not under "), pl.col("ops").list.join(" or "))
        .alias("class_by")).unique(maintain_order=True)
