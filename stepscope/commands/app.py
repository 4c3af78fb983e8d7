"""The Typer app, the options the commands share, and how a command reports bad input.

A leaf module: the command modules import their options from it, and
stepscope/commands/__init__.py's COMMANDS puts them on `app` (cli.py registers them, once);
nothing here imports a command or cli.py. Heavy imports (polars, the analyses) wait inside the
commands so `stepscope --help` stays fast.

One error idiom: a command (or the library under it) raises StepscopeError (`fail` here); the
one boundary, cli.run (what cli.main() runs), turns it into one line and its exit code
(`error_exit`) and anything else into one line and exit 3. The app itself catches nothing: tests
invoke it through the same boundary (tests/conftest.py's CliRunner).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, NoReturn, Optional

import typer

from stepscope.selection import STEPS_HELP

NO_CACHE_HELP = "read the export itself, not its Parquet cache (and write none)"


def error_exit(e) -> int:
    """A StepscopeError as the user sees it: one line on stderr (after the progress line is
    erased, which it must not be drawn over); returns its exit code."""
    from stepscope.render import progress

    progress.stop()
    typer.echo(f"stepscope: error: {e}", err=True)
    return e.exit_code


app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Explains where the time and the bytes of one LLM inference engine step go.",
    pretty_exceptions_enable=False,
    # a docstring's lines are one paragraph in the commands' list (rich mode kept their breaks:
    # ragged lines at 80 columns)
    rich_markup_mode="markdown",
)


def fail(message: str) -> NoReturn:
    """Stop the command: `message` is bad input, one line and exit 2 (see error_exit)."""
    from stepscope.errors import InputError

    raise InputError(message)


def _print_version(value: bool) -> None:
    if value:
        from stepscope import __version__

        typer.echo(f"stepscope {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                 help="print stepscope's version and exit"),
) -> None:
    """Explains where the time and the bytes of one LLM inference engine step go."""


def steps_option(note: str = "", old_name: bool = False):
    """The --steps option (stepscope.selection's grammar), `note` saying what it selects here;
    `old_name`: --step still works (report, budget)."""
    names = ("--steps", "--step") if old_name else ("--steps",)
    return typer.Option(*names, metavar="S", help=STEPS_HELP + note)


# the options several commands share (the JSON flag's parameter is `as_json` everywhere)
AsJson = Annotated[bool, typer.Option("--json", help="print one JSON document on stdout")]
Steps = Annotated[str, steps_option()]
StepRegex = Annotated[Optional[str], typer.Option("--step-regex", help="regex for NVTX / annotation step range names")]
Strict = Annotated[bool, typer.Option("--strict",
                                      help="a --step-regex that matches no range is an error, not a warning")]
Rules = Annotated[Optional[Path], typer.Option("--rules", help="TOML file of extra classification rules")]
Force = Annotated[bool, typer.Option("--force", help="replace an output file even when it is read-only")]
NoCache = Annotated[bool, typer.Option("--no-cache", help=NO_CACHE_HELP)]
TraceArg = Annotated[Path, typer.Argument(help="nsys SQLite export or PyTorch-profiler trace (.json/.json.gz)")]


def output_option(what: str):
    """-o/--output, the file a command writes (its extension picks the format); `what`: its help."""
    return typer.Option("-o", "--output", help=what + "; - for stdout")
CalibrationFile = Annotated[Optional[Path], typer.Option(
    "--calibration", metavar="F",
    help="what-if calibration file (`stepscope calibrate`); default: the user's "
         "$XDG_CONFIG_HOME/stepscope/calibration.json when it exists, else the bundled H200 one")]
