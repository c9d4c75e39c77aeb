"""A command that sends itself a real signal at a chosen point, for tests: `python tests/signalled_run.py [arguments]`.

Environment: `SIGNAL_AT`, the training batch (counted from 1) during whose transform the signal is sent, or
`module:function` (`module:Class.method`) on whose `SIGNAL_N`-th call (default 1) it is sent; `SIGNAL` (`TERM` or
`INT`, default TERM; `ERROR`: raise an `OSError` instead), `SIGNAL_TWICE=1` (send it twice), `SIGNAL_RANK` (only
the process of this rank), `SIGNAL_GROUP=1` (sent by another process to this one's whole process group, as a
terminal's Ctrl-C or a scheduler that signals every process of a job: start the command in a session of its own) and
`SIGNAL_COMMAND`, the module whose `main` runs (default finetune.run).
"""

import importlib
import os
import signal
import subprocess
import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from finetune.augment import BatchTransform  # noqa: E402
from finetune.errors import run_command  # noqa: E402


def signalling(owner, name: str, at: int, signum: int, twice: bool, rank: int | None, counted=lambda *a, **k: True):
    """Replace `owner.name` by a function that sends `signum` to this process on its `at`-th `counted` call."""
    function, calls = getattr(owner, name), [0]

    def signalled(*args, **kwargs):
        if counted(*args, **kwargs) and (rank is None or int(os.environ.get("RANK", "0")) == rank):
            calls[0] += 1
            if calls[0] == at and signum is None:
                raise OSError(f"No space left on device (tests/signalled_run.py, process {os.environ.get('RANK', 0)})")
            if calls[0] == at:
                for _ in range(2 if twice else 1):
                    if os.environ.get("SIGNAL_GROUP") == "1":  # from another process, as a terminal's or scheduler's
                        kill = f"import os; os.killpg({os.getpgid(0)}, {int(signum)})"
                        subprocess.run([sys.executable, "-c", kill], stderr=subprocess.DEVNULL)
                    else:
                        os.kill(os.getpid(), signum)
        return function(*args, **kwargs)

    setattr(owner, name, signalled)


if __name__ == "__main__":
    at, rank = os.environ["SIGNAL_AT"], os.environ.get("SIGNAL_RANK")
    options = (getattr(signal, "SIG" + os.environ.get("SIGNAL", "TERM"), None), os.environ.get("SIGNAL_TWICE") == "1")
    options += (int(rank) if rank else None,)
    if options[0] == signal.SIGINT:
        # Under a background job of a script (`pytest ... &`, `nohup`) this process inherits SIGINT ignored, as a
        # shell starts such jobs, and Python keeps it so: the SIGINT sent below was lost and the run went on (exit 0).
        # A Ctrl-C reaches a run in the foreground, where Python's handler is in place: put it back.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if ":" in at:
        module, qualified = at.split(":")
        *path, name = qualified.split(".")
        owner = importlib.import_module(module)
        for part in path:
            owner = getattr(owner, part)
        signalling(owner, name, int(os.environ.get("SIGNAL_N", "1")), *options)
    else:  # a training batch: `BatchTransform.finish(self, x, train)` with train=True
        signalling(BatchTransform, "finish", int(at), *options, counted=lambda self, x, train=False: train)
    command = importlib.import_module(os.environ.get("SIGNAL_COMMAND", "finetune.run"))
    sys.exit(run_command(command.main))
