"""Entry point: parse the subcommand, run it, and turn input errors into one line.

Only the chosen subcommand's module is imported (each pulls in what it needs: pydantic
and SimPy for `run`, pandas for tables, the calibration code for `calibrate`), so
`infersim --help` and a mistyped command cost no more than Python's start-up. What those
imports made (modules, classes, pydantic validators: tens of thousands of objects that
live until the process ends) is then moved out of the garbage collector's sight
(`gc.freeze`) when `infersim` runs as a program, so that the collector's full
collections, during a run and at exit, walk only what the command itself makes. The
collector is off while those imports run: its hundred-odd collections among objects that
all outlive the command cost `run` about 18 ms of CPU, and would free only the reference
cycles pydantic's schema building drops (about 0.4 MB, frozen with the rest).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import os
import signal
import sys
import warnings
from collections.abc import Iterator, Sequence

from hardware_models.errors import InfersimError, InfersimWarning
from simulator.ways_out import on_command_line

COMMANDS: dict[str, tuple[str, str]] = {  # name: (module in simulator.cli, one-line help)
    "run": ("run_cmd", "simulate a scenario file"),
    "sweep": ("sweep_cmd", "run a scenario over every combination of its sweep.grid"),
    "compare": ("compare_cmd", "run scenarios side by side: one table, overlaid plots"),
    "plan": (
        "plan_cmd",
        "capacity planner: cheapest GPU type, tp/pp, replicas, policy (and "
        "disaggregation) meeting SLOs",
    ),
    "hardware": ("hardware_cmd", "list and inspect accelerator and node presets"),
    "models": ("models_cmd", "list the model catalog, or show one model"),
    "estimate": ("estimate_cmd", "GPU count and memory breakdown for a model"),
    "roofline": ("roofline_cmd", "price operators on a GPU and say which bound they hit"),
    "schema": (
        "schema_cmd",
        "print the scenario file schema (JSON Schema, or a markdown field reference)",
    ),
    "calibrate": ("calibrate_cmd", "measure a GPU, fit efficiency curves to it, validate them"),
    "replay": ("replay_cmd", "replay a measured vLLM run and compare latencies"),
}


EXIT_CODES = """\
exit codes:
  0    done
  1    ran, but found no answer: plan: no candidate meets the SLOs; sweep: no point
       ran, or workers were lost (rerun with --resume)
  2    refused: bad input, or an output path that cannot be written (said before
       simulating), or a write that failed (disk full); one line on stderr
  3    internal error: a bug (rerun with --debug for the traceback, and report it)
  130  interrupted (Ctrl-C); 143: terminated (SIGTERM); worker processes end too
"""


def _chosen_command(argv: Sequence[str]) -> str | None:
    """The subcommand named on the command line: its first word that is not an option."""
    return next((arg for arg in argv if not arg.startswith("-")), None)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser, with the arguments of the subcommand `argv` names (of every one when
    `argv` is None); the others are listed with their help only."""
    parser = argparse.ArgumentParser(
        prog="infersim",
        description="Discrete-event simulator of GPU inference clusters.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", required=True)
    chosen = None if argv is None else _chosen_command(argv)
    for name, (module, summary) in COMMANDS.items():
        command = sub.add_parser(name, help=summary)
        if argv is None or name == chosen:
            importlib.import_module(f"simulator.cli.{module}").register(command)
    _accept_debug_anywhere(sub)
    return parser


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """An InfersimWarning as one line on stderr; any other warning as Python shows it."""
    if issubclass(category, InfersimWarning):
        print(f"infersim: warning: {message}", file=sys.stderr)
    else:
        _python_show_warning(message, category, filename, lineno, file, line)


_python_show_warning = warnings.showwarning


def _accept_debug_anywhere(sub: argparse._SubParsersAction) -> None:
    """`--debug` after the subcommand too (`infersim run x.yaml --debug`); SUPPRESS keeps
    a subcommand from resetting the flag given before it."""
    for parser in sub.choices.values():
        parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                            help="show tracebacks on errors")  # fmt: skip
        for action in parser._actions:  # nested subcommands (`hardware show`)
            if isinstance(action, argparse._SubParsersAction):
                _accept_debug_anywhere(action)


@contextlib.contextmanager
def _collector_off_then_frozen(as_program: bool) -> Iterator[None]:
    """The garbage collector off while the subcommand's modules load, then what they made
    frozen (module doc); only for the program: in-process callers (tests, notebooks) keep
    their collector as it is and their garbage stays theirs."""
    if not as_program:
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()  # the imports' objects outlive the command: no collection need visit them
        gc.enable()


class Terminated(KeyboardInterrupt):
    """SIGTERM (`kill`, a CI's timeout, `docker stop`), raised as ^C is: what ^C stops
    (a sweep's or plan's worker processes, a sharded run's) stops the same way, instead
    of outliving the command as SIGTERM's default end of this process alone leaves them."""


def _terminate(signum: int, frame: object) -> None:
    raise Terminated


def _os_error(exc: OSError) -> str:
    """`path: reason`, as the system says it (`No space left on device`)."""
    if exc.strerror and exc.filename is not None:
        return f"{exc.filename}: {exc.strerror}"
    return exc.strerror or str(exc)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command `argv` names (the process's own arguments when None: the program
    `infersim`, which also freezes what the imports made; see the module doc)."""
    as_program = argv is None
    argv = sys.argv[1:] if argv is None else list(argv)
    with _collector_off_then_frozen(as_program):
        args = build_parser(argv).parse_args(argv)
    if as_program:  # not when called in-process (tests, notebooks)
        signal.signal(signal.SIGTERM, _terminate)
    try:
        with warnings.catch_warnings(), on_command_line():
            warnings.simplefilter("default", InfersimWarning)
            warnings.showwarning = _show_warning
            return int(args.handler(args) or 0)
    except InfersimError as exc:
        if args.debug:
            raise
        print(f"infersim: error: {exc}", file=sys.stderr)
        return 2
    except Terminated:
        print("infersim: terminated", file=sys.stderr)
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        print("infersim: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`infersim hardware list | head`)
        # Python flushes stdout again at exit; point it at nothing so that is quiet too.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:  # a path that cannot be read or written, a full disk: not a bug
        if args.debug:
            raise
        print(f"infersim: error: {_os_error(exc)}", file=sys.stderr)
        return 2
    except Exception as exc:  # a bug, not bad input: one line, and how to see more
        if args.debug:
            raise
        print(
            f"infersim: internal error: {type(exc).__name__}: {exc} "
            "(rerun with --debug for the traceback, and please report it)",
            file=sys.stderr,
        )
        return 3


if __name__ == "__main__":
    sys.exit(main())
