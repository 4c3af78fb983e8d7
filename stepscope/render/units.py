"""How stepscope writes times and bytes for people: one policy for the terminal and the reports.

Machine-readable output — every `--json` document, the Perfetto export, cells tables — keeps
integer nanoseconds and bytes and never goes through this module.

For people (terminal, HTML, Markdown), the unit follows what a figure measures, not where it is
shown, so a number reads the same in `analyze` and in its report:

- a figure of the **whole step** — step time, GPU busy / span / idle, Σ kernel time, time in
  launch calls, the CPU and device floors, the what-if step time, a rank's collective time,
  transfer and wait, rank skew — is in **milliseconds, three decimals** (`29.868 ms`: 1 µs
  resolution, and a decode step still reads as a few ms);
- a figure of **one part of the step** — a kernel, a class, a gap, a gap kind, a launch call,
  the host cost per launch, launch latency, the bytes floor of a class — is in **microseconds,
  one decimal** (`68.2 µs`: the ~0.5 µs device gaps inside a CUDA graph stay visible);
- a **table keeps one unit per column**, named in the header (`time µs`), its cells bare numbers
  (`us_num`, `ms_num`); a totals row in a column of parts keeps the column's unit;
- an **axis** labels each tick in the unit that fits the tick spacing (`tick`: `500 µs`, `2 ms`);
- the **gap between two graph nodes** (a fraction of a µs, the what-if's and the TP projection's
  constant) is in microseconds, two decimals (`0.68 µs`, `node_gap`);
- a figure of a **whole run** (its wall time, an engine's start-up) is in seconds, three
  decimals (`5.657 s`, `seconds`);
- a **ratio of two times** is two decimals and `×` (`5.10×`, `times`); a signed percentage one
  decimal with a true minus sign (`−4.1%`, `signed_percent`), a share one decimal without sign;
- a **count** is singular for one (`1 step`, `plural`);
- **bytes** are decimal SI with two decimals (`15.53 GB`), as ncu and HBM bandwidths count them.

A missing value is `–`. Sentences and tables follow the same rules (`29.868 ms` in a verdict
sentence as in a table). Every renderer formats through these functions; none formats a time,
a ratio or a percentage with its own f-string (tests/test_units.py looks).
"""

from __future__ import annotations

MISSING = "–"


def ms(ns, sign: bool = False) -> str:
    """A whole-step figure: `29.868 ms` (`+1.250 ms` with sign)."""
    return MISSING if ns is None else f"{ms_num(ns, sign)} ms"


def seconds(ns) -> str:
    """A figure of a whole run or an engine's start-up: `5.657 s`."""
    return MISSING if ns is None else f"{ns / 1e9:,.3f} s"


def us(ns, sign: bool = False) -> str:
    """A figure of one part of the step: `68.2 µs` (`-3.1 µs` with sign)."""
    return MISSING if ns is None else f"{us_num(ns, sign)} µs"


def node_gap(ns) -> str:
    """The gap between two CUDA-graph nodes: `0.68 µs`."""
    return MISSING if ns is None else f"{ns / 1e3:.2f} µs"


def ms_num(ns, sign: bool = False) -> str:
    """A cell of a column headed in ms: `29.868`."""
    return MISSING if ns is None else (f"{ns / 1e6:+,.3f}" if sign else f"{ns / 1e6:,.3f}")


def us_num(ns, sign: bool = False) -> str:
    """A cell of a column headed in µs: `3,860.3`."""
    return MISSING if ns is None else (f"{ns / 1e3:+,.1f}" if sign else f"{ns / 1e3:,.1f}")


def tick(ns: float) -> str:
    """An axis label: 2-3 significant digits in the unit that fits (`512 ns`, `1.5 µs`,
    `16 µs`, `2 ms`, `-500 µs`)."""
    a = abs(ns)
    for div, unit in ((1_000_000, "ms"), (1000, "µs"), (1, "ns")):
        if a >= div or div == 1:
            v = ns / div
            text = f"{v:.1f}" if abs(v) < 10 and div > 1 and v != int(v) else f"{v:.0f}"
            return f"{text} {unit}" if ns else "0"
    raise AssertionError("unreachable")


def nbytes(b) -> str:
    """Bytes, decimal SI: `15.53 GB`, `-2.10 MB`, `512 B`."""
    if b is None:
        return MISSING
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(b) >= div:
            return f"{b / div:.2f} {unit}"
    return f"{int(b)} B"


def plural(n: int, word: str, many: str | None = None) -> str:
    """A count for people: `1 step`, `2 steps` (`many`: an irregular plural)."""
    return f"{n:,} {word if n == 1 else (many or word + 's')}"


def times(x) -> str:
    """A ratio of two times: `5.10×` (two decimals, whatever its JSON carries)."""
    return MISSING if x is None else f"{x:.2f}×"


def signed_percent(x) -> str:
    """A signed ratio as people read it: `−4.1%`, `+7.8%` (a true minus sign)."""
    return MISSING if x is None else f"{100 * x:+.1f}%".replace("-", "\u2212")


def wrapped(text: str, width: int) -> list[str]:
    """`text` wrapped to `width` columns without parting a number from its unit (`0.51 µs`):
    the terminal wraps sentences at spaces, and a unit alone at a line's start reads as nothing."""
    import re
    import textwrap

    glued = re.sub(r"(\d) (ms|µs|ns|s|GB|MB|kB|KB|GiB|MiB|%|×)(?=\W|$)", "\\1\u00a0\\2", text)
    # textwrap breaks at ASCII whitespace only: the no-break space holds
    return [line.replace("\u00a0", " ") for line in textwrap.wrap(glued, max(width, 20)) or [""]]
