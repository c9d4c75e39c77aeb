"""How every command ends on an error: one line `error: <the problem and the fix>` on stderr and exit status 1, or 2
for a malformed command line (`UsageError`). Each command's `main(argv)` raises with a message that names the fix;
`run_command` prints it. A bare `--debug`, `--log_level debug` or `LOG_LEVEL=debug` shows the traceback instead. A
signal ends a command as Ctrl-C does: one line and exit status 128 + the signal's number (SIGTERM: 143). In a
multi-process run an error that every process raises alike is said once per machine (`said_elsewhere`).
"""

import argparse
import errno
import gc
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Sequence


# The project raises these with a message that names the fix; any other exception is unexpected and keeps its type.
EXPECTED = (ValueError, OSError, RuntimeError)


class UsageError(ValueError):
    """A malformed command line: an unknown option, a missing or ill-typed value. Exit status 2."""


class Interrupted(KeyboardInterrupt):
    """Stopped by the signal `signum`; the message says what was kept and how to go on (unless `generic`: a stage of
    the run says it instead). `run_command` exits with 128 + `signum`, as a shell reports a process that the signal
    ended."""

    def __init__(self, message: str, signum: int = signal.SIGINT, generic: bool = False):
        super().__init__(message)
        self.signum, self.generic = signum, generic


def signal_name(signum: int) -> str:
    return {signal.SIGINT: "SIGINT (Ctrl-C)", signal.SIGTERM: "SIGTERM"}.get(signum, f"signal {signum}")


def stop_on_sigterm(signum, frame):
    """SIGTERM's handler while a command runs: raise as Ctrl-C does, so `finally` blocks run (the run folder's lock is
    released) and the command ends with one line. Training replaces it while it can save first (InterruptCallback)."""
    raise Interrupted(f"stopped by {signal_name(signum)}; the files already complete are kept.", signum, generic=True)


CLI_NAMES = ("vit-finetune", "cli.py")  # the program names of `vit-finetune COMMAND` (finetune/cli.py)


class ArgumentParser(argparse.ArgumentParser):
    """argparse with its errors as one line: `error()` raises `UsageError` instead of printing the whole usage. Under
    `vit-finetune COMMAND` its usage and help name that command rather than the module."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if os.path.basename(sys.argv[0]) in CLI_NAMES and len(sys.argv) > 1:
            self.prog = f"vit-finetune {sys.argv[1]}"

    def error(self, message: str):
        # `argument --ema_decay/--ema-decay: invalid float value: 'x'` -> `--ema_decay: invalid float value: 'x'`
        raise UsageError(re.sub(r"^argument (-[^/ ]+)(/-\S+)*:", r"\1:", message))


def one_line(error: BaseException, limit: int = 300) -> str:
    """An exception as one short line: its type and the first line of its message."""
    text = str(error).strip().splitlines()
    line = f"{type(error).__name__}: {text[0]}" if text else type(error).__name__
    return line if len(line) <= limit else line[: limit - 3] + "..."


# A write that found no room (a full disk, a quota, a file size limit): the OS's errors, and the words torch.save's
# writer and safetensors pass them on in (`[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598`,
# `I/O error: File too large (os error 27)`).
NO_ROOM_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
NO_ROOM = re.compile(
    r"inline_container\.cc:\d+\] \. unexpected pos|PytorchStreamWriter failed writing"
    rf"|\(os error ({'|'.join(map(str, NO_ROOM_ERRNOS))})\)|No space left on device|Dis[ck] quota exceeded"
)
NO_ROOM_FIX = "the disk (or quota) is full. Fix: free space on it, or write elsewhere"


def out_of_space(error: BaseException | None) -> bool:
    """Whether `error`, or one it was raised from, is a write that found no room."""
    while error is not None:
        if (isinstance(error, OSError) and error.errno in NO_ROOM_ERRNOS) or NO_ROOM.search(str(error)):
            return True
        error = error.__cause__ or error.__context__
    return False


def in_words(error: BaseException, limit: int = 200) -> str:
    """An exception as a clause of a line: its own words where the project raises its kind, else with its type."""
    message = " ".join(line.strip() for line in str(error).splitlines() if line.strip()).rstrip(".")
    return message[:limit] if isinstance(error, EXPECTED) and message else one_line(error, limit)


def error_line(error: BaseException) -> str:
    """The exception as one line: its message with the line breaks folded, prefixed by its type when unexpected."""
    message = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
    if out_of_space(error) and NO_ROOM_FIX not in message:
        return f"{in_words(error)}: {NO_ROOM_FIX}; then rerun the same command (files already whole are kept)."
    if type(error) in (KeyError, IndexError) or not isinstance(error, EXPECTED) or not message:
        message = f"{type(error).__name__}: {message}" if message else type(error).__name__
        message += " (unexpected; rerun with --debug or LOG_LEVEL=debug for the traceback)"
    return message


def said_elsewhere(error: BaseException) -> bool:
    """Whether another process says `error`: each machine's first (`LOCAL_RANK` 0) says what every process raises
    alike, a signal (the terminal, the launcher and schedulers signal every process) or an error marked
    `every_process`."""
    alike = isinstance(error, KeyboardInterrupt) or getattr(error, "every_process", False)
    return alike and os.environ.get("LOCAL_RANK", "0") != "0"


def run_command(
    main: Callable[[list[str]], object], argv: Sequence[str] | None = None, keep_debug: bool = False
) -> int:
    """Call `main(argv)` and return its exit status; `--debug` is taken out of `argv` unless `keep_debug`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    # A bare `--debug`; one followed by a value is TrainingArguments' (`--debug underflow_overflow`).
    flags = {i for i, a in enumerate(argv) if a == "--debug" and (i + 1 == len(argv) or argv[i + 1].startswith("-"))}
    log_level = [argv[i + 1].lower() for i, a in enumerate(argv[:-1]) if a in ("--log_level", "--log-level")]
    debug = bool(flags) or "debug" in log_level or os.environ.get("LOG_LEVEL", "").strip().lower() == "debug"
    if not keep_debug:
        argv = [a for i, a in enumerate(argv) if i not in flags]
    # Handlers can only be set in the main thread; one set by the program around us (not the default) is kept.
    handle_sigterm = threading.current_thread() is threading.main_thread()
    handle_sigterm = handle_sigterm and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    if handle_sigterm:
        signal.signal(signal.SIGTERM, stop_on_sigterm)
    try:
        main(argv)
    except KeyboardInterrupt as error:
        if debug:
            raise
        # A training run stopped by a signal says where it saved and how to resume (`Interrupted`).
        line = str(error) or "interrupted (Ctrl-C); the files already complete are kept."
        if not said_elsewhere(error):
            print(f"error: {line}", file=sys.stderr)
        return 128 + getattr(error, "signum", signal.SIGINT)
    except SystemExit:
        raise  # `--help`, and the usage errors of parsers other than `ArgumentParser`, have said what they had to
    except Exception as error:
        if debug:
            raise
        if not said_elsewhere(error):
            print(f"error: {error_line(error)}", file=sys.stderr)
        return 2 if isinstance(error, UsageError) else 1  # 2 as argparse
    finally:
        if handle_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        # Free now what the error's frames held in reference cycles (trainer, DDP model, gloo process group): freed at
        # the interpreter's shutdown instead, gloo's threads still finishing a collective the other process left could
        # not take the GIL and the process aborted ("terminate called without an active exception") instead of exiting.
        gc.collect()
    return 0
