"""JSON text built by polars: one record or one array per row group, as strings.

A million-kernel trace's document holds a few hundred thousand small objects; encoding them in
polars and joining the text avoids building a Python object for each one first. Categorical
and Enum columns are written as their strings (polars 1.x would write their codes).
"""

from __future__ import annotations

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
