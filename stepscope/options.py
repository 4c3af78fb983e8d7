"""Numbers given on the command line: finite and within what an engine step can be, or one
line naming the option. click takes "nan", "inf" and 1e308 as floats, and a NaN passes every
comparison the analyses make, so each numeric option is checked where a command reads it.
"""

from __future__ import annotations

import math

from stepscope.errors import InputError


def number(value: float | None, option: str, lo: float, hi: float) -> float | None:
    """`value` (None stays None) when finite and in [lo, hi]; InputError otherwise."""
    if value is None:
        return None
    if not math.isfinite(value):
        raise InputError(f"{option} {value}: give a finite number from {lo:g} to {hi:g}")
    if not lo <= value <= hi:
        raise InputError(f"{option} {value:g}: give a number from {lo:g} to {hi:g}")
    return value


def integer(value: int | None, option: str, lo: int, hi: int) -> int | None:
    """`value` (None stays None) when in [lo, hi]; InputError otherwise."""
    if value is None:
        return None
    if not lo <= value <= hi:
        raise InputError(f"{option} {value}: give a whole number from {lo:,} to {hi:,}")
    return value


def at_most(value: int | None, option: str, hi: int) -> int | None:
    """`value` (None stays None) when at most `hi`; InputError otherwise."""
    if value is not None and value > hi:
        raise InputError(f"{option} {value}: at most {hi:,}")
    return value


# What one step can be, generously: the bounds only keep products of the figures (launches ×
# host cost, batch × context × bytes per token) inside 64-bit integers.
MAX_KERNELS = 10**9
MAX_HOST_US = 1e6          # one second of host time per launch
MAX_DEVICE_MS = 1e6        # a thousand seconds of device time per step
MAX_COLLECTIVE_US = 1e6
MAX_GRAPH_NS = 1e12
MAX_WIDTH = 65_536
MAX_BATCH = 100_000
MAX_CONTEXT = 10_000_000
MAX_WORKERS = 4_096        # dask workers of a local cluster

