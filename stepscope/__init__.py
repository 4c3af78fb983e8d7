"""stepscope: where the time and the bytes of one LLM inference engine step go.

The Python API (docs/API.md): `open_trace(path)` for one trace's steps, figures and verdicts
(an Analysis), and the function behind each command — `analyze` (the pipeline's Result),
`compare`, `tp`, `budget`, `report`, `export`, `calibrate` — each returning what its command
prints with `--json` (or, for report and export, what it writes; for calibrate, the Calibration
it writes). `Options`, `read` and `render` are the links of stepscope/pipeline.py's chain.
"""

__version__ = "0.1.0"
# where each name lives; imported on first use: `import stepscope` must not pull polars for the
# CLI's --help
_LAZY = {"open_trace": "stepscope.api", "Analysis": "stepscope.api", "Step": "stepscope.api",
         "analyze": "stepscope.library", "Options": "stepscope.pipeline", "Result": "stepscope.pipeline",
         "read": "stepscope.pipeline", "render": "stepscope.pipeline",
         "compare": "stepscope.library", "tp": "stepscope.library", "budget": "stepscope.library",
         "report": "stepscope.library", "export": "stepscope.library", "calibrate": "stepscope.library",
         "StepscopeError": "stepscope.errors", "InputError": "stepscope.errors"}
__all__ = ["__version__", *_LAZY]


def __getattr__(name):
    if name in _LAZY:
        from importlib import import_module

        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'stepscope' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
