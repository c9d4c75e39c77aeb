"""How every command ends on an error: one line `error: <the problem and the fix>` on stderr and exit status 1, or 2
for a malformed command line (`UsageError`, which `ArgumentParser` raises instead of printing the whole usage).

    if __name__ == "__main__":
        sys.exit(run_command(main))

Each command's `main(argv)` raises an exception whose message names the problem and the fix; `run_command` turns it
into that line, and `vit-finetune` (finetune/cli.py) does the same for every subcommand. The traceback is shown
only when asked for: `--debug` on the command line (`--log_level debug` too for training), or the environment
variable `LOG_LEVEL=debug`.
"""

import argparse
import os
import re
import sys
from collections.abc import Callable, Sequence


DEBUG_FLAG = "--debug"
DEBUG_ENV = "LOG_LEVEL"
EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130  # 2 as argparse; 130 = 128 + SIGINT, what a shell reports

# Messages of these name the problem and the fix themselves (the project raises them that way); any other exception
# is unexpected and its type is kept in the line.
EXPECTED = (ValueError, OSError, RuntimeError)


class UsageError(ValueError):
    """A malformed command line: an unknown option, a missing or ill-typed value. Exit status 2."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse with its errors as one line: `error()` raises `UsageError` instead of printing the whole usage."""

    def error(self, message: str):
        # `argument --ema_decay/--ema-decay: invalid float value: 'x'` -> `--ema_decay: invalid float value: 'x'`
        raise UsageError(re.sub(r"^argument (-[^/ ]+)(/-\S+)*:", r"\1:", message))


def _debug_flags(argv: Sequence[str]) -> list[int]:
    """Positions of a bare `--debug`. One followed by a value is another option's (TrainingArguments' `--debug
    underflow_overflow`) and is left to the command."""
    return [i for i, a in enumerate(argv) if a == DEBUG_FLAG and (i + 1 == len(argv) or argv[i + 1].startswith("-"))]


def wants_traceback(argv: Sequence[str]) -> bool:
    """Whether the user asked for tracebacks: a bare `--debug`, `--log_level debug`, or `LOG_LEVEL=debug`."""
    log_level = [argv[i + 1].lower() for i, a in enumerate(argv[:-1]) if a in ("--log_level", "--log-level")]
    return bool(_debug_flags(argv)) or "debug" in log_level or os.environ.get(DEBUG_ENV, "").strip().lower() == "debug"


def error_line(error: BaseException) -> str:
    """The exception as one line: its message with the line breaks folded, prefixed by its type when unexpected."""
    message = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
    if type(error) in (KeyError, IndexError) or not isinstance(error, EXPECTED) or not message:
        name = type(error).__name__
        message = f"{name}: {message}" if message else name
        message += f" (unexpected; rerun with {DEBUG_FLAG} or {DEBUG_ENV}=debug for the traceback)"
    return message


def run_command(
    main: Callable[[list[str]], object], argv: Sequence[str] | None = None, keep_debug: bool = False
) -> int:
    """Call `main(argv)` and return the exit status: 0, or 1 after printing `error: ...` (2 for a `UsageError`, 130
    after Ctrl-C).

    `--debug` is taken out of `argv` unless the command parses it itself (`keep_debug`); with it, or with
    `LOG_LEVEL=debug`, a failure re-raises so the traceback is printed.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = wants_traceback(argv)
    if not keep_debug:
        flags = set(_debug_flags(argv))
        argv = [a for i, a in enumerate(argv) if i not in flags]
    try:
        main(argv)
    except KeyboardInterrupt as error:
        if debug:
            raise
        # A training run stopped by a signal says where it saved and how to resume (`TrainingInterrupted`).
        message = str(error) or "interrupted (Ctrl-C); the files already complete are kept."
        print(f"error: {message}", file=sys.stderr)
        return getattr(error, "exit_status", EXIT_INTERRUPTED)
    except SystemExit:
        raise  # `--help`, and the usage errors of parsers other than `ArgumentParser`, have said what they had to
    except Exception as error:
        if debug:
            raise
        print(f"error: {error_line(error)}", file=sys.stderr)
        return EXIT_USAGE if isinstance(error, UsageError) else EXIT_ERROR
    return 0
