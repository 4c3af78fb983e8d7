"""What a command is doing, on stderr, while it takes longer than about a second.

A command wraps its slow part in `shown(...)` and names each stage with `stage(text)`; nothing
appears unless the work is still running after DELAY_S and stderr is a terminal, so pipes, CI
logs and `--json` runs stay byte-for-byte what they were. The line is transient: it is erased
before the command writes its result. `notice(text)` prints one lasting line on stderr (above
the progress line when one is shown), for things a user should know happened, such as a cache
written to disk.
"""

from __future__ import annotations

import sys
import threading
from contextlib import contextmanager

DELAY_S = 1.0  # below this a progress line would only flicker

_lock = threading.Lock()
_current: "_Display | None" = None


def _stderr_is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed stream
        return False


class _Display:
    """One rich progress line, started by a timer only if the work outlasts DELAY_S."""

    def __init__(self) -> None:
        self.text = "working"
        self.done: tuple[int, int] | None = None  # a bar's (done, total), when the work counts its parts
        self._progress = None
        self._task = None
        self._timer = threading.Timer(DELAY_S, self._start)
        self._timer.daemon = True
        self._stopped = False

    def _start(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        with _lock:
            if self._stopped:
                return
            # the terminal test was done by the caller; rich must not redo it on a replaced stream
            console = Console(stderr=True, force_terminal=True)
            # a bar beside the text once the work says how many parts it has (the count leads
            # the text: bar(): on a narrow terminal a long text is cut at its end, never the count)
            self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"),
                                      _Counted(BarColumn(bar_width=20)), TimeElapsedColumn(), console=console,
                                      transient=True)
            done, total = self.done or (0, None)
            self._task = self._progress.add_task(self.text, total=total, completed=done)
            self._progress.start()

    def update(self, text: str) -> None:
        with _lock:
            self.text = text
            if self._progress is not None:
                # drawn now, not at the next tick: a stage can be shorter than rich's refresh period
                self._progress.update(self._task, description=text, refresh=True)

    def advance(self, text: str, done: int, total: int) -> None:
        text = f"{done}/{total} {text}"
        with _lock:
            self.text, self.done = text, (done, total)
            if self._progress is not None:
                self._progress.update(self._task, description=text, completed=done, total=total, refresh=True)

    def print(self, text: str) -> bool:
        with _lock:
            if self._progress is None:
                return False
            self._progress.console.print(text, markup=False, highlight=False, soft_wrap=True)
            return True

    def stop(self) -> None:
        self._timer.cancel()
        with _lock:
            self._stopped = True
            if self._progress is not None:
                self._progress.stop()
                self._progress = None


class _Counted:
    """A rich column shown only for work that counts its parts (a task with a total)."""

    def __init__(self, column) -> None:
        self.column = column

    def __call__(self, task):
        from rich.text import Text

        return self.column(task) if task.total is not None else Text("")

    def __getattr__(self, name):
        return getattr(self.column, name)


@contextmanager
def shown(enabled: bool = True):
    """Show the stages of the enclosed work, if `enabled` (pass False for --json runs) and stderr
    is a terminal and the work outlasts DELAY_S."""
    global _current
    if not enabled or _current is not None or not _stderr_is_terminal():
        yield
        return
    display = _Display()
    _current = display
    display._timer.start()
    try:
        yield
    finally:
        stop()


def stage(text: str) -> None:
    """Name what the command is doing now (a no-op when no progress is shown)."""
    if _current is not None:
        _current.update(text)


def bar(text: str, done: int, total: int) -> None:
    """Name what the command is doing and how far it is: `done` of `total` parts (the windows
    of a long trace: by_windows.py); a no-op when no progress is shown."""
    if _current is not None:
        _current.advance(text, done, total)


def stop() -> None:
    """Erase the progress line now (before an error message or the result is written)."""
    global _current
    display, _current = _current, None
    if display is not None:
        display.stop()


def notice(text: str) -> None:
    """One lasting line on stderr: `stepscope: <text>`."""
    line = f"stepscope: {text}"
    if _current is not None and _current.print(line):
        return
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
