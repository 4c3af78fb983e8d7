"""The terminal every view prints on: sentences wrapped so that a number keeps its unit, and
tables that fit the width by dropping their least needed columns, never by cutting the cells
that tell rows apart (a class, an op, a cell's name, a rank). What a narrow table leaves out
is said in its title and stays in `--json` and on a wider terminal.

A Page is a rich Console: each renderer takes one (`page()` by default) and prints as before.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

from stepscope.render.units import plural  # noqa: F401 (the renderers' one import)

# a space between a number and its unit, which a line never breaks at (`4.661 ms`, `0.45 µs`)
_GLUED = re.compile(r"(?<=\d) (?=(?:ms|µs|ns|s|GB|MB|KB|kB|B|GiB|MiB|TB/s|GB/s|%|×|tok)(?:\W|$))")
_WORD = re.compile(r"\S+\s*")


def breaks(plain: str, width: int) -> tuple[list[int], int]:
    """Where `plain` (one line of text) is broken to fit `width` cells: the offsets of the lines
    after the first, and the indent of those lines (the first line's own). Words go whole to the
    next line, a number with its unit; a word wider than a line (a kernel name) is folded."""
    masked = _GLUED.sub("_", plain)  # same length: offsets into `masked` are offsets into `plain`
    indent = len(plain) - len(plain.lstrip(" "))
    if indent > width // 2:
        indent = 0
    out, col = [], indent
    for m in _WORD.finditer(masked, indent):
        word = m.group().rstrip()
        if col > indent and col + cell_len(word) > width:
            out.append(m.start())
            col = indent
        pos, rest = m.start(), word
        while col + cell_len(rest) > width and width - col > 0:  # longer than a line: folded
            pos, rest = pos + (width - col), rest[width - col:]
            out.append(pos)
            col = indent
        col += cell_len(rest) + (len(m.group()) - len(word))
    return out, indent


class Page(Console):
    """A Console whose sentences never part a number from its unit: a plain string printed
    alone is wrapped here (rich wraps at any space), continuation lines under its first word."""

    def print(self, *objects, **kwargs):  # noqa: A003 (rich's name)
        if len(objects) != 1 or not isinstance(objects[0], str) or kwargs.keys() - {"style", "highlight"}:
            return super().print(*objects, **kwargs)
        text = self.render_str(objects[0], style=kwargs.get("style", ""),
                               highlight=kwargs.get("highlight"))
        for part in text.split("\n", allow_blank=True):
            offsets, indent = breaks(part.plain, self.width)
            for i, line in enumerate(part.divide(offsets)):
                line.rstrip()
                if i and indent:
                    line = Text(" " * indent) + line
                super().print(line, no_wrap=True, overflow="ignore", crop=False)
        return None

    def rule(self, title="", **kwargs):
        """A rule; a title too long for one (a long file or range name) goes above a bare rule,
        wrapped, instead of being cut with `…`."""
        plain = Text.from_markup(title).plain if isinstance(title, str) else str(title)
        if cell_len(plain) + 4 <= self.width:
            return super().rule(title, **kwargs)
        self.print(title)
        return super().rule(**kwargs)


def page(stderr: bool = False) -> Page:
    """The console a view prints on."""
    return Page(stderr=stderr)


@dataclass
class Col:
    """A column of a fitted table. `drop`: 0 = always shown, else dropped (highest first) when the
    table is too wide; `group`: dropped into header rows (the value once above its run of rows)
    instead of vanishing; `flex`: a name that is not what tells rows apart, cut with `…` to the
    width left (at least `min` cells)."""

    header: str
    justify: str = "right"
    drop: int = 0
    group: bool = False
    flex: bool = False
    min: int = 12


def _width(cell) -> int:
    return max((cell_len(x) for x in Text.from_markup(cell).plain.split("\n")), default=0) if cell else 0


def fitted(width: int, cols: list[Col], rows: list[list[str]], title: str | None = None,
           total: bool = False, **table) -> Table:
    """A table of `rows` (markup strings) under `cols` that fits `width` cells: columns dropped
    in their `drop` order until it does (the title then names them: `--json or a wider
    terminal`), a group column turned into header rows, the flex name cut, every other cell
    whole on one line. At most one flex column; `total`: the last row is a total, set apart."""
    import textwrap

    body = [max([0] + [_width(r[i]) for r in rows]) for i in range(len(cols))]
    # a header stacked at its spaces (`device floor` over `ms`) is as wide as its cells or its
    # longest word
    stacked = ["\n".join(textwrap.wrap(c.header, max(body[i], *map(len, c.header.split() or [""]))))
               or c.header for i, c in enumerate(cols)]
    wide = [max(body[i], _width(c.header)) for i, c in enumerate(cols)]
    narrow = [max(body[i], _width(stacked[i])) for i in range(len(cols))]

    def widths(idx: list[int], natural: list[int]) -> dict[int, int]:
        w = {i: min(natural[i], cols[i].min) if cols[i].flex else natural[i] for i in idx}
        groups = [i for i, c in enumerate(cols) if c.group and i not in idx]
        if groups and idx:  # the first column holds the group rows and indents its own cells
            w[idx[0]] = max(w[idx[0]] + 2, max(_width(" · ".join(r[g] for g in groups)) for r in rows) if rows else 0)
        return w

    def need(idx: list[int], natural: list[int]) -> int:
        return sum(v + 2 for v in widths(idx, natural).values()) + len(idx) - 1

    keep, natural = list(range(len(cols))), wide
    for rank in sorted({c.drop for c in cols if c.drop}, reverse=True) + [None]:
        if need(keep, wide) <= width:
            break
        if need(keep, narrow) <= width or rank is None:
            natural = narrow
            break
        keep = [i for i in keep if cols[i].drop != rank]
    headers = [c.header if natural is wide else stacked[i] for i, c in enumerate(cols)]
    grouped = [i for i, c in enumerate(cols) if c.group and i not in keep]
    left_out = [c.header for i, c in enumerate(cols) if i not in keep and not c.group]
    if left_out:
        title = f"{title or ''} ({', '.join(left_out)}: --json or a wider terminal)".strip()
    w = widths(keep, natural)
    flex = [i for i in keep if cols[i].flex]
    room = width - (need(keep, natural) - sum(w[i] for i in flex)) if flex else 0
    t = Table(show_edge=False, header_style="bold", title=title, title_justify="left", **table)
    for i in keep:
        t.add_column(headers[i], justify=cols[i].justify, no_wrap=True,
                     overflow="ellipsis" if cols[i].flex else "fold")
    last = None
    for n, r in enumerate(rows):
        if total and n == len(rows) - 1:
            t.add_section()
        if grouped:
            key = " · ".join(r[g] for g in grouped if r[g])
            if key and key != last:
                t.add_row(*([f"[bold]{key}[/]"] + [""] * (len(keep) - 1)))
            last = key
        cells: list = [r[i] for i in keep]
        for j, i in enumerate(keep):
            if i in flex:
                plain = Text.from_markup(cells[j]).plain
                cut = max(4, room)  # below its minimum when nothing else can go
                if cell_len(plain) > cut:
                    cells[j] = Text(plain[:cut - 1] + "…")
        if grouped and last and isinstance(cells[0], str):
            cells[0] = "  " + cells[0]
        t.add_row(*cells)
    return t
