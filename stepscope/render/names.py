"""Names as they are shown: a trace may hold a name of a megabyte (a runaway f-string in an NVTX
range, a generated kernel), which rich would wrap and measure for minutes and an HTML report
would repeat in every tooltip. What is shown is cut, with its length said; the JSON documents
(analyze, compare, tp --json) keep every name as the trace was read: whole up to
ingest/sanity.NAME_MAX characters, beyond it shortened at ingest with its length and digest
(a 10 MB name repeated in every step's kernel list made a 10 GB document).
"""

from __future__ import annotations

import re

TERMINAL = 200    # characters of a name on the terminal
DOCUMENT = 4096   # in a report's tooltips and a Perfetto event (long C++ template names fit)


# the tail ingest/sanity.py gives a name it shortened: the whole name's length and digest
_SHORTENED = re.compile(r"…\[([\d,]+) characters, sha256 [0-9a-f]{16}\]\Z")


def cut(name, limit: int = TERMINAL):
    """`name` when it is at most `limit` characters, else its start and how long it was (the
    length of the whole name, for one ingest shortened)."""
    if not isinstance(name, str) or len(name) <= limit:
        return name
    m = _SHORTENED.search(name)
    length = m.group(1) if m else f"{len(name):,}"
    return f"{name[:limit]}… ({length} characters)"


def short(name) -> str:
    """A kernel's name without what a table has no room for: a demangled C++ name's return type,
    namespaces, template arguments and parameters (`void at::native::reduce_kernel<512, 1,
    ...>(T3)` -> `reduce_kernel`); a plain name (`nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT`) as it
    is. The whole name stays in --json."""
    if not isinstance(name, str):
        return name
    base = name.strip()
    if base.startswith("void "):
        base = base[5:]
    cut_at = len(base)
    for i, ch in enumerate(base):  # the first '<' or '(' outside '<unnamed>'-like brackets ends the name
        if ch in "<(" and not base.startswith("<unnamed>", i):
            cut_at = i
            break
    base = base[:cut_at]
    scope = base.rfind("::")
    return (base[scope + 2:] if scope >= 0 else base) or name


# C0 controls (ESC, CR, LF, BEL, ...), DEL and C1 (CSI 0x9b, OSC 0x9d): in a name they would
# clear a screen, retitle a window, plant an OSC 8 link or end a Markdown table row
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def controls(text) -> str:
    """`text` with every control character shown escaped (ESC as `\\x1b`): what a name from a
    trace shows on a terminal, a pipe or in a Markdown report, TTY or not."""
    text = str(text)
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text) if _CONTROL.search(text) else text


def term(text, limit: int = TERMINAL) -> str:
    """Text from a trace or a file for rich: cut, control characters escaped (`controls`), and
    rich's markup escaped. A name holding "[/]" or "[red" was read as markup: a MarkupError
    (exit 3), or a name restyled."""
    from rich.markup import escape

    return escape(controls(cut(text, limit)))


# Markdown: what a trace-derived string may not bring into a report. `<` and `&` become entities
# (no raw HTML, autolink or entity reaches a renderer that allows HTML); backslash, backtick,
# emphasis and link brackets are backslash-escaped; control characters (a CR or
# LF would end a table row, a code span) are shown escaped.
# `|`: _cell escapes it in tables; `_` inside a word opens no emphasis, so a file name like
# llama8b_decode_b1.sqlite stays readable in the Markdown source
_MD_SPECIAL = re.compile(r"[\\`*\[\]~]|(?<![0-9A-Za-z])_|_(?![0-9A-Za-z])")
_BACKTICKS = re.compile(r"`+")


def md_text(text) -> str:
    """A trace-derived string as Markdown text that renders as itself: never a tag, a link, a
    code span or a new line."""
    text = controls(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _MD_SPECIAL.sub(lambda m: "\\" + m.group(), text)


def md_code(text) -> str:
    """A trace-derived string as a Markdown code span: fenced by one backtick more than its
    longest run of backticks (padded when it starts or ends with one), on one line."""
    text = controls(text)
    fence = "`" * (max((len(r) for r in _BACKTICKS.findall(text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or (text.startswith(" ") and text.endswith(" ")) else ""
    return f"{fence}{pad}{text}{pad}{fence}"
