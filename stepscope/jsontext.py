"""JSON text built by polars: one record or one array per row group, as strings.

A million-kernel trace's document holds a few hundred thousand small objects; encoding them in
polars and joining the text avoids building a Python object for each one first. Categorical
and Enum columns are written as their strings (polars 1.x would write their codes).
"""

from __future__ import annotations

import io

import polars as pl


def _plain(frame: pl.DataFrame, cols: list[str]) -> list[pl.Expr]:
    out = []
    for c in cols:
        text = isinstance(frame.schema[c], (pl.Categorical, pl.Enum))
        out.append(pl.col(c).cast(pl.String) if text else pl.col(c))
    return out


def records(frame: pl.DataFrame, cols: list[str]) -> pl.Expr:
    """Per row: the JSON object of `cols`, in that order."""
    return pl.struct(_plain(frame, cols)).struct.json_encode()


def open_records(frame: pl.DataFrame, cols: list[str]) -> pl.Expr:
    """Per row: the JSON object of `cols` without its closing brace, for more fields to follow."""
    return records(frame, cols).str.strip_suffix("}")


def arrays(frame: pl.DataFrame, key: str, cols: list[str], alias: str) -> pl.DataFrame:
    """(key, alias): per key, the JSON array of its rows' `cols` objects, in frame order."""
    return joined(frame.select(key, records(frame, cols).alias("_j")), key, "_j", alias, "[", "]")


def members(frame: pl.DataFrame, key: str, name: str, cols: list[str], alias: str,
            left: str = "{", right: str = "}") -> pl.DataFrame:
    """(key, alias): per key, its rows as object members `"<name>": {cols}` joined inside
    left…right, in frame order. `name` holds identifiers (classes, gap kinds): not escaped."""
    member = pl.concat_str(pl.lit('"'), pl.col(name).cast(pl.String), pl.lit('":'), records(frame, cols))
    return joined(frame.select(key, member.alias("_m")), key, "_m", alias, left, right)


def joined(frame: pl.DataFrame, key: str, col: str, alias: str, left: str, right: str) -> pl.DataFrame:
    """(key, alias): per key, its rows' JSON fragments `col` joined by commas inside left…right."""
    if frame.is_empty():
        return pl.DataFrame(schema={key: frame.schema[key], alias: pl.String})
    return frame.group_by(key, maintain_order=True).agg(pl.col(col).str.join(",")).select(
        key, pl.concat_str(pl.lit(left), pl.col(col), pl.lit(right)).alias(alias))


def comma_joined(texts: pl.Series, before: str = "", after: str = "") -> bytes:
    """`before`, the texts joined with commas, `after`, as UTF-8 (a document's array of steps).
    polars' CSV writer, unquoted with a comma after each row, writes them joined in one pass:
    ~0.04 s for a million kernels' 18 MB, against ~0.09 s for str.join, the cast to bytes and the
    copy out. With a null among them, the join (which leaves nulls out) does it."""
    if texts.len() and not texts.null_count():
        buf = io.BytesIO()
        texts.to_frame().write_csv(buf, include_header=False, quote_style="never", line_terminator=",")
        return before.encode() + buf.getbuffer()[:-1] + after.encode()
    return texts.to_frame().select(pl.concat_str(pl.lit(before), pl.first().str.join(","), pl.lit(after))
                                   .cast(pl.Binary)).item()
