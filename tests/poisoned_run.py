"""`finetune/run.py` with poisoned training batches, for tests: `python tests/poisoned_run.py [run arguments]`.

Environment: `POISON_FROM` (the first training batch, counted from 1, whose pixels become NaN; every later one too
unless `POISON_ONLY_ONE=1`) and `POISON_RANK` (poison only the process of this rank; default: every process). The
run then ends as `python -m finetune.run` would: exit status 0, or 1 after one `error: ...` line.
"""

import os
import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from finetune.augment import BatchTransform  # noqa: E402
from finetune.errors import run_command  # noqa: E402
from finetune.run import main  # noqa: E402


def poisoned_forward(first: int, only_one: bool = False, rank: int | None = None):
    """`BatchTransform.finish` (the last part of training's transform) that makes training batch number `first` (and
    later ones unless `only_one`) NaN, in process `rank` or in every one."""
    forward, calls = BatchTransform.finish, [0]

    def poisoned(self, pixel_values, train: bool = False):
        out = forward(self, pixel_values, train=train)
        if not train or (rank is not None and int(os.environ.get("RANK", "0")) != rank):
            return out
        calls[0] += 1
        if calls[0] == first or (calls[0] > first and not only_one):
            out = torch.full_like(out, float("nan"))
        return out

    return poisoned


if __name__ == "__main__":
    rank = os.environ.get("POISON_RANK")
    BatchTransform.finish = poisoned_forward(
        int(os.environ["POISON_FROM"]), os.environ.get("POISON_ONLY_ONE") == "1", int(rank) if rank else None
    )
    sys.exit(run_command(main))
