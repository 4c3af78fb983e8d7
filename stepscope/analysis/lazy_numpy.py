"""numpy, imported on first use.

A run that reads a kept analysis (the warm path) computes nothing over arrays, and `import numpy`
is about a fifth of such a run (0.15 s of a 0.7 s process on the 2-core box): the analyses name
`np` from here, and numpy is imported the first time one of them reaches for an attribute.
Each attribute is then kept on the proxy, so later uses cost an ordinary attribute lookup.
"""

from __future__ import annotations

import importlib
from typing import Any


class _LazyModule:
    __slots__ = ("_name", "__dict__")

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        value = getattr(importlib.import_module(self._name), attr)
        setattr(self, attr, value)
        return value

    def __repr__(self) -> str:
        return f"<{self._name}, imported on first use>"


np: Any = _LazyModule("numpy")
