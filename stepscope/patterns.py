"""Regular expressions applied to names from a trace (NVTX ranges, kernel names).

stepscope's own patterns (data/rules.toml, the default step regex, the name parsers) are
plain `re` patterns kept linear in the name's length: tests/test_regex_limits.py times
each one on 1 MB names. A user's pattern (--step-regex, a --rules file) may backtrack
exponentially ((a|aa)+$ on a long name runs for ages), so it runs under the `regex` package,
whose matcher takes a timeout, with one time budget per pattern over the whole run; the
pattern that spends it is named in one line.
"""

from __future__ import annotations

import os
import re
import time

from stepscope.errors import InputError

# seconds one user pattern may spend over every name of a run: legitimate patterns take
# microseconds per name, so this only ever stops a runaway one
BUDGET_S = float(os.environ.get("STEPSCOPE_REGEX_BUDGET_S", "5"))
# a counted repetition is compiled into that many copies: a{99999999} took 5 GiB and 40 s before a
# MemoryError. Bounded before compiling: each count, and the product of all counts of a pattern
# (nesting multiplies them; the product of all over-approximates the nested ones)
MAX_REPEAT = 1000
MAX_REPEAT_PRODUCT = 100_000
_COUNTED = re.compile(r"(?<!\\)\{(\d+)(?:,(\d*))?\}")


def _repetition(text: str) -> str | None:
    """Why `text`'s counted repetitions are too large to compile safely (None when they are not)."""
    product = 1
    for m in _COUNTED.finditer(text):
        n = max(int(m.group(1)), int(m.group(2) or 0))  # digits only: int() of a long run is bounded by the pattern
        if n > MAX_REPEAT:
            return f"repetition {m.group()} exceeds {MAX_REPEAT:,}"
        product *= max(n, 1)
        if product > MAX_REPEAT_PRODUCT:
            return f"its counted repetitions multiply past {MAX_REPEAT_PRODUCT:,}"
    return None


class PatternError(InputError):
    """A user's pattern does not compile; `reason` is the regex engine's own words."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


class UserPattern:
    """A user's pattern: `search` like re's, under the time budget."""

    def __init__(self, text: str, where: str):
        import regex

        self.text, self.where = text, where
        too_big = _repetition(text)
        if too_big is not None:
            raise PatternError(f"{where}: regex {text[:200]!r} refused: {too_big} (it would take memory in "
                               "proportion when compiled); use + or * or a smaller count", too_big)
        try:
            # V0: the behaviour of Python's re module (the patterns' documented dialect)
            self._rx = regex.compile(text, flags=regex.V0)
        except (regex.error, RecursionError, OverflowError, ValueError) as e:
            raise PatternError(f"{where}: bad regex {text!r}: {e}; fix the pattern", str(e)) from None
        self._left = BUDGET_S

    @property
    def pattern(self) -> str:
        return self.text

    def search(self, name: str):
        t0 = time.perf_counter()
        try:
            return self._rx.search(name, timeout=max(self._left, 1e-3))
        except TimeoutError:
            raise InputError(
                f"{self.where}: pattern {self.text!r} ran past {BUDGET_S:g} s on this trace's names "
                f"({len(name):,} characters in the last): it backtracks; rewrite it without nested "
                "or overlapping repetition (like (a|aa)+ or (x+)+)") from None
        finally:
            self._left -= time.perf_counter() - t0


def ours(text: str) -> re.Pattern:
    """One of stepscope's own patterns (audited linear; compiled with re, which is faster)."""
    return re.compile(text)
