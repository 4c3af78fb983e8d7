"""stepscope: where the time and the bytes of one LLM inference engine step go."""

__version__ = "0.1.0"
__all__ = ["open_trace", "__version__"]


def __getattr__(name):  # lazy: `import stepscope` must not pull polars for the CLI's --help
    if name == "open_trace":
        from stepscope.api import open_trace

        return open_trace
    raise AttributeError(name)
