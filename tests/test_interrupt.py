"""Interrupted runs, with real signals and real processes: a signal saves a checkpoint and stops with one line that
says how to resume; the resumed run ends with the same weights as an uninterrupted one (bitwise on the CPU) and its
results.json covers the whole run."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from safetensors.torch import load_file


sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_nonfinite import run_script  # noqa: E402
from test_run import ROOT, TINY_SCRATCH, tiny_vit_checkpoint  # noqa: E402

from finetune import hardware, run  # noqa: E402
from finetune.errors import run_command  # noqa: E402
from finetune.results import Results  # noqa: E402


# The precision `bf16: auto` takes on this machine, measured once here: each run's process would measure again, and
# on a busy machine two of them can measure apart, which no bitwise comparison of their weights survives.
BF16 = hardware.cpu_has_native_bf16() and hardware.measure_cpu_bf16_speedup() >= hardware.CPU_BF16_MIN_SPEEDUP
# 240 training images at batch 32: 8 optimizer steps an epoch, 2 epochs.
RUN = [*TINY_SCRATCH, "--report_to", "none", "--save_total_limit", "10", "--bf16", str(BF16).lower()]
SIGNALLED = str(ROOT / "tests" / "signalled_run.py")
# Checkpoints every 8 steps (each epoch's last), evaluations at each epoch's end, after the checkpoint.
STEPS_SAVE = [
    "--save_strategy",
    "steps",
    "--save_steps",
    "8",
    "--eval_strategy",
    "epoch",
    "--load_best_model_at_end",
    "false",
]


def train(out: Path, *extra: str, env: dict | None = None, script: str | None = None):
    args = [script] if script else ["-m", "finetune.run"]
    return run_script([*args, *RUN, "--output_dir", str(out), *extra], env=env)


def same_weights(a: Path, b: Path) -> bool:
    first, second = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    return first.keys() == second.keys() and all((first[k] == second[k]).all() for k in first)


def results(out: Path) -> dict:
    return json.loads((out / "results.json").read_text())


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("uninterrupted") / "run"
    proc = train(out, *STEPS_SAVE)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_and_the_resumed_run_ends_as_an_uninterrupted_one(tmp_path, uninterrupted):
    out = tmp_path / "run"
    strategy = STEPS_SAVE
    proc = train(out, *strategy, env={"SIGNAL_AT": "5"}, script=SIGNALLED)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert f"stopped by SIGTERM at step 5; saved {out / 'checkpoint-5'}" in errors[0]
    assert "`--resume_from_checkpoint true`" in errors[0]
    for name in ("model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json"):
        assert (out / "checkpoint-5" / name).is_file(), name
    assert not (out / "results.json").exists(), "an interrupted run must not look finished"

    proc = train(out, *strategy, "--resume_from_checkpoint", "true")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert same_weights(out, uninterrupted)
    whole, resumed = results(uninterrupted)["train"], results(out)["train"]
    assert resumed["steps"] == whole["steps"] == 16
    assert resumed["loss"] == pytest.approx(whole["loss"], rel=1e-6)
    assert resumed["seconds"] > 0
    # Each logged training loss (every 2 steps) as uninterrupted: the one at step 6, after the resume at 5, was the
    # mean of step 6 alone (step 5's loss logged nowhere).
    logged = [
        [
            (e["step"], e["loss"])
            for e in json.loads((run / "trainer_state.json").read_text())["log_history"]
            if "loss" in e
        ]
        for run in (uninterrupted, out)
    ]
    assert [step for step, _ in logged[1]] == list(range(2, 17, 2)), logged[1]
    assert [loss for _, loss in logged[1]] == pytest.approx([loss for _, loss in logged[0]], rel=1e-5), logged
    # train_results.json (and all_results.json) hold the whole run's figures too, not those of the resumed session;
    # so does a finished run resumed again, which trains no step.
    for again in (False, True):
        if again:
            proc = train(out, *strategy, "--resume_from_checkpoint", "true")
            assert proc.returncode == 0 and "training loss 0" not in proc.stdout, proc.stderr[-3000:]
        for name in ("train_results.json", "all_results.json"):
            saved = json.loads((out / name).read_text())
            assert saved["train_loss"] == pytest.approx(whole["loss"], rel=1e-6), (again, name)
            assert saved["train_samples_per_second"] == pytest.approx(results(out)["train"]["images_per_second"])
        # So does the Trainer's closing log entry (printed, and kept in trainer_state.json's history).
        [closing] = [
            e for e in json.loads((out / "trainer_state.json").read_text())["log_history"] if "train_runtime" in e
        ]
        assert closing["train_loss"] == pytest.approx(whole["loss"], rel=1e-6)
        assert closing["train_samples_per_second"] == pytest.approx(results(out)["train"]["images_per_second"])


@pytest.mark.slow
def test_a_run_with_an_ema_resumes_exactly_too(tmp_path):
    """The checkpoint holds the average (what evaluations use) and `ema_state.safetensors` the training weights."""
    ema = ["--ema_decay", "0.9", *STEPS_SAVE]
    whole, out = tmp_path / "whole", tmp_path / "run"
    assert train(whole, *ema).returncode == 0
    proc = train(out, *ema, env={"SIGNAL_AT": "5"}, script=SIGNALLED)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-3000:]
    assert (out / "checkpoint-5" / "ema_state.safetensors").is_file()
    # Resumed without its EMA, it would train on from the average that model.safetensors holds.
    proc = train(out, *STEPS_SAVE, "--resume_from_checkpoint", "true")
    assert proc.returncode == 1 and "it was saved by a run with `ema_decay`" in proc.stderr, proc.stderr[-3000:]
    assert train(out, *ema, "--resume_from_checkpoint", "true").returncode == 0
    assert same_weights(out, whole)
    # Killed while it writes the EMA state of its second checkpoint (one kept, no best one): that state is written
    # beside the weights, before the Trainer removes the first checkpoint. After the removal, nothing whole was left.
    one = [*ema, "--save_total_limit", "1", "--load_best_model_at_end", "false", "--metric_for_best_model", "none"]
    whole, out = tmp_path / "whole_one", tmp_path / "killed"
    assert train(whole, *one).returncode == 0
    killed = {"SIGNAL_AT": "finetune.callbacks:EMACallback.save_state", "SIGNAL_N": "2", "SIGNAL": "KILL"}
    assert train(out, *one, env=killed, script=SIGNALLED).returncode == -signal.SIGKILL
    assert (out / "checkpoint-8" / "ema_state.safetensors").is_file()
    proc = train(out, *one, "--resume_from_checkpoint", "true")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert same_weights(out, whole)


def test_a_checkpoint_without_an_ema_is_not_called_damaged_when_resumed_with_one(tmp_path, uninterrupted):
    out = tmp_path / "run"
    out.mkdir()
    shutil.copytree(uninterrupted / "checkpoint-8", out / "checkpoint-8")
    proc = train(out, *STEPS_SAVE, "--ema_decay", "0.9", "--resume_from_checkpoint", "true")
    [line] = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 1 and "it was saved by a run without `ema_decay`" in line, proc.stderr[-3000:]
    assert "resume with the `ema_decay` of the run that saved it" in line and "damaged" not in proc.stderr


def test_a_checkpoint_saved_before_an_epochs_evaluation_resumes_exactly(tmp_path, uninterrupted):
    """`save_strategy: steps` at an epoch's last step, evaluation at the epoch's end (after that save): the
    evaluation must not move the training's random state, or the resumed run would crop differently."""
    out = tmp_path / "run"
    out.mkdir()
    shutil.copytree(uninterrupted / "checkpoint-8", out / "checkpoint-8")
    strategy = STEPS_SAVE
    proc = train(out, *strategy, "--resume_from_checkpoint", "true")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert same_weights(out, uninterrupted)


@pytest.mark.slow
@pytest.mark.parametrize("into", ["moved", "new"])
def test_a_moved_run_folder_resumes_and_keeps_its_best_checkpoint(tmp_path, into):
    """The Trainer records the best checkpoint as a path from where the run started: it is found by its name next to
    the resumed checkpoint, or the resumed run would end with its last weights instead of its best. Resumed in place
    or into a new output folder."""
    first, moved, out = tmp_path / "first", tmp_path / "moved", tmp_path / into
    proc = train(first, env={"SIGNAL_AT": "16"}, script=SIGNALLED)  # the last step: the resumed run only ends
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-3000:]
    first.rename(moved)
    proc = train(out, "--resume_from_checkpoint", "true" if out == moved else str(moved / "checkpoint-16"))
    assert proc.returncode == 0 and "does not exist anymore" not in proc.stdout + proc.stderr, proc.stderr[-3000:]
    state = json.loads((out / "trainer_state.json").read_text())
    evaluations = [e for e in state["log_history"] if "eval_accuracy" in e]
    best = max(evaluations, key=lambda e: e["eval_accuracy"])  # the first of equals, as the Trainer keeps it
    assert state["best_model_checkpoint"] == str(moved / f"checkpoint-{best['step']}")
    assert same_weights(out, moved / f"checkpoint-{best['step']}")
    assert results(out)["validation"]["accuracy"] == pytest.approx(best["eval_accuracy"])


def test_ctrl_c_saves_too_and_a_second_signal_stops_at_once(tmp_path):
    out = tmp_path / "int"
    proc = train(out, env={"SIGNAL_AT": "3", "SIGNAL": "INT"}, script=SIGNALLED)
    assert proc.returncode == 128 + signal.SIGINT, proc.stderr[-3000:]
    assert f"stopped by SIGINT (Ctrl-C) at step 3; saved {out / 'checkpoint-3'}" in proc.stderr
    assert (out / "checkpoint-3" / "optimizer.pt").is_file()

    out = tmp_path / "twice"
    proc = train(out, env={"SIGNAL_AT": "3", "SIGNAL_TWICE": "1"}, script=SIGNALLED)
    assert proc.returncode == -signal.SIGTERM, proc.stderr[-3000:]
    assert not list(out.glob("checkpoint-*")), "the second signal ends the run without saving"


@pytest.mark.slow
def test_a_signal_to_every_process_of_the_run_leaves_its_loader_workers_to_it(tmp_path, uninterrupted):
    """A scheduler that signals every process of a job (or Ctrl-C, which reaches the terminal's process group) killed
    the `dataloader_num_workers` processes too: the run ended with "DataLoader worker ... is killed by signal:
    Terminated", exit status 1, and no word of how to resume. Training's loader (persistent workers, which the run's
    exit ends: a worker that ignored every SIGTERM hung it there), then an evaluation's."""
    workers = [*STEPS_SAVE, "--dataloader_num_workers", "1"]
    during_evaluation = "finetune.trainer:ImageClassificationTrainer.prediction_step"
    persistent = ["--dataloader_persistent_workers", "true"]
    # (Step 8 is saved before its evaluation: a signal during it stops at the next one.)
    for at, step, extra in (("3", 3, persistent), (during_evaluation, 9, [])):
        out = tmp_path / f"run{step}"
        env = {"SIGNAL_AT": at, "SIGNAL_GROUP": "1"}
        command = [sys.executable, SIGNALLED, *RUN, "--output_dir", str(out), *workers, *extra]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1", **env}
        proc = subprocess.run(
            command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=180, start_new_session=True
        )
        assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-3000:]
        [line] = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        assert f"stopped by SIGTERM at step {step}; saved {out / f'checkpoint-{step}'}" in line, line
        proc = train(out, *workers, *extra, "--resume_from_checkpoint", "true")
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert same_weights(out, uninterrupted)


@pytest.mark.slow
def test_a_run_with_persistent_workers_stopped_in_an_epochs_evaluation_resumes_exactly(tmp_path, uninterrupted):
    """torch's loader drew its workers' base seed from the global generator at each epoch's start, persistent workers'
    at the first only; a run resumed at an epoch's start (a new loader, whose first iterator starts after the
    Trainer restores the generators) drew once more than the uninterrupted run, and every later step's augmentation
    differed. The uninterrupted run differed from one without workers from its second epoch on, too."""
    # Saved at each epoch's end after its evaluation: a signal during it saves checkpoint-8 and stops.
    options = ["--dataloader_num_workers", "1", "--dataloader_persistent_workers", "true", "--save_strategy", "epoch"]
    options += ["--eval_strategy", "epoch", "--load_best_model_at_end", "false"]
    whole, out = tmp_path / "whole", tmp_path / "run"
    assert train(whole, *options).returncode == 0
    at = {"SIGNAL_AT": "finetune.trainer:ImageClassificationTrainer.prediction_step"}
    proc = train(out, *options, env=at, script=SIGNALLED)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-3000:]
    assert f"stopped by SIGTERM at step 8; saved {out / 'checkpoint-8'}" in proc.stderr, proc.stderr[-3000:]
    proc = train(out, *options, "--resume_from_checkpoint", "true")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert same_weights(out, whole)
    assert same_weights(whole, uninterrupted), "how the images are loaded must change no result"


def test_a_run_killed_during_its_first_save_starts_anew_under_auto(tmp_path):
    """A preemption's SIGTERM and then its kill during the first checkpoint's save leave that checkpoint cut short (no
    trainer_state.json): restarted with `auto`, the same command failed on every restart, saying the checkpoint was
    saved with `save_only_model`."""
    out, epoch = tmp_path / "run", ["--num_train_epochs", "1"]
    # The second SIGTERM, once the weights are written, kills the run (the first asked to stop).
    kill = {"SIGNAL_AT": "transformers.trainer:Trainer._save_optimizer_and_scheduler", "SIGNAL_TWICE": "1"}
    proc = train(out, *epoch, env=kill, script=SIGNALLED)
    assert proc.returncode == -signal.SIGTERM, proc.stderr[-3000:]
    assert (out / "checkpoint-8" / "model.safetensors").is_file()
    assert not (out / "checkpoint-8" / "trainer_state.json").exists()

    proc = train(out, *epoch, "--resume_from_checkpoint", "true")
    [line] = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 1 and "(the newest, checkpoint-8: it was cut short: trainer_state.json" in line, line
    assert "`--resume_from_checkpoint auto` does where no checkpoint is whole" in line, line

    proc = train(out, *epoch, "--resume_from_checkpoint", "auto")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "checkpoint-8 in " in proc.stdout and "no checkpoint is whole: starting anew" in proc.stdout
    assert results(out)["train"]["steps"] == 8 and (out / "checkpoint-8" / "trainer_state.json").is_file()


@pytest.mark.slow
def test_a_run_that_resumes_by_itself_is_told_to_rerun_its_command(tmp_path):
    """Under `resume_from_checkpoint: auto` (the quickstart's) the stop named `--resume_from_checkpoint true`, which
    the command needs no more than the quickstart's does."""
    out = tmp_path / "run"
    proc = train(out, *STEPS_SAVE, "--resume_from_checkpoint", "auto", env={"SIGNAL_AT": "5"}, script=SIGNALLED)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-3000:]
    [line] = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert line.endswith(f"saved {out / 'checkpoint-5'}. Resume with the same command."), line
    proc = train(out, *STEPS_SAVE, "--resume_from_checkpoint", "auto")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert results(out)["train"]["steps"] == 16


@pytest.mark.slow
@pytest.mark.parametrize("name", ["TERM", "INT"])
def test_a_signal_during_start_up_ends_the_run_with_one_line_and_leaves_no_half_decoded_cache(tmp_path, name):
    """SIGTERM while the dataset is decoded used to end the run without a word, leaving a half-written cache folder."""
    folder, cache, out = tmp_path / "images", tmp_path / "cache", tmp_path / "run"
    rng = np.random.default_rng(0)
    for i in range(40):
        (folder / f"class{i % 2}").mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (8, 8), dtype=np.uint8)).save(folder / f"class{i % 2}" / f"{i}.png")
    data = ["--dataset_name", str(folder), "--decoded_cache_dir", str(cache), "--num_train_epochs", "1"]
    proc = train(out, *data, env={"SIGNAL_AT": "finetune.data.cache:decode_images", "SIGNAL": name}, script=SIGNALLED)
    assert proc.returncode == 128 + getattr(signal, f"SIG{name}"), proc.stderr[-3000:]
    [line] = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert "while loading and decoding the dataset, before training started" in line, line
    assert "Rerun the same command" in line and "Traceback" not in proc.stderr
    assert not list(cache.iterdir()) and not out.exists()
    proc = train(out, *data)
    assert proc.returncode == 0 and len(list(cache.iterdir())) == 1, proc.stderr[-3000:]


def test_a_signal_while_the_run_starts_names_that_stage_and_the_way_on(tmp_path):
    """SIGTERM while the options and files were checked (before the data stage) ended with a line naming neither."""
    out = tmp_path / "run"
    proc = train(out, env={"SIGNAL_AT": "finetune.run:lock_output_dir"}, script=SIGNALLED)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-3000:]
    [line] = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert line == f"error: stopped by SIGTERM while starting, before anything was written. {run.RERUN}", line
    assert not out.exists()


@pytest.mark.slow
def test_sigterm_after_training_and_in_other_commands_ends_them_with_one_line_as_ctrl_c_does(tmp_path):
    """SIGTERM while the results were saved, or while `predict` ran, used to end the command without a word (exit 143
    from the signal itself), leaving the run folder's lock behind."""
    out, image = tmp_path / "run", tmp_path / "seven.png"
    at_results = {"SIGNAL_AT": "finetune.results:Results.save"}
    proc = train(out, "--num_train_epochs", "1", env=at_results, script=SIGNALLED)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-3000:]
    [line] = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert line.startswith("error: stopped by SIGTERM while saving and evaluating the scratch model after"), line
    assert "resume with `--resume_from_checkpoint true` for the evaluation and results" in line, line
    assert "Traceback" not in proc.stderr and not (out / ".run.lock").exists()

    Image.fromarray(np.full((8, 8), 255, dtype=np.uint8)).save(image)
    predicting = {"SIGNAL_AT": "finetune.tools.predict:predict_files", "SIGNAL_COMMAND": "finetune.tools.predict"}
    proc = run_script([SIGNALLED, str(out), str(image)], env=predicting)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == "error: stopped by SIGTERM; the files already complete are kept."


@pytest.mark.slow
def test_a_signal_after_the_last_optimizer_step_stops_the_run_too(tmp_path):
    """Ctrl-C during the last epoch's evaluation, after the last optimizer step, was ignored: the run went on to its
    results and exited 0."""
    out = tmp_path / "run"
    at_last_evaluation = {"SIGNAL_AT": "transformers.trainer:Trainer.evaluate", "SIGNAL_N": "2", "SIGNAL": "INT"}
    proc = train(out, env=at_last_evaluation, script=SIGNALLED)
    assert proc.returncode == 128 + signal.SIGINT, proc.stderr[-3000:]
    [line] = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    # Stopped once the last step's checkpoint, due after this evaluation, is saved.
    assert line.startswith(f"error: stopped by SIGINT (Ctrl-C) at step 16; saved {out / 'checkpoint-16'}"), line
    assert "`--resume_from_checkpoint true`" in line, line
    assert "epoch 2.00: validation accuracy" in proc.stdout and (out / "checkpoint-16").is_dir()
    assert not (out / "results.json").exists()
    # The resumed run takes no step: it evaluates and writes its results.
    proc = train(out, "--resume_from_checkpoint", "true")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [row["epoch"] for row in results(out)["history"]] == [1.0, 2.0]


def test_a_signal_after_the_last_optimizer_step_that_no_checkpoint_holds_lets_the_run_finish(tmp_path):
    """`save_strategy: no`: the run stopped saying "the checkpoints in OUT are kept. Resume with ..." where there was
    none (the folder itself was removed, being empty): its whole training was lost. It goes on to its results."""
    out = tmp_path / "run"
    at_last_evaluation = {"SIGNAL_AT": "transformers.trainer:Trainer.evaluate", "SIGNAL_N": "2", "SIGNAL": "INT"}
    options = ["--save_strategy", "no", "--load_best_model_at_end", "false"]
    proc = train(out, *options, env=at_last_evaluation, script=SIGNALLED)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "SIGINT (Ctrl-C) after the last optimizer step (16), which no checkpoint holds" in proc.stdout + proc.stderr
    assert results(out)["train"]["steps"] == 16 and not list(out.glob("checkpoint-*"))


@pytest.mark.slow
def test_a_signal_that_lets_the_first_model_of_both_finish_stops_before_the_second(tmp_path):
    """`model_type: both`: the same signal let the first model go on to its results, then the second model trained
    whole (hours, on a real run) and the run exited 0: Ctrl-C was ignored."""
    base, out = tiny_vit_checkpoint(tmp_path / "base"), tmp_path / "both"
    both = [*RUN, "--model_name_or_path", str(base), "--output_dir", str(out)]
    both[both.index("scratch")] = "both"
    both += ["--save_strategy", "no", "--load_best_model_at_end", "false"]
    at_last_evaluation = {"SIGNAL_AT": "transformers.trainer:Trainer.evaluate", "SIGNAL_N": "2", "SIGNAL": "INT"}
    proc = run_script([SIGNALLED, *both], env=at_last_evaluation)
    assert proc.returncode == 128 + signal.SIGINT, proc.stderr[-3000:]
    [line] = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert "after the pretrained model's last step; its results are written and the scratch model has not" in line
    assert results(out / "pretrained")["train"]["steps"] == 16 and not (out / "scratch").exists()
    proc = run_script(["-m", "finetune.run", *both, "--resume_from_checkpoint", "true"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert results(out / "scratch")["train"]["steps"] == 16 and (out / "comparison" / "report.md").is_file()


@pytest.mark.slow
def test_a_signal_while_the_kept_model_is_evaluated_names_the_resume(tmp_path):
    """After `train()` returns (the best model reloaded, then scored on each split) a signal named no way on; the line
    now names the resume, which scores the kept model and writes the results."""
    out = tmp_path / "run"
    proc = train(out, env={"SIGNAL_AT": "transformers.trainer:Trainer.predict"}, script=SIGNALLED)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-3000:]
    [line] = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert line.startswith("error: stopped by SIGTERM while saving and evaluating the scratch model after training")
    assert "Its checkpoints are kept: resume with `--resume_from_checkpoint true`" in line, line
    assert not (out / "results.json").exists()
    proc = train(out, "--resume_from_checkpoint", "true")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [row["epoch"] for row in results(out)["history"]] == [1.0, 2.0]


def test_a_signal_before_the_first_step_names_the_way_on(tmp_path):
    """Between the model's build and the first step (the optimizer, a resumed checkpoint's loading) neither a stage
    nor `InterruptCallback` answered: the line named no way on."""
    at = {"SIGNAL_AT": "finetune.trainer:ImageClassificationTrainer.create_optimizer"}
    proc = train(tmp_path / "run", env=at, script=SIGNALLED)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-3000:]
    [line] = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert line == "error: stopped by SIGTERM while training the scratch model. " + run.RERUN, line


LAUNCHER = [
    sys.executable, "-m", "accelerate.commands.launch", "--config_file",
    str(ROOT / "configs" / "accelerate" / "cpu_2proc.yaml"), "--main_process_port", "0",
]  # fmt: skip


@pytest.mark.slow
def test_two_processes_save_the_same_step_when_one_of_them_is_signalled(tmp_path):
    out = tmp_path / "ddp"
    proc = run_script(
        [SIGNALLED, *RUN, "--output_dir", str(out)], env={"SIGNAL_AT": "2", "SIGNAL_RANK": "1"}, launcher=LAUNCHER
    )
    output = proc.stdout + proc.stderr
    assert "Process 0 of 2" in output, "accelerate must really have started two processes"
    assert proc.returncode != 0
    # Only the second process was signalled, during step 2; both saved step 2 together (said once: both stopped).
    assert proc.stderr.count("stopped by SIGTERM at step 2") == 1, output[-3000:]
    for name in ("rng_state_0.pth", "rng_state_1.pth", "optimizer.pt", "trainer_state.json"):
        assert (out / "checkpoint-2" / name).is_file(), name
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2"]
    # One process would read step 2 of 4 an epoch (64 images a step) as step 2 of 8 (32 images): refused.
    proc = train(out, "--resume_from_checkpoint", "true")
    [line] = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 1 and "trained at 4 optimizer steps an epoch, and this run has 8" in line, line
    assert "Fix: resume with the options it was trained with" in line
    # Four processes at half the batch take the same steps: the checkpoint has the random states of two, which is not
    # a damaged checkpoint (each was skipped: "rng_state_2.pth is missing", and the fix offered deleted the run).
    four = Path(shutil.copytree(out, tmp_path / "four"))
    proc = run_script(
        ["-m", "finetune.run", *RUN, "--output_dir", str(four), "--resume_from_checkpoint", "true",
         "--per_device_train_batch_size", "16"],
        launcher=[*LAUNCHER, "--num_processes", "4"],
    )  # fmt: skip
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "Process 0 of 4" in output, output[-3000:]
    assert "was trained by 2 process(es) and this run has 4" in output and "Skipping" not in output
    assert json.loads((four / "trainer_state.json").read_text())["global_step"] == 8
    # With twice the batch, one process takes the same steps: resumed, to the end of its 2 epochs (4 steps each),
    # saying that its random draws are not the two processes'.
    proc = train(out, "--resume_from_checkpoint", "true", "--per_device_train_batch_size", "64")
    assert proc.returncode == 0 and "was trained by 2 process(es) and this run has 1" in proc.stdout + proc.stderr
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 8


@pytest.mark.slow
def test_two_processes_say_an_error_of_both_once_and_an_error_of_one_in_that_one(tmp_path):
    """Each process printed the errors that every process raises (here a refused option), and the launcher its
    traceback after them: they are said once now, with each process's exit status; an error of one process alone
    (the second's, during the final evaluation) is still said, by that process."""
    proc = run_script(["-m", "finetune.run", *RUN, "--output_dir", str(tmp_path / "bad"), "--learning_rate", "-1"],
                      launcher=LAUNCHER)  # fmt: skip
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert errors == ["error: `learning_rate` must be >= 0, got -1.0."], proc.stderr[-3000:]
    assert proc.returncode == 1
    assert str(ROOT / "finetune") not in proc.stderr  # the launcher's traceback only, none of ours

    at_final_evaluation = {"SIGNAL_AT": "transformers.trainer:Trainer.predict", "SIGNAL": "ERROR", "SIGNAL_RANK": "1"}
    out = tmp_path / "one"
    proc = run_script([SIGNALLED, *RUN, "--output_dir", str(out)], env=at_final_evaluation, launcher=LAUNCHER)
    assert "Process 0 of 2" in proc.stdout + proc.stderr and proc.returncode != 0
    assert proc.stderr.count("error: No space left on device (tests/signalled_run.py, process 1)") == 1, proc.stderr


@pytest.mark.slow
def test_a_killed_process_ends_the_other_at_once_with_one_line(tmp_path):
    out = tmp_path / "killed"
    start = time.monotonic()
    proc = run_script(
        [SIGNALLED, *RUN, "--output_dir", str(out)],
        env={"SIGNAL_AT": "3", "SIGNAL": "KILL", "SIGNAL_RANK": "1"},
        launcher=LAUNCHER,
    )
    output = proc.stdout + proc.stderr
    assert "Process 0 of 2" in output and proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if "error: Another process of this run" in line]
    assert len(errors) == 1, output[-3000:]
    assert time.monotonic() - start < 120  # no wait for `ddp_timeout` (30 minutes by default)
    # The way on that the line names is one that works: no checkpoint was saved by step 3, so not a resume.
    assert not list(out.glob("checkpoint-*")) and "Nothing was saved: rerun the same command" in errors[0]


@pytest.mark.slow  # tens of seconds of runs in one file's worker: CI runs it (-m 'not gpu')
def test_a_frozen_process_ends_the_run_within_ddp_timeout(tmp_path):
    """SIGSTOP freezes the second process during its third step: the first one ends with one line after
    `ddp_timeout` (on the CPU too, where transformers does not pass it on), not after gloo's 30 minutes."""
    out = tmp_path / "frozen"
    start = time.monotonic()
    proc = run_script(
        [SIGNALLED, *RUN, "--output_dir", str(out), "--ddp_timeout", "10"],
        env={"SIGNAL_AT": "3", "SIGNAL": "STOP", "SIGNAL_RANK": "1"},
        launcher=LAUNCHER,
    )
    elapsed = time.monotonic() - start
    output = proc.stdout + proc.stderr
    assert "Process 0 of 2" in output, "accelerate must really have started two processes"
    assert proc.returncode != 0
    # (The progress bar may share the error's line: the bar ends with a carriage return, not a new line.)
    errors = [line for line in proc.stderr.splitlines() if "error: Another process of this run" in line]
    assert len(errors) == 1 and "`ddp_timeout` = 10 s" in errors[0], output[-3000:]
    # Start-up, the wait of 10 s, and the launcher's grace period before it kills the frozen process (30 s).
    assert elapsed < 150, elapsed


@pytest.mark.slow  # tens of seconds of runs in one file's worker: CI runs it (-m 'not gpu')
def test_a_signal_at_an_epochs_last_step_keeps_that_epochs_evaluation(tmp_path):
    """Evaluation and checkpoint at each epoch's end, the best model kept (the defaults): a signal during the epoch's
    last step saves after that epoch's evaluation, so the resumed run keeps the same best model, history and weights
    (it used to save without it, and the resumed run never came back to that epoch)."""
    whole, out = tmp_path / "whole", tmp_path / "run"
    assert train(whole).returncode == 0
    proc = train(out, env={"SIGNAL_AT": "8"}, script=SIGNALLED)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-3000:]
    assert "epoch 1.00: validation accuracy" in proc.stdout and (out / "checkpoint-8").is_dir()
    assert train(out, "--resume_from_checkpoint", "true").returncode == 0
    assert same_weights(out, whole)
    expected, resumed = results(whole), results(out)
    assert [(row["epoch"], row["eval_accuracy"]) for row in resumed["history"]] == [
        (row["epoch"], row["eval_accuracy"]) for row in expected["history"]
    ]
    assert resumed["validation"]["accuracy"] == expected["validation"]["accuracy"]


@pytest.mark.slow  # tens of seconds of runs in one file's worker: CI runs it (-m 'not gpu')
def test_a_signal_during_an_evaluation_stops_at_the_checkpoint_saved_after_it(tmp_path):
    """A signal while epoch 1 is evaluated (its checkpoint due next): the run stops once that checkpoint is saved. It
    trained one more step first, and saved again (a step of a large model on a CPU doubled the time to stop)."""
    whole, out = tmp_path / "whole", tmp_path / "run"
    assert train(whole).returncode == 0
    during = {"SIGNAL_AT": "finetune.trainer:ImageClassificationTrainer.prediction_step"}
    proc = train(out, env=during, script=SIGNALLED)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-3000:]
    assert f"stopped by SIGTERM at step 8; saved {out / 'checkpoint-8'}" in proc.stderr, proc.stderr[-3000:]
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-8"]
    assert train(out, "--resume_from_checkpoint", "true").returncode == 0
    assert same_weights(out, whole)


@pytest.mark.slow  # tens of seconds of runs in one file's worker: CI runs it (-m 'not gpu')
def test_save_strategy_best_saves_the_stop_at_an_evaluation_that_is_no_new_best(tmp_path):
    """`save_strategy: best` saves after an evaluation only a new best: a signal at the last step of an epoch that did
    not improve saved nothing, the run said it had stopped "after the last optimizer step (16)" of 24, and the resume
    went back to the best checkpoint (step 8), training that epoch again."""
    best = ["--save_strategy", "best", "--num_train_epochs", "3", "--bf16", "false"]
    whole, out = tmp_path / "whole", tmp_path / "run"
    assert train(whole, *best).returncode == 0
    accuracies = [row["eval_accuracy"] for row in results(whole)["history"]]
    assert accuracies[1] <= accuracies[0], f"epoch 2 must be no new best for this test to mean it: {accuracies}"
    proc = train(out, *best, env={"SIGNAL_AT": "16"}, script=SIGNALLED)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-3000:]
    assert f"stopped by SIGTERM at step 16; saved {out / 'checkpoint-16'}" in proc.stderr, proc.stderr[-3000:]
    assert train(out, *best, "--resume_from_checkpoint", "true").returncode == 0
    assert same_weights(out, whole)
    rows = [[(row["step"], row["eval_accuracy"]) for row in results(run)["history"]] for run in (out, whole)]
    assert rows[0] == rows[1] and results(out)["validation"]["accuracy"] == results(whole)["validation"]["accuracy"]


@pytest.mark.slow  # tens of seconds of runs in one file's worker: CI runs it (-m 'not gpu')
def test_early_stopping_counts_on_after_a_resume(tmp_path):
    """A run resumed from a checkpoint saved after an evaluation without improvement stops where the uninterrupted
    run stopped: the count of evaluations without improvement is taken up again, not started from 0."""
    stopping = ["--num_train_epochs", "14", "--early_stopping_patience", "2", "--learning_rate", "1e-2"]
    whole, out = tmp_path / "whole", tmp_path / "run"
    assert train(whole, *stopping).returncode == 0
    state = json.loads((whole / "trainer_state.json").read_text())
    stopped = state["global_step"] // 8
    assert stopped < 14, "the uninterrupted run must stop early for this test to mean anything"
    # The checkpoint of the evaluation before the last: one evaluation without improvement counted already.
    checkpoint = f"checkpoint-{(stopped - 1) * 8}"
    counted = json.loads((whole / checkpoint / "trainer_state.json").read_text())["stateful_callbacks"]
    assert counted["ResumedEarlyStopping"]["attributes"]["early_stopping_patience_counter"] == 1
    out.mkdir()
    shutil.copytree(whole / checkpoint, out / checkpoint)
    assert train(out, *stopping, "--resume_from_checkpoint", "true").returncode == 0
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == state["global_step"]
    assert same_weights(out, whole)


@pytest.mark.slow  # tens of seconds of runs in one file's worker: CI runs it (-m 'not gpu')
def test_a_both_run_stopped_in_either_model_resumes_with_the_command_it_names(tmp_path, monkeypatch, capsys, caplog):
    """`model_type: both` stopped in its first model's training, then while its second model is built: each stop names
    `--resume_from_checkpoint true`, which resumes the model that has checkpoints, keeps the one that finished (not
    trained again) and starts the one not reached (that command used to be refused: no checkpoint of the second)."""
    base, out = tiny_vit_checkpoint(tmp_path / "base"), tmp_path / "both"
    both = [*RUN, "--model_name_or_path", str(base), "--output_dir", str(out)]
    both[both.index("scratch")] = "both"
    proc = run_script([SIGNALLED, *both], env={"SIGNAL_AT": "3"})
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-3000:]
    saved = f"saved {out / 'pretrained' / 'checkpoint-3'}. Resume with the same command and `--resume_from_checkpoint"
    assert saved in proc.stderr
    assert not (out / "scratch").exists()

    resume = [*both, "--resume_from_checkpoint", "true"]
    build_model = run.build_model

    def stopped_at_the_scratch_model(model_type, *args):
        if model_type == "scratch":
            os.kill(os.getpid(), signal.SIGTERM)  # a real signal, as `starting` handles it
        return build_model(model_type, *args)

    monkeypatch.setattr(run, "build_model", stopped_at_the_scratch_model)
    assert run_command(run.main, resume) == 128 + signal.SIGTERM
    [line] = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert "while building the scratch model" in line, line
    assert "Rerun the same command with `--resume_from_checkpoint true`" in line, line
    assert results(out / "pretrained")["train"]["steps"] == 16, "resumed from checkpoint-3 and finished"
    finished = (out / "pretrained" / "results.json").read_bytes()
    # The scratch model at another length than the pretrained one finished with: refused (compared as one recipe).
    assert run_command(run.main, [*resume, "--num_train_epochs", "3"]) == 1
    [line] = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert "The pretrained model" in line and "finished with num_train_epochs 2 (now 3)" in line, line

    monkeypatch.setattr(run, "build_model", build_model)
    from finetune.tools import compare

    write_comparison = compare.write_comparison

    def stopped_in_the_comparison(*args):
        os.kill(os.getpid(), signal.SIGTERM)
        return write_comparison(*args)

    monkeypatch.setattr(compare, "write_comparison", stopped_in_the_comparison)
    assert run_command(run.main, resume) == 128 + signal.SIGTERM
    [line] = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert "while writing the comparison" in line and "`--resume_from_checkpoint true` writes it" in line, line
    monkeypatch.setattr(compare, "write_comparison", write_comparison)
    with caplog.at_level("INFO"):
        ended = run.main(resume)
    assert "pretrained model: finished earlier, kept as it is" in caplog.text
    assert (out / "pretrained" / "results.json").read_bytes() == finished, "the finished model is not trained again"
    assert ended["pretrained"].validation.accuracy == results(out / "pretrained")["validation"]["accuracy"]
    assert ended["scratch"].train.steps == 16 and (out / "comparison" / "report.md").is_file()
    # A finished model's results.json cut short (a disk that failed): `true`, as its error says, writes it again.
    (out / "pretrained" / "results.json").write_bytes(finished[:100])
    with pytest.raises(ValueError, match=r"not valid JSON .* `--resume_from_checkpoint true`"):
        Results.load(out / "pretrained")
    again = run.main(resume)
    assert again["pretrained"].validation.accuracy == ended["pretrained"].validation.accuracy
    assert again["pretrained"].train.steps == 16 and Results.load(out / "pretrained").train.steps == 16


@pytest.mark.slow  # tens of seconds of runs in one file's worker: CI runs it (-m 'not gpu')
@pytest.mark.parametrize(
    "stopped_by, options",
    [
        ("early_stopping", ["--num_train_epochs", "14", "--early_stopping_patience", "1", "--learning_rate", "1e-2"]),
        ("time_budget", ["--num_train_epochs", "1000", "--max_train_minutes", "0.05", "--budget_schedule", "true"]),
    ],
)
def test_a_run_whose_training_had_ended_trains_no_step_when_resumed(tmp_path, stopped_by, options):
    """Stopped early (or by its budget), then by a signal during the final evaluation: the resume used to train past
    the stop (another epoch, rotating the stop's checkpoint away; under a budget from a re-planned schedule) and
    exit 0 with another model. It trains no step now: the final evaluation and results are the uninterrupted run's."""
    out = tmp_path / "run"
    proc = train(out, *options, env={"SIGNAL_AT": "transformers.trainer:Trainer.predict"}, script=SIGNALLED)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-3000:]
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] < state["max_steps"], f"{stopped_by} must have ended training for this test to mean it"
    kept, checkpoints = (out / "model.safetensors").read_bytes(), sorted(out.glob("checkpoint-*"))
    for _ in range(2):  # resumed after the signal, then the finished run resumed again
        proc = train(out, *options, "--resume_from_checkpoint", "true")
        assert proc.returncode == 0, proc.stderr[-3000:]
        resumed = json.loads((out / "trainer_state.json").read_text())
        assert resumed["global_step"] == state["global_step"] and sorted(out.glob("checkpoint-*")) == checkpoints
        assert "no step is trained" in proc.stdout + proc.stderr and "single sample" not in proc.stdout + proc.stderr
        assert results(out)["train"]["steps"] == state["global_step"]
        assert results(out)["train"]["stopped_by"] == stopped_by
        assert [e["epoch"] for e in results(out)["history"]] == [
            e["epoch"] for e in state["log_history"] if "eval_accuracy" in e
        ]
        assert (out / "model.safetensors").read_bytes() == kept


@pytest.mark.slow
def test_a_finished_run_resumed_with_more_epochs_trains_on(tmp_path, uninterrupted):
    out = tmp_path / "run"
    out.mkdir()
    shutil.copytree(uninterrupted / "checkpoint-16", out / "checkpoint-16")
    proc = train(out, *STEPS_SAVE, "--num_train_epochs", "3", "--resume_from_checkpoint", "true")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert results(out)["train"]["steps"] == 24 and results(out)["epochs"] == 3.0
    assert "is stretched" not in proc.stdout + proc.stderr
    assert (
        "Training on from the finished run's last step (16) to step 24: its learning-rate schedule is drawn out"
        in (proc.stdout + proc.stderr)
    )
    # Mid-run, the schedule of 16 steps stretched to 24 changed the learning rate at once, without a word.
    out = tmp_path / "midway"
    out.mkdir()
    shutil.copytree(uninterrupted / "checkpoint-8", out / "checkpoint-8")
    proc = train(out, *STEPS_SAVE, "--num_train_epochs", "3", "--resume_from_checkpoint", "true")
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = "was trained on a learning-rate schedule of 16 steps, and this run has 24 (another `num_train_epochs`"
    assert said in proc.stdout + proc.stderr


@pytest.mark.slow
def test_a_resume_with_another_learning_rate_is_refused_and_an_older_checkpoint_still_resumes(tmp_path, uninterrupted):
    """The checkpoint's optimizer and schedule states go on with the rate it was trained with: resumed with another
    one, it trained on with the old rate and results.json recorded the new one."""
    out = tmp_path / "run"
    out.mkdir()
    shutil.copytree(uninterrupted / "checkpoint-8", out / "checkpoint-8")
    # Said before the data loads (here a missing dataset, which would fail first).
    missing = ["--dataset_name", str(tmp_path / "missing.parquet")]
    proc = train(
        out, *STEPS_SAVE, "--learning_rate", "1e-2", "--weight_decay", "0.1", "--resume_from_checkpoint", "true",
        *missing,
    )  # fmt: skip
    [line] = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 1 and "learning_rate 0.003 (now 0.01), weight_decay 0 (now 0.1)" in line, line
    assert "Fix: resume with the options it was trained with, or start a new run from its weights" in line
    assert "its optimizer and schedule states would go on" in line and "validation split" not in line
    # Another split (seed, validation_size) held training images out as validation, and another metric compared
    # accuracies as losses to keep the best model: both went on with exit 0. The metric (which multi-label data
    # sets) is compared once the data is loaded.
    proc = train(out, *STEPS_SAVE, "--seed", "7", "--resume_from_checkpoint", "true", *missing)
    [line] = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 1 and "seed 0 (now 7)" in line, line
    assert "its validation split (another one holds images it trained on) would go on" in line
    proc = train(out, *STEPS_SAVE, "--metric_for_best_model", "loss", "--resume_from_checkpoint", "true")
    [line] = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 1 and "metric_for_best_model accuracy (now loss)" in line, line
    assert "its best model so far would go on" in line
    proc = train(out, *STEPS_SAVE, "--validation_size", "0.25", "--resume_from_checkpoint", "true")
    [line] = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 1 and "validation_size 0.2 (now 0.25)" in line, line
    # A checkpoint saved before the options were recorded resumes as before.
    path = out / "checkpoint-8" / "trainer_state.json"
    state = json.loads(path.read_text())
    del state["stateful_callbacks"]["ResumeCheck"]["attributes"]["options"]
    path.write_text(json.dumps(state))
    proc = train(out, *STEPS_SAVE, "--resume_from_checkpoint", "true")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert same_weights(out, uninterrupted)


@pytest.mark.slow  # tens of seconds of runs in one file's worker: CI runs it (-m 'not gpu')
def test_a_resumed_two_process_run_reports_the_uninterrupted_runs_training_loss(tmp_path):
    """Each process adds up its own batches' losses, and only process 0's sum was saved: resumed, every process took
    it, and the mean over processes came out wrong (2.308158 against 2.310521)."""
    whole, out = tmp_path / "whole", tmp_path / "run"
    two = {"launcher": LAUNCHER}
    assert run_script(["-m", "finetune.run", *RUN, "--output_dir", str(whole)], **two).returncode == 0
    env = {"SIGNAL_AT": "3", "SIGNAL_RANK": "1"}
    proc = run_script([SIGNALLED, *RUN, "--output_dir", str(out)], env=env, **two)
    assert "Process 0 of 2" in proc.stdout + proc.stderr and (out / "checkpoint-3").is_dir(), proc.stderr[-3000:]
    resume = ["-m", "finetune.run", *RUN, "--output_dir", str(out), "--resume_from_checkpoint", "true"]
    # A refused resume is said once, not by each process.
    proc = run_script([*resume, "--learning_rate", "1e-2"], **two)
    assert proc.returncode != 0 and proc.stderr.count("error: The resumed checkpoint (step 3)") == 1, proc.stderr
    proc = run_script(resume, **two)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert results(out)["train"]["steps"] == results(whole)["train"]["steps"] == 8
    assert results(out)["train"]["loss"] == pytest.approx(results(whole)["train"]["loss"], rel=1e-6)


@pytest.mark.slow  # tens of seconds of runs in one file's worker: CI runs it (-m 'not gpu')
def test_a_two_process_run_resumed_from_a_best_checkpoint_reports_the_uninterrupted_runs_training_loss(tmp_path):
    """`save_strategy: best` decides to save after the evaluation: the processes' loss sums were not shared before
    that save, and the run resumed from it (a preemption's kill) reported 2.308067 against 2.305842."""
    whole, out = tmp_path / "whole", tmp_path / "run"
    best, two = ["--save_strategy", "best", "--bf16", "false"], {"launcher": LAUNCHER}
    assert run_script(["-m", "finetune.run", *RUN, *best, "--output_dir", str(whole)], **two).returncode == 0
    shutil.copytree(whole / "checkpoint-4", out / "checkpoint-4")  # the first epoch's, its best
    resume = ["-m", "finetune.run", *RUN, *best, "--output_dir", str(out), "--resume_from_checkpoint", "true"]
    proc = run_script(resume, **two)
    assert proc.returncode == 0 and "Process 0 of 2" in proc.stdout + proc.stderr, proc.stderr[-3000:]
    assert results(out)["train"]["steps"] == results(whole)["train"]["steps"] == 8
    assert results(out)["train"]["loss"] == pytest.approx(results(whole)["train"]["loss"], rel=1e-6)


@pytest.mark.slow
def test_a_quickstart_stopped_while_its_source_model_trains_resumes_it(tmp_path):
    """Step 2 of the quickstart ("pretraining" its source model), stopped by Ctrl-C, goes on from the checkpoint the
    stop saved when the quickstart is run again, as the stop's line says, instead of training it anew."""
    stopped = {"SIGNAL_COMMAND": "finetune.tools.quickstart", "SIGNAL_AT": "100", "SIGNAL": "INT"}  # of 240 steps
    options = ["--num_train_epochs", "2"]  # of step 3
    proc = run_script([SIGNALLED, *options], env=stopped, cwd=tmp_path)
    assert proc.returncode == 128 + signal.SIGINT, proc.stderr[-3000:]
    assert "saved outputs/quickstart/source_model/checkpoint-100" in proc.stderr, proc.stderr[-3000:]
    proc = run_script(["-m", "finetune.tools.quickstart", *options], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Resuming from outputs/quickstart/source_model/checkpoint-100" in proc.stdout + proc.stderr
    # The whole run's steps, not the resumed part's.
    assert results(tmp_path / "outputs/quickstart/source_model")["train"]["steps"] == 240
