"""Names as they are shown: a trace may hold a name of a megabyte (a runaway f-string in an NVTX
range, a generated kernel), which rich would wrap and measure for minutes and an HTML report
would repeat in every tooltip. What is shown is cut, with its length said; the JSON documents
(analyze, compare, tp --json) keep every name whole.
"""

from __future__ import annotations

TERMINAL = 200    # characters of a name on the terminal
DOCUMENT = 4096   # in a report's tooltips and a Perfetto event (long C++ template names fit)


def cut(name, limit: int = TERMINAL):
    """`name` when it is at most `limit` characters, else its start and how long it was."""
    if not isinstance(name, str) or len(name) <= limit:
        return name
    return f"{name[:limit]}… ({len(name):,} characters)"


def term(text, limit: int = TERMINAL) -> str:
    """Text from a trace or a file for rich: cut, and with rich's markup escaped. A name holding
    "[/]" or "[red" was read as markup: a MarkupError (exit 3), or a name restyled."""
    from rich.markup import escape

    return escape(str(cut(text, limit)))
