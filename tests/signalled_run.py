"""`finetune/run.py` that sends itself a real signal in the middle of a training step, for tests:
`python tests/signalled_run.py [run arguments]`.

Environment: `SIGNAL_AT` (the training batch, counted from 1, during whose transform the signal is sent), `SIGNAL`
(`TERM` or `INT`, default TERM), `SIGNAL_TWICE=1` (send it twice) and `SIGNAL_RANK` (only the process of this rank).
`SIGNAL_AT=decoding` sends it at start-up instead, as the dataset's images start being decoded.
"""

import os
import signal
import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from finetune.augment import BatchTransform  # noqa: E402
from finetune.data import cache  # noqa: E402
from finetune.errors import run_command  # noqa: E402
from finetune.run import main  # noqa: E402


def signalling_forward(at: int, signum: int, twice: bool = False, rank: int | None = None):
    """`BatchTransform.finish` that sends `signum` to this process during training batch number `at`."""
    forward, calls = BatchTransform.finish, [0]

    def signalling(self, pixel_values, train: bool = False):
        if train and (rank is None or int(os.environ.get("RANK", "0")) == rank):
            calls[0] += 1
            if calls[0] == at:
                for _ in range(2 if twice else 1):
                    os.kill(os.getpid(), signum)
        return forward(self, pixel_values, train=train)

    return signalling


def signalling_decode(signum: int):
    """`decode_images` that sends `signum` to this process before decoding (its cache folder is started then)."""
    decode = cache.decode_images

    def signalling(*args, **kwargs):
        os.kill(os.getpid(), signum)
        return decode(*args, **kwargs)

    return signalling


if __name__ == "__main__":
    rank = os.environ.get("SIGNAL_RANK")
    if os.environ["SIGNAL_AT"] == "decoding":
        cache.decode_images = signalling_decode(getattr(signal, "SIG" + os.environ.get("SIGNAL", "TERM")))
        sys.exit(run_command(main))
    BatchTransform.finish = signalling_forward(
        int(os.environ["SIGNAL_AT"]),
        getattr(signal, "SIG" + os.environ.get("SIGNAL", "TERM")),
        os.environ.get("SIGNAL_TWICE") == "1",
        int(rank) if rank else None,
    )
    sys.exit(run_command(main))
