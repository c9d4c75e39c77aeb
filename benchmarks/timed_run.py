"""`python benchmarks/timed_run.py [finetune.run arguments]`: a training run that also times its data path.

The data path of an optimizer step is fetching its batches from the loader (`get_batch_samples`) and the device
transform (`batch_transform`). It is timed on each epoch's first step and on one step in `--every` of the others
(default: every step on a CPU; 1 in 25 on a GPU, where timing a step means waiting for the device), between two
synchronisations, and scaled up to all steps. `results.json` then gets `train.data_seconds`. This lives with the
benchmarks, not in finetune/: a user's training step does only a user's work.
"""

import json
import sys
import time
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


from finetune import run  # noqa: E402
from finetune.compile import synchronize  # noqa: E402
from finetune.errors import run_command  # noqa: E402
from finetune.trainer import ImageClassificationTrainer  # noqa: E402


GPU_INTERVAL = 25


class DataTimedTrainer(ImageClassificationTrainer):
    """The pipeline's trainer with its data path timed on sampled steps (`data_seconds`)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.every = 1 if self.args.device.type == "cpu" else GPU_INTERVAL
        self.first_seconds, self.first_steps, self.sampled_seconds, self.sampled_steps = 0.0, 0, 0.0, 0
        self.timing, self.epoch_iterator = None, None
        # The batch transform's training parts timed on the sampled steps, in place: run.py reads what it applies.
        augmented, finish = self.batch_transform.augmented, self.batch_transform.finish
        self.batch_transform.augmented = lambda pixel_values: self.timed(augmented, pixel_values)
        self.batch_transform.finish = lambda x, train: self.timed(finish, x, train) if train else finish(x, train)

    def timed(self, function, *args):
        """`function(*args)`, its time added to the data path's on a timed step."""
        if not self.timing:
            return function(*args)
        start = self.start()
        out = function(*args)
        self.stop(start, new_step=False)
        return out

    def start(self) -> float:
        synchronize(self.args.device)
        return time.perf_counter()

    def stop(self, start: float, new_step: bool) -> None:
        synchronize(self.args.device)
        seconds = time.perf_counter() - start
        if self.timing == "first":
            self.first_seconds, self.first_steps = self.first_seconds + seconds, self.first_steps + new_step
        else:
            self.sampled_seconds, self.sampled_steps = self.sampled_seconds + seconds, self.sampled_steps + new_step

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        first = epoch_iterator is not self.epoch_iterator  # a new epoch's iterator: its first step
        self.epoch_iterator = epoch_iterator
        self.timing = "first" if first else "sampled" if self.state.global_step % self.every == 0 else None
        if not self.timing:
            return super().get_batch_samples(epoch_iterator, num_batches, device)
        start = self.start()
        batches = super().get_batch_samples(epoch_iterator, num_batches, device)
        self.stop(start, new_step=True)
        return batches

    @property
    def data_seconds(self) -> float:
        """Each epoch's first step as measured (loader start-up included); the others scaled up from the samples."""
        if not self.sampled_steps:
            return self.first_seconds
        others = max(self.clock.steps - self.first_steps, self.sampled_steps)
        return self.first_seconds + self.sampled_seconds * others / self.sampled_steps


def main(argv: list[str] | None = None):
    trainers = []

    class Recorded(DataTimedTrainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            trainers.append(self)

    run.ImageClassificationTrainer = Recorded  # the class run.py builds its trainers from
    results = run.main(argv)
    for result, trainer in zip(results.values(), trainers):
        path = Path(trainer.args.output_dir) / "results.json"
        if trainer.is_world_process_zero() and path.is_file():
            saved = json.loads(path.read_text())
            saved["train"]["data_seconds"] = trainer.data_seconds
            path.write_text(json.dumps(saved, indent=2) + "\n")
            result.train.data_seconds = trainer.data_seconds
    return results


if __name__ == "__main__":
    sys.exit(run_command(main))
