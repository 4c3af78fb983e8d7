"""Kernel classes: ordered regex rules kept as data (stepscope/data/rules.toml).

Unique (short, demangled) name pairs are classified once in Python (a trace has hundreds of
distinct names, not millions), then the result is joined back onto the kernel frame.
"""

from __future__ import annotations

import functools
import re
import sys
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import polars as pl

from stepscope.classes import ATTENTION, CLASSES  # noqa: F401 (ATTENTION: re-exported)
from stepscope.errors import InputError
from stepscope.paths import input_file
from stepscope.patterns import UserPattern, ours

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# CLASSES, their order and every other property of a class: one table (stepscope/data/classes.toml)
# The class column's dtype: every class is a category whether a trace has it or not, so class
# columns of different traces compare and concatenate, and a row costs one byte-sized code.
CLASS_DTYPE = pl.Enum(CLASSES)
# ATTENTION: rule classes that only hint at the phase: the step's shape decides (see resolve_attention).
FIELDS = ("short", "demangled", "any")


@dataclass(frozen=True)
class Rule:
    cls: str
    pattern: re.Pattern | UserPattern
    field: str = "any"
    source: str = "default"

    def matches(self, short: str, demangled: str) -> bool:
        if self.field == "short":
            return bool(self.pattern.search(short))
        if self.field == "demangled":
            return bool(self.pattern.search(demangled))
        return bool(self.pattern.search(short) or self.pattern.search(demangled))


# Op families of class `framework` (the [[family]] rules): what the glue kernels do.
FAMILIES = ("elementwise", "copy", "concat", "reduce", "index", "fill", "engine", "other")
FAMILY_LABELS = {"elementwise": "elementwise arithmetic", "copy": "copies and casts", "concat": "concatenation",
                 "reduce": "reductions", "index": "indexing", "fill": "fills", "engine": "engine bookkeeping",
                 "other": "other glue"}
FAMILY_DTYPE = pl.Enum(FAMILIES)
PHASE_KEYS = ("combine", "per_token", "per_token_exact", "rows", "rows_bound", "query_tiles", "gemm_tile")


@dataclass(frozen=True)
class Family:
    family: str
    pattern: re.Pattern


@dataclass(frozen=True)
class Position:
    """An anonymous kernel between a kernel of class `after` and one of class `before` (the
    nearest named kernels around it in its step) is of class `cls`."""
    cls: str
    after: re.Pattern
    before: re.Pattern


@dataclass(frozen=True)
class Fused:
    """A kernel of class `cls` whose name matches `pattern` runs the work of class `op` too
    (a quantization reduction with the add+RMSNorm before it fused in)."""
    cls: str
    op: str
    pattern: re.Pattern


@dataclass(frozen=True)
class RuleSet:
    kernel_rules: tuple[Rule, ...]
    nvtx_rules: tuple[Rule, ...]
    families: tuple[Family, ...] = ()
    ops: tuple[str, ...] = ()  # regexes (polars') whose first group is the op of an NVTX range
    phase: tuple[tuple[str, re.Pattern], ...] = ()  # PHASE_KEYS -> pattern
    anonymous: re.Pattern | None = None  # kernel names that say nothing of their op
    positions: tuple[Position, ...] = ()
    router: re.Pattern | None = None  # top-k / sort / softmax names: the router's or the sampler's
    routers: tuple[Position, ...] = ()  # which, by the telling kernels around it ([[router]])
    fused: tuple[Fused, ...] = ()
    # the names this rule set has labelled (name, demangled, and their `class` or `family`:
    # memo_first_match): an analysis by windows (analysis/windows.py) meets the same few hundred
    # names in every window; a pure function of the names and the rules, so kept with the rules
    memo: dict = field(default_factory=dict, compare=False, repr=False, hash=False)

    def phase_pattern(self, key: str) -> re.Pattern | None:
        return dict(self.phase).get(key)

    def family_of(self, short: str | None, demangled: str | None) -> str:
        short, demangled = short or "", demangled or short or ""
        for f in self.families:
            if f.pattern.search(demangled) or f.pattern.search(short):
                return f.family
        return "other"

    def is_anonymous(self, short: str | None) -> bool:
        return bool(self.anonymous is not None and self.anonymous.search(short or ""))

    def classify_name(self, short: str | None, demangled: str | None) -> str:
        short, demangled = short or "", demangled or short or ""
        for rule in self.kernel_rules:
            if rule.matches(short, demangled):
                return rule.cls
        return "other"

    def classify_range(self, name: str | None) -> str | None:
        if not name:
            return None
        for rule in self.nvtx_rules:
            if rule.pattern.search(name):
                return rule.cls
        return None


DEFAULT_SOURCE = "default rules"


def _compile(pattern, where: str, source: str = DEFAULT_SOURCE):
    if not isinstance(pattern, str) or not pattern:
        raise InputError(f"{where}: needs a non-empty string 'pattern'")
    if source != DEFAULT_SOURCE:  # a user's pattern may backtrack: matched under a time budget
        return UserPattern(pattern, where)
    try:
        return ours(pattern)
    except re.error as e:  # pragma: no cover - the bundled rules compile (tests load them)
        raise InputError(f"{where}: bad regex {pattern!r}: {e}") from None


def _parse_evidence(doc: dict, source: str) -> dict:
    """The [[family]], [[op]], [phase], [evidence] and [[position]] sections."""
    out: dict = {"families": [], "ops": [], "phase": [], "anonymous": None, "positions": [], "router": None,
                 "routers": [], "fused": []}
    for section, kind in (("family", list), ("op", list), ("position", list), ("phase", dict), ("evidence", dict),
                          ("router", list), ("fused", list)):
        got = doc.get(section, kind())
        if not isinstance(got, kind) or (kind is list and not all(isinstance(e, dict) for e in got)):
            raise InputError(f"{source}: [{section}] must be " + ("an array of tables" if kind is list else "a table")
                             + f", not {type(got).__name__}")
    for i, entry in enumerate(doc.get("family", [])):
        where = f"{source}: [[family]] #{i + 1}"
        if entry.get("family") not in FAMILIES:
            raise InputError(f"{where}: unknown family {entry.get('family')!r}; use one of {', '.join(FAMILIES)}")
        out["families"].append(Family(entry["family"], _compile(entry.get("pattern"), where, source)))
    for i, entry in enumerate(doc.get("op", [])):
        where = f"{source}: [[op]] #{i + 1}"
        pattern = entry.get("pattern")
        _compile(pattern, where, source)
        try:  # polars extracts the op with this pattern (a linear engine); re only counts its groups
            groups = re.compile(pattern).groups
        except re.error as e:
            raise InputError(f"{where}: bad regex {pattern!r}: {e}; fix the pattern") from None
        if groups < 1:
            raise InputError(f"{where}: the pattern needs a group around the op name")
        out["ops"].append(pattern)
    for key, pattern in doc.get("phase", {}).items():
        where = f"{source}: [phase] {key}"
        if key not in PHASE_KEYS:
            raise InputError(f"{where}: unknown key; use one of {', '.join(PHASE_KEYS)}")
        out["phase"].append((key, _compile(pattern, where, source)))
    for key in ("anonymous", "router"):
        if key in doc.get("evidence", {}):
            out[key] = _compile(doc["evidence"][key], f"{source}: [evidence] {key}", source)
    for section, key in (("position", "positions"), ("router", "routers")):
        for i, entry in enumerate(doc.get(section, [])):
            where = f"{source}: [[{section}]] #{i + 1}"
            if entry.get("class") not in CLASSES:
                raise InputError(f"{where}: unknown class {entry.get('class')!r}; use one of {', '.join(CLASSES)}")
            out[key].append(Position(entry["class"], _compile(entry.get("after"), where + " after", source),
                                     _compile(entry.get("before"), where + " before", source)))
    for i, entry in enumerate(doc.get("fused", [])):
        where = f"{source}: [[fused]] #{i + 1}"
        for k in ("class", "op"):
            if entry.get(k) not in CLASSES:
                raise InputError(f"{where}: unknown {k} {entry.get(k)!r}; use one of {', '.join(CLASSES)}")
        out["fused"].append(Fused(entry["class"], entry["op"], _compile(entry.get("pattern"), where, source)))
    return out


def _parse(doc: dict, source: str) -> tuple[list[Rule], list[Rule]]:
    out: dict[str, list[Rule]] = {"rule": [], "nvtx": []}
    for section in out:
        entries = doc.get(section, [])
        if not isinstance(entries, list):
            raise InputError(f"{source}: [[{section}]] must be an array of tables "
                             f"([[{section}]] headers), not {type(entries).__name__}")
        for i, entry in enumerate(entries):
            where = f"{source}: [[{section}]] #{i + 1}"
            if not isinstance(entry, dict):
                raise InputError(f"{where}: must be a table with class and pattern, not {type(entry).__name__}")
            cls, pattern = entry.get("class"), entry.get("pattern")
            field = entry.get("field", "any")
            if not isinstance(cls, str) or cls not in CLASSES:
                raise InputError(f"{where}: unknown class {cls!r}; use one of {', '.join(CLASSES)}")
            if not isinstance(pattern, str) or not pattern:
                raise InputError(f"{where}: needs a non-empty string 'pattern'")
            if not isinstance(field, str) or field not in FIELDS:
                raise InputError(f"{where}: field must be one of {', '.join(FIELDS)}, not {field!r}")
            out[section].append(Rule(cls, _compile(pattern, where, source), field, source))
    return out["rule"], out["nvtx"]


@functools.lru_cache(maxsize=2)
def _parsed_default(text: str) -> tuple[tuple[Rule, ...], tuple[Rule, ...], dict]:
    """The bundled rules, parsed and compiled once per text (a process that analyzes many traces,
    a notebook or the test suite, parsed them ~8 ms a time). Every part is a tuple of frozen
    rules, so no caller can change what the next one gets."""
    default = tomllib.loads(text)
    kernel, nvtx = _parse(default, DEFAULT_SOURCE)
    ev = _parse_evidence(default, DEFAULT_SOURCE)
    return tuple(kernel), tuple(nvtx), {k: tuple(v) if isinstance(v, list) else v for k, v in ev.items()}


def load_rules(extra: str | Path | None = None) -> RuleSet:
    """The default rules, with a user's rules file (if any) consulted first."""
    text = resources.files("stepscope.data").joinpath("rules.toml").read_text()
    kernel, nvtx, ev = _parsed_default(text)
    if extra is not None:
        extra = input_file(extra, "a TOML rules file")  # a directory or FIFO is refused unopened
        try:
            doc = tomllib.loads(extra.read_bytes().decode("utf-8"))
        except OSError as e:
            raise InputError(f"{extra}: cannot read the rules file ({e.strerror or e})") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError, RecursionError) as e:
            raise InputError(f"{extra} is not a valid TOML rules file ({e})") from None
        user_kernel, user_nvtx = _parse(doc, str(extra))
        kernel, nvtx = (*user_kernel, *kernel), (*user_nvtx, *nvtx)
        user = _parse_evidence(doc, str(extra))
        # a user's rules come first; a user's [phase] keys and [evidence] replace the defaults
        ev = {"families": (*user["families"], *ev["families"]), "ops": (*user["ops"], *ev["ops"]),
              "phase": list({**dict(ev["phase"]), **dict(user["phase"])}.items()),
              "anonymous": user["anonymous"] or ev["anonymous"], "positions": (*user["positions"], *ev["positions"]),
              "router": user["router"] or ev["router"], "routers": (*user["routers"], *ev["routers"]),
              "fused": (*user["fused"], *ev["fused"])}
    return RuleSet(tuple(kernel), tuple(nvtx), tuple(ev["families"]), tuple(ev["ops"]), tuple(ev["phase"]),
                   ev["anonymous"], tuple(ev["positions"]), ev["router"], tuple(ev["routers"]), tuple(ev["fused"]))


def name_columns(names: pl.DataFrame) -> tuple[pl.Series, pl.Series]:
    """(short, demangled) as the rules read them: null short is "", a missing demangled is short."""
    short = names["name"].fill_null("")
    dem = names["demangled"]
    dem = pl.select(pl.when(dem.is_null() | (dem == "")).then(short).otherwise(dem)).to_series()
    return short, dem


def _class_end(text: str, i: int) -> int:
    """The index of the `]` that closes the character class opening at text[i] (`[^]…]` and
    escapes inside it read as regex reads them); len(text) when it is not closed."""
    n, j = len(text), i + 1
    if j < n and text[j] == "^":
        j += 1
    if j < n and text[j] == "]":
        j += 1
    while j < n and text[j] != "]":
        j += 2 if text[j] == "\\" else 1
    return j


def without_lookaround(text: str) -> str | None:
    """`text` with its lookaround groups ((?=…), (?!…), (?<=…), (?<!…)) taken out: a pattern
    that matches every string `text` matches (and more), for polars to narrow the names Python
    must search. None when the pattern is not one this scanner follows (a lookaround in a class)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            out.append(text[i:i + 2])
            i += 2
        elif c == "[":  # a character class: copied whole
            j = _class_end(text, i)
            out.append(text[i:j + 1])
            i = j + 1
        elif text.startswith(("(?=", "(?!", "(?<=", "(?<!"), i):
            depth, j = 0, i
            while j < n:
                if text[j] == "\\":
                    j += 2
                    continue
                if text[j] == "[":
                    return None
                depth += {"(": 1, ")": -1}.get(text[j], 0)
                j += 1
                if depth == 0:
                    break
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def alternatives(text: str) -> list[str]:
    """The top-level alternatives of `text` (search of A|B is search of A or of B); `[text]`
    when a global inline flag ((?i) …) would not hold across the split."""
    if re.search(r"\(\?[aiLmsux]+\)", text):
        return [text]
    parts, depth, start, i, n = [], 0, 0, 0, len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "[":
            i = _class_end(text, i) + 1
            continue
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "|" and depth == 0:
            parts.append(text[start:i])
            start = i + 1
        i += 1
    return parts + [text[start:]]


def _own_hits(text: str, s: pl.Series, pending: pl.Series) -> pl.Series:
    """column_hits of one of stepscope's own patterns: each alternative in polars when it can,
    else narrowed in polars without its lookaround and searched in Python on what is left."""
    try:
        return s.str.contains(text)
    except pl.exceptions.PolarsError:  # syntax Rust's regex lacks (lookaround)
        pass
    parts = alternatives(text)
    if len(parts) > 1:
        # the alternatives Rust's regex takes in one search, then each of the others
        ok = [p for p in parts if _rust_takes(p)]
        rest = [p for p in parts if p not in ok]
        hit = s.str.contains("|".join(ok)) if ok else pl.repeat(False, len(s), dtype=pl.Boolean, eager=True)
        for part in rest:
            hit = hit | _own_hits(part, s, pending & ~hit)
        return hit
    wide = without_lookaround(text)
    try:
        pending = pending & s.str.contains(wide) if wide is not None else pending
    except pl.exceptions.PolarsError:
        pass
    return _python_hits(re.compile(text), s, pending)


@functools.lru_cache(maxsize=256)
def _rust_takes(text: str) -> bool:
    """Whether polars (Rust's regex) compiles `text`."""
    try:
        pl.Series([""]).str.contains(text)
        return True
    except pl.exceptions.PolarsError:
        return False


def _python_hits(pattern, s: pl.Series, pending: pl.Series) -> pl.Series:
    idx = pending.arg_true()
    if len(idx) == len(s) == 0:
        return pl.Series([], dtype=pl.Boolean)
    out = [False] * len(s)
    if len(idx):
        for i, x in zip(idx.to_list(), s.gather(idx).to_list()):
            out[i] = bool(pattern.search(x))
    return pl.Series(out, dtype=pl.Boolean)


def column_hits(pattern, s: pl.Series, pending: pl.Series | None = None) -> pl.Series:
    """Whether `pattern` finds a match in each of `s`, like pattern.search. stepscope's own
    patterns run in polars (Rust's regex, linear and vectorized: 200k distinct names were 25 s
    of Python searches); one with lookaround, which Rust's regex lacks, is narrowed in polars by
    the same pattern without it, then searched in Python on the names left. A user's pattern
    (UserPattern, whose time budget names a runaway one) is searched in Python, on the `pending`
    rows only."""
    if pending is None:
        pending = pl.repeat(True, len(s), dtype=pl.Boolean, eager=True)
    if _ours(pattern):
        return _own_hits(pattern.pattern, s, pending)
    return _python_hits(pattern, s, pending)


def _hits_where(pattern, s: pl.Series, where: pl.Series) -> pl.Series:
    """column_hits of `pattern` on the rows of `s` where `where` holds (False elsewhere): only
    those names are searched."""
    if where.all():
        return column_hits(pattern, s)
    idx = where.arg_true()
    out = pl.repeat(False, len(s), dtype=pl.Boolean, eager=True)
    return out.scatter(idx, column_hits(pattern, s.gather(idx))) if len(idx) else out


def first_match(short: pl.Series, dem: pl.Series, entries, default: str) -> pl.Series:
    """For each name, the label of the first (label, pattern, field) entry that matches it
    (field: short, demangled or any), else `default`: rule order decides, as in classify_name.

    Each entry searches only the names no earlier entry took (200k distinct names: most go to
    the first few rules), and a field-any entry searches the short name only where it differs
    from the demangled one."""
    out = pl.repeat(default, len(short), dtype=pl.String, eager=True)
    pos = pl.int_range(len(short), dtype=pl.UInt32, eager=True)  # the rows still without a label
    differ = (short != dem).fill_null(True)
    entries = list(entries)
    i = 0
    while i < len(entries) and pos.len():
        label, pattern, field = entries[i]
        if not _ours(pattern):
            # a run of a user's patterns: searched in Python on the names left, without polars
            # steps per pattern (a rules file of 10,000 patterns spent 14 s in them)
            j = next((n for n in range(i, len(entries)) if _ours(entries[n][1])), len(entries))
            out, pos, short, dem = _python_run(entries[i:j], out, pos, short, dem)
            differ = (short != dem).fill_null(True)
            i = j
            continue
        hit = column_hits(pattern, short if field == "short" else dem)
        if field == "any":
            hit = hit | _hits_where(pattern, short, ~hit & differ)
        if hit.any():
            out = out.scatter(pos.filter(hit), label)
            keep = ~hit
            pos, short, dem, differ = pos.filter(keep), short.filter(keep), dem.filter(keep), differ.filter(keep)
        i += 1
    return out


def _ours(pattern) -> bool:
    """A pattern column_hits runs in polars (stepscope's own), not a user's."""
    return isinstance(pattern, re.Pattern) and not pattern.flags & ~re.UNICODE


def _python_run(entries, out: pl.Series, pos: pl.Series, short: pl.Series, dem: pl.Series):
    """first_match over consecutive user patterns, as Rule.matches reads them, on Python lists
    of the names still without a label: (out, pos, short, dem) after them."""
    P, S, D = pos.to_list(), short.to_list(), dem.to_list()
    taken: dict[str, list[int]] = {}
    for label, pattern, field in entries:
        if not P:
            break
        keep = []
        for n, (a, b) in enumerate(zip(S, D)):
            if field == "short":
                hit = pattern.search(a)
            else:
                hit = pattern.search(b) or (field == "any" and a != b and pattern.search(a))
            if hit:
                taken.setdefault(label, []).append(P[n])
            else:
                keep.append(n)
        P, S, D = [P[n] for n in keep], [S[n] for n in keep], [D[n] for n in keep]
    for label, rows in taken.items():
        out = out.scatter(pl.Series(rows, dtype=pl.UInt32), label)
    return (out, pl.Series(P, dtype=pl.UInt32), pl.Series(S, dtype=pl.String), pl.Series(D, dtype=pl.String))


def classify_names(names: pl.DataFrame, rules: RuleSet) -> pl.DataFrame:
    """names: unique rows of (short_id, demangled_id, name, demangled) → adds `class`, each
    distinct name classified once, by column (`first_match`); a name the rule set classed
    before (rules.memo) is not matched again."""
    return names.with_columns(memo_first_match(names, rules, "class", [(r.cls, r.pattern, r.field)
                                                                         for r in rules.kernel_rules], "other"))


def memo_first_match(names: pl.DataFrame, rules: RuleSet, label: str, entries, default: str) -> pl.Series:
    """first_match over the names (name, demangled) of `names`, as a String Series `label`; the
    names the rule set labelled before under `label` (rules.memo: the windows of a long run meet
    the same few hundred names each) are not matched again."""
    known = rules.memo.get(label)
    hit = None
    if known is not None and names.height:
        hit = names.select(pl.col("name", "demangled").cast(pl.String)).join(
            known, on=["name", "demangled"], how="left", nulls_equal=True, maintain_order="left")[label]
        if not hit.null_count():
            return hit
    todo = names if hit is None else names.filter(hit.is_null())
    short, dem = name_columns(todo)
    got = first_match(short, dem, entries, default)
    new = todo.select(pl.col("name", "demangled").cast(pl.String)).with_columns(got.cast(pl.String).alias(label))
    rules.memo[label] = new if known is None else pl.concat([known, new])
    if hit is None:
        return got.alias(label)
    # the names met before keep their label, the others take theirs, in the names' order
    return hit.scatter(hit.is_null().arg_true(), got).alias(label)


def nvtx_attribution(
    launches: pl.DataFrame | pl.LazyFrame, nvtx: pl.DataFrame, rules: RuleSet
) -> pl.DataFrame:
    """Class from the innermost rule-matching NVTX range holding each launching call.

    launches: (row, pid, tid, launch_start); returns (row, nvtx_class) for attributed rows.
    Only ranges whose name matches an [[nvtx]] rule take part; among those, the latest one
    starting at or before the call is used if it still covers the call. A lazy `launches` is
    collected only when some range matches a rule (it is a million-row selection).
    """
    if nvtx.is_empty() or not rules.nvtx_rules:
        return pl.DataFrame(schema={"row": pl.UInt32, "nvtx_class": pl.String})
    uniq = nvtx.select("name").unique()
    uniq = uniq.with_columns(
        pl.Series("nvtx_class", [rules.classify_range(n) for n in uniq["name"].to_list()], dtype=pl.String)
    ).drop_nulls("nvtx_class")
    if isinstance(launches, pl.LazyFrame):
        launches = launches.collect()
    if uniq.is_empty() or launches.is_empty():
        return pl.DataFrame(schema={"row": pl.UInt32, "nvtx_class": pl.String})
    ranges = (
        nvtx.join(uniq, on="name")
        .select("pid", "tid", pl.col("start").alias("r_start"), pl.col("end").alias("r_end"), "nvtx_class")
        .sort("r_start")
    )
    hit = (
        launches.drop_nulls("launch_start").sort("launch_start")
        .join_asof(ranges, left_on="launch_start", right_on="r_start", by=["pid", "tid"], strategy="backward", check_sortedness=False)
        .filter(pl.col("r_end") >= pl.col("launch_start"))
    )
    return hit.select("row", "nvtx_class")
