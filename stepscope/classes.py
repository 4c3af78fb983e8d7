"""The kernel classes, read once from their one table (stepscope/data/classes.toml).

Every module that needs a property of a class reads it here: the class list and its order,
the HTML colours, which classes tensor parallelism shards, the byte budget's op of a class and
the minimum-bytes model's class of an op, the classes that tell what a layer's position
computes, the attention classes and their phases. No module lists the classes itself
(tests/test_class_table.py), so a new class is one row of the table, one rule of rules.toml
and its entry in docs/KERNEL_CLASSES.md.

Plain Python on purpose (no polars): the HTML renderer reads the colours and imports no polars.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from importlib import resources

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@dataclass(frozen=True)
class KernelClass:
    name: str
    colour: str            # the HTML report's
    tp_sharded: bool       # tensor parallelism divides its work across the ranks
    byte_op: str | None    # the minimum-bytes op a kernel of the class stands for (budget by class)
    min_ops: tuple[str, ...]  # the minimum-bytes model's ops that are this class's
    telling: bool          # says what a position of the layer computes (evidence by position)
    phase: str | None      # attention classes: the step phase whose attention it is
    docs: str              # anchor in docs/KERNEL_CLASSES.md


_FIELDS = {"name": str, "colour": str, "tp_sharded": bool, "byte_op": str, "min_ops": list, "telling": bool,
           "phase": str, "docs": str}
_REQUIRED = ("name", "colour", "tp_sharded", "telling", "docs")


def parse_table(text: str, source: str = "classes.toml") -> tuple[KernelClass, ...]:
    """The rows of a class table's text, checked: every row names a new class and has the
    required fields with the right types (a wrong table fails at import, not in an output)."""
    rows = tomllib.loads(text).get("class", [])
    out: list[KernelClass] = []
    for i, row in enumerate(rows):
        where = f"{source}: [[class]] #{i + 1}"
        unknown = set(row) - set(_FIELDS)
        missing = [f for f in _REQUIRED if f not in row]
        bad = [f for f, t in _FIELDS.items() if f in row and not isinstance(row[f], t)]
        if unknown or missing or bad:
            raise ValueError(f"{where}: unknown {sorted(unknown)}, missing {missing}, wrong type {bad}")
        if row["name"] in {c.name for c in out}:
            raise ValueError(f"{where}: class {row['name']!r} twice")
        out.append(KernelClass(row["name"], row["colour"], row["tp_sharded"], row.get("byte_op"),
                               tuple(row.get("min_ops", ())), row["telling"], row.get("phase"), row["docs"]))
    if not out or out[-1].name != "other":
        raise ValueError(f"{source}: the last class must be `other` (what no rule matched)")
    return tuple(out)


TABLE: tuple[KernelClass, ...] = parse_table(
    resources.files("stepscope.data").joinpath("classes.toml").read_text(), "stepscope/data/classes.toml")
BY_NAME = {c.name: c for c in TABLE}

CLASSES: tuple[str, ...] = tuple(c.name for c in TABLE)
COLOURS: dict[str, str] = {c.name: c.colour for c in TABLE}
TP_SHARDED: tuple[str, ...] = tuple(c.name for c in TABLE if c.tp_sharded)
# the op of the minimum-bytes model a kernel of the class stands for, when joined by class
BYTE_OP: dict[str, str] = {c.name: c.byte_op for c in TABLE if c.byte_op}
# the class whose minimum an op of the minimum-bytes model is
CLASS_OF_OP: dict[str, str] = {op: c.name for c in TABLE for op in c.min_ops}
# classes that do not say what a position of a layer computes (glue, memory operations, unknown)
UNTELLING: tuple[str, ...] = tuple(c.name for c in TABLE if not c.telling)
# the attention classes (a name only hints between them: the step's phase decides), by phase
ATTENTION: tuple[str, ...] = tuple(c.name for c in TABLE if c.phase)
ATTENTION_OF_PHASE: dict[str, str] = {c.phase: c.name for c in TABLE if c.phase}
GLUE = "framework"    # the class whose kernels the [[family]] rules break down
UNMATCHED = "other"   # what no rule matched
