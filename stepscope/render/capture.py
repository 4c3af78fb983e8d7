"""The capture's own defects in words (analysis/capture_check.py), for every renderer: shown
before any step, since every figure after them is only as complete as the capture."""

from __future__ import annotations


def defect_line(row: dict) -> str:
    """One defect (a DEFECT_SCHEMA row) as one sentence with what to do."""
    return f"{row['text']}; to fix: {row['remedy']}"


def defect_rows(inv) -> list[dict]:
    """The inventory's defects as rows (none for an inventory without the field)."""
    frame = getattr(inv, "capture", None)
    return [] if frame is None or frame.is_empty() else frame.to_dicts()


def shown_warnings(inv) -> list[str]:
    """The inventory's warnings in words but those a defect stands for (shown once, as the defect)."""
    from stepscope.render.sentences import warning_texts

    return warning_texts(inv.shown_warnings())
