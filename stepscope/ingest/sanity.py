"""Values no profiler records, checked on the model's frames whatever the reader: each is left
out and counted in a warning, so no figure is computed from them.

- an activity (kernel, memcpy, memset), API call or NVTX range that ends before it starts;
- a kernel, memop or API call lasting longer than MAX_ACTIVITY_NS: no kernel of an inference
  step runs for an hour (nor a call waiting on one), one that seems to would stand for the whole
  step's time, and a step's sum of such durations leaves 64 bits;
- a timestamp beyond ±2^62 ns (146 years from the clock's origin), where differences and sums
  of times leave 64 bits, and which the open capture range's end (2^62) stands for;
- a kernel whose name ids point nowhere (not in StringIds): it has no name to classify;
- a memcpy/memset of a negative byte count or one beyond MAX_BYTES (256 TiB, past any GPU's
  memory), where the byte budget's sums leave 64 bits.

A trace left without kernels is refused: its figures would all be empty.

A name (kernel, API call, NVTX range) longer than NAME_MAX characters is shortened to its first
NAME_MAX, followed by its length and a digest of the whole (so two long names that share their
beginning stay apart), and a warning says how many were. Everything after reads the shortened
name: the rules classify it, the reports show it. No compiler or profiler writes such a name (the
longest demangled template names run to a few thousand characters); one 10 MB name, carried
into every step's kernel table, made a 200k-kernel trace take 5 GB and its JSON 10 GB.
"""

from __future__ import annotations

import polars as pl

from stepscope.errors import InputError
from stepscope.model import Trace

MAX_ACTIVITY_NS = 3_600 * 10**9
MAX_BYTES = 1 << 48
TIME_BOUND = 1 << 62
NAME_MAX = 16_384


def _shortened(value: str) -> str:
    import hashlib

    digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{value[:NAME_MAX]}…[{len(value):,} characters, sha256 {digest}]"


def capped(df: pl.DataFrame, col: str) -> tuple[pl.DataFrame, int]:
    """`df` with the names of `col` beyond NAME_MAX characters shortened (_shortened), and how
    many distinct names were. Only the names over NAME_MAX bytes reach Python (normally none)."""
    if df.is_empty() or col not in df.columns:
        return df, 0
    over = df[col].str.len_bytes() > NAME_MAX
    if not over.any():
        return df, 0
    # each distinct long name once (an NVTX name repeats on every range it names)
    long = {v: _shortened(v) for v in df[col].filter(over).unique().to_list() if len(v) > NAME_MAX}
    if not long:
        return df, 0
    return df.with_columns(pl.col(col).replace(list(long), list(long.values()))), len(long)


def _times(df: pl.DataFrame, long: bool) -> dict[str, pl.Expr]:
    start, end = pl.col("start"), pl.col("end")
    # compared both ways, not through abs(): abs(-2^63) wraps to -2^63 in int64
    beyond = (start >= TIME_BOUND) | (start <= -TIME_BOUND) | (end >= TIME_BOUND) | (end <= -TIME_BOUND)
    checks = {"ending before they start": end < start, "with a timestamp beyond ±2^62 ns": beyond}
    if long:  # the difference only of times inside the bound: beyond it, end - start wraps
        checks["lasting over an hour"] = ~beyond & ((end - start) > MAX_ACTIVITY_NS)
    return checks


def _leave_out(df: pl.DataFrame, what: str, checks: dict[str, pl.Expr], warnings: list[str]) -> pl.DataFrame:
    if df.is_empty() or not checks:
        return df
    counts = df.select(**{f"_{i}": e.fill_null(False).sum() for i, e in enumerate(checks.values())}).row(0)
    if not any(counts):
        return df
    bad = pl.lit(False)
    for e, n in zip(checks.values(), counts):
        if n:
            bad = bad | e.fill_null(False)
    kept = df.filter(~bad)
    reasons = ", ".join(f"{n:,} {why}" for why, n in zip(checks, counts) if n)
    warnings.append(f"{df.height - kept.height:,} of {df.height:,} {what} left out ({reasons})")
    return kept


def checked(trace: Trace) -> Trace:
    """The trace without the rows that cannot be right, with a warning for each kind left out;
    InputError when no kernel is left."""
    w: list[str] = []
    before = trace.kernels.height
    kernels = _leave_out(trace.kernels, "kernels", _times(trace.kernels, True), w)
    if trace.format.startswith("nsys-") and kernels.height:
        ids = trace.strings["id"]
        kernels = _leave_out(kernels, "kernels", {
            "with a shortName id not in StringIds": ~pl.col("short_id").is_in(ids.implode()),
            "with a demangledName id not in StringIds": ~pl.col("demangled_id").is_in(ids.implode()),
        }, w)
    trace.kernels = kernels
    trace.memops = _leave_out(trace.memops, "memcpy/memset rows", _times(trace.memops, True) | {
        "with a byte count below 0 or beyond 2^48": (pl.col("bytes") < 0) | (pl.col("bytes") > MAX_BYTES)}, w)
    trace.api = _leave_out(trace.api, "API calls", _times(trace.api, True), w)
    trace.nvtx = _leave_out(trace.nvtx, "NVTX ranges", _times(trace.nvtx, False), w)
    for frame, what in (("strings", "kernel or API call name(s)"), ("nvtx", "NVTX range name(s)")):
        df, n = capped(getattr(trace, frame), "value" if frame == "strings" else "name")
        if n:
            setattr(trace, frame, df)
            w.append(f"{n:,} {what} longer than {NAME_MAX:,} characters shortened to the first {NAME_MAX:,} "
                     "(classified and shown so)")
    trace.warnings = list(trace.warnings) + w
    if kernels.is_empty():
        if before:
            why = "; ".join(trace.warnings)
            raise InputError(f"{trace.path}: no usable kernels: all {before:,} were left out ({why})")
        raise InputError(f"{trace.path}: no kernels recorded — was `--trace=cuda` on? capture again with "
                         "nsys profile --trace=cuda,nvtx")
    return trace
