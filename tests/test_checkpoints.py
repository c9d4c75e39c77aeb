"""Checkpoints are trusted only when whole: a save that fails (a full disk) or is interrupted (Ctrl-C) leaves no
`checkpoint-N` that a resume would pick, and a damaged one is skipped by `resume_from_checkpoint: true` for the one
before (never resumed into a crash or a silent restart of the optimizer). One run per output folder: a second is
refused while the first lives, and the lock of a killed run is taken over."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from finetune import run
from finetune.arguments import parse_args
from finetune.callbacks import ResumeRefused
from finetune.checkpoints import LOCK_NAME, RunLock, checkpoint_problem, resolve_checkpoint
from finetune.errors import run_command


ROOT = Path(__file__).resolve().parent.parent
# 64 digits, batch 8: 8 steps an epoch. hidden_size 64 makes model.safetensors about 180 kB.
TINY = ["--model_type", "scratch", "--image_size", "8", "--patch_size", "2", "--hidden_size", "64",
        "--num_hidden_layers", "1", "--num_attention_heads", "2", "--dataset_name", "sklearn:digits",
        "--max_train_samples", "64", "--max_eval_samples", "32", "--decoded_cache_dir", "none",
        "--logging_steps", "1000"]  # fmt: skip


def subprocess_env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def checkpoints(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint-"))


@pytest.mark.slow
def test_a_failed_write_is_skipped_and_resume_continues_from_the_last_whole_one(tmp_path, caplog):
    out = tmp_path / "out"
    run.main([*TINY, "--num_train_epochs", "1", "--output_dir", str(out)])
    assert checkpoints(out) == ["checkpoint-8"]

    # A 100 kB file-size limit (as a full disk): the second epoch trains, then its checkpoint cannot be written.
    args = [*TINY, "--num_train_epochs", "2", "--output_dir", str(out), "--resume_from_checkpoint", "true"]
    command = f"ulimit -f 100 && exec {sys.executable} -m finetune.run " + " ".join(args)
    failed = subprocess.run(
        ["bash", "-c", command], env=subprocess_env(), cwd=tmp_path, capture_output=True, text=True
    )
    assert failed.returncode == 1
    # One line naming the full disk and the way on (the error's type and torch's words alone were said).
    line = failed.stderr.strip().splitlines()[-1]
    assert "File too large" in line and "the disk (or quota) is full. Fix: free space on it" in line, line
    assert line.endswith("then: Its checkpoints are kept: resume with `--resume_from_checkpoint true`."), line
    assert not (out / LOCK_NAME).exists(), "a run that fails releases its output folder"

    with caplog.at_level("WARNING"):
        results = run.main(args)["scratch"]
    assert "it cannot be resumed exactly" in caplog.text and "checkpoint-16" in caplog.text  # cut short
    assert checkpoints(out) == ["checkpoint-16", "checkpoint-8"]
    assert results.epochs == 2.0 and results.train.steps == 16  # the whole run, resumed at step 8
    assert json.loads((out / "checkpoint-16" / "trainer_state.json").read_text())["global_step"] == 16


@pytest.mark.slow
def test_a_full_disk_at_the_first_checkpoint_names_the_command_that_goes_on(tmp_path):
    """With only a checkpoint cut short, the way on named was `--resume_from_checkpoint true`, which refuses it."""
    out = tmp_path / "out"
    args = [*TINY, "--num_train_epochs", "1", "--output_dir", str(out)]
    command = f"ulimit -f 100 && exec {sys.executable} -m finetune.run " + " ".join(args)
    failed = subprocess.run(["bash", "-c", command], env=subprocess_env(), capture_output=True, text=True)
    line = failed.stderr.strip().splitlines()[-1]
    assert failed.returncode == 1 and "the disk (or quota) is full" in line, failed.stderr[-2000:]
    fix = "then: No checkpoint was saved whole: rerun the same command with `--resume_from_checkpoint auto`."
    assert line.endswith(fix) and checkpoints(out) == ["checkpoint-8"], line
    results = run.main([*args, "--resume_from_checkpoint", "auto"])["scratch"]  # as said, with room again
    assert results.train.steps == 8 and checkpoints(out) == ["checkpoint-8"]


PAUSE_IN_SECOND_SAVE = """
import sys, time
from finetune import run
from finetune.arguments import parse_args
from finetune.callbacks import ResumeRefused
from finetune.trainer import ImageClassificationTrainer

marker, argv = sys.argv[1], sys.argv[2:]
save_rng_state = ImageClassificationTrainer._save_rng_state
saves = []

def save_rng_state_then_pause(self, output_dir):
    # Half-way through the second checkpoint (model and optimizer written): wait for the test's SIGINT.
    save_rng_state(self, output_dir)
    saves.append(output_dir)
    if len(saves) == 2:
        open(marker, "w").close()
        time.sleep(120)

ImageClassificationTrainer._save_rng_state = save_rng_state_then_pause
run.main(argv)
"""


@pytest.mark.parametrize("ignored", [False, True], ids=["foreground", "background job"])
def test_two_sigints_during_a_save_stop_at_once_and_resume_skips_the_cut_checkpoint(tmp_path, caplog, ignored):
    """The first SIGINT asks for a checkpoint after the running step; a second one ends the run at once, here in the
    middle of writing checkpoint-16, which the resume then skips. Also where SIGINT was ignored when the run started,
    as a shell does for the background jobs of a script."""
    out, marker = tmp_path / "out", tmp_path / "saving"
    args = [*TINY, "--num_train_epochs", "2", "--output_dir", str(out)]
    process = subprocess.Popen(
        [sys.executable, "-c", PAUSE_IN_SECOND_SAVE, str(marker), *args],
        env=subprocess_env(),
        preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignored else None,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert process.poll() is None, process.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "the run never reached its second save"
            time.sleep(0.1)
        assert (out / "checkpoint-16").is_dir()  # being written
        # Two signals that reach a process before it runs again are one (POSIX does not queue them): on a loaded
        # machine the second is sent again until the process ends, which it must do long before its 120 s pause.
        process.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 60
        while process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
            process.send_signal(signal.SIGINT)
        assert process.wait(timeout=5) != 0
    finally:
        process.kill()
        process.wait()
    assert not (out / "results.json").exists()
    assert not (out / LOCK_NAME).exists(), "an interrupted run releases its output folder"

    with caplog.at_level("WARNING"):
        results = run.main([*args, "--resume_from_checkpoint", "true"])["scratch"]
    assert "it cannot be resumed exactly" in caplog.text and "checkpoint-16" in caplog.text
    assert checkpoints(out) == ["checkpoint-16", "checkpoint-8"]
    assert results.epochs == 2.0 and results.train.steps == 16


def test_a_leftover_partial_checkpoint_blocks_nothing(tmp_path, caplog):
    """A partial folder left by a killed process (`kill -9` gives no chance to clean up) is removed, with a warning,
    and neither counts as an earlier run nor as a checkpoint to resume from."""
    out = tmp_path / "out"
    (out / "tmp-checkpoint-8").mkdir(parents=True)
    (out / "tmp-checkpoint-8" / "config.json").write_text("{}")
    args = parse_args([*TINY, "--output_dir", str(out)])[3]
    with caplog.at_level("WARNING"):
        assert resolve_checkpoint(out, args) is None
    assert "tmp-checkpoint-8" in caplog.text and not (out / "tmp-checkpoint-8").exists()

    (out / "tmp-checkpoint-8").mkdir()
    args = parse_args([*TINY, "--output_dir", str(out), "--resume_from_checkpoint", "true"])[3]
    with pytest.raises(FileNotFoundError, match="holds no complete checkpoint"):
        resolve_checkpoint(out, args)


def test_a_folder_that_is_no_checkpoint_is_named_so(tmp_path):
    """A run's folder, or an empty one, as `resume_from_checkpoint`: it was said to hold "the model only (saved with
    `save_only_model`)", with a fix that started a new run from weights it does not have."""
    run_dir = tmp_path / "run"
    for step in (8, 16):
        (run_dir / f"checkpoint-{step}").mkdir(parents=True)
    (tmp_path / "empty").mkdir()
    expected = {
        run_dir: r"'.*run' is not a checkpoint folder; it holds checkpoint-16, checkpoint-8: pass one of them \(the "
        r"newest is checkpoint-16\)\.$",
        tmp_path / "empty": r"'.*empty' is not a checkpoint folder\.$",
        tmp_path / "missing": r"'.*missing' is not a checkpoint folder\.$",
    }
    for folder, match in expected.items():
        args = parse_args([*TINY, "--output_dir", str(tmp_path / "out"), "--resume_from_checkpoint", str(folder)])[3]
        with pytest.raises(FileNotFoundError, match=match):
            resolve_checkpoint(tmp_path / "out", args)


def test_yes_and_no_on_the_command_line_are_read_as_a_config_reads_them(tmp_path, monkeypatch):
    """YAML reads `resume_from_checkpoint: yes` as true: `--resume_from_checkpoint yes` (or 1) was a checkpoint folder
    named `yes`, "not a checkpoint folder", and `no` (or 0) one named `no`. A folder of that name is still one."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"

    def resolve(word):
        return resolve_checkpoint(
            out, parse_args([*TINY, "--output_dir", str(out), "--resume_from_checkpoint", word])[3]
        )

    for word in ("true", "yes", "1", "Y"):
        with pytest.raises(FileNotFoundError, match="holds no complete checkpoint"):
            resolve(word)
    for word in ("false", "no", "0", "N"):
        assert resolve(word) is None
    (tmp_path / "1").mkdir()
    with pytest.raises(FileNotFoundError, match=r"'1' is not a checkpoint folder\.$"):
        resolve("1")


def test_another_runs_checkpoint_never_goes_on_over_an_earlier_run(trained, tmp_path):
    """An explicit checkpoint of another run, resumed into a folder holding a run, overwrote that run's checkpoints
    and results (rotation deleted the rest), exit 0. Its own checkpoints still resume there; under `both` one path
    cannot name both models' checkpoints."""
    other = tmp_path / "other"
    shutil.copytree(trained, other)
    foreign = str(trained / "checkpoint-8")

    def resolve(out, resume, *extra, one_of_two=False):
        args = parse_args([*TINY, "--output_dir", str(out), "--resume_from_checkpoint", resume, *extra])[3]
        return resolve_checkpoint(out, args, one_of_two)

    with pytest.raises(FileExistsError, match=r"other already holds an earlier run \(checkpoint-8, checkpoint-16, "):
        resolve(other, foreign)
    assert checkpoints(other) == ["checkpoint-16", "checkpoint-8"]
    assert resolve(other, foreign, "--overwrite_output_dir", "true") == foreign
    assert resolve(other, str(other / "checkpoint-8")) == str(other / "checkpoint-8")
    assert resolve(tmp_path / "new", foreign) == foreign
    # A finished run whose checkpoints were deleted: `auto` starts nothing over it, and names no resume as the fix.
    finished = tmp_path / "finished"
    finished.mkdir()
    shutil.copy(trained / "results.json", finished)
    with pytest.raises(
        FileExistsError, match=r"\(results.json\)\. Nothing was changed\. Fix: a new `--output_dir`, or"
    ):
        resolve(finished, "auto")
    with pytest.raises(ValueError, match=r"names one checkpoint, and `model_type: both` trains two models"):
        resolve(tmp_path / "both" / "scratch", foreign, one_of_two=True)
    # Replacing the earlier run removes its checkpoints, which would otherwise mix with the resumed run's; only once
    # the resume is accepted: one refused at the Trainer's start (other steps an epoch) had deleted the earlier run.
    args = [*TINY, "--num_train_epochs", "2", "--output_dir", str(other), "--resume_from_checkpoint", foreign]
    before = sorted(p.name for p in other.iterdir())
    with pytest.raises(ValueError, match=r"was trained at 8 optimizer steps an epoch, and this run has 4"):
        run.main([*args, "--overwrite_output_dir", "true", "--per_device_train_batch_size", "16"])
    assert sorted(p.name for p in other.iterdir()) == before
    run.main([*args, "--overwrite_output_dir", "true"])
    assert checkpoints(other) == ["checkpoint-16"] and checkpoints(trained) == ["checkpoint-16", "checkpoint-8"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """One tiny run of two epochs, shared: whole checkpoint-8 and checkpoint-16. Each test damages a copy."""
    out = tmp_path_factory.mktemp("trained") / "out"
    run.main([*TINY, "--num_train_epochs", "2", "--output_dir", str(out)])
    assert checkpoints(out) == ["checkpoint-16", "checkpoint-8"]
    return out


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


# What a crash, a full disk or a careless `rm` leaves: (file, damage, the problem the warning names).
DAMAGES = {
    "truncated weights": ("model.safetensors", truncate, "model.safetensors is unreadable"),
    "deleted weights": ("model.safetensors", Path.unlink, "model.safetensors is missing"),
    "deleted optimizer": ("optimizer.pt", Path.unlink, "optimizer.pt is missing"),
    "truncated optimizer": ("optimizer.pt", truncate, "optimizer.pt is unreadable"),
    "truncated scheduler": ("scheduler.pt", truncate, "scheduler.pt is unreadable"),
    # Written last: a save stopped before it, or while it was written, was cut short.
    "broken trainer state": ("trainer_state.json", truncate, "it was cut short: trainer_state.json, which a save"),
    "missing trainer state": ("trainer_state.json", Path.unlink, "it was cut short: trainer_state.json, which a"),
    "missing rng state": ("rng_state.pth", Path.unlink, "rng_state.pth is missing"),
}


def resume_args(out: Path, resume: str = "true") -> list[str]:
    # A third epoch; every checkpoint kept, so that the re-saved checkpoint-16 can be read afterwards.
    return [*TINY, "--num_train_epochs", "3", "--save_total_limit", "5", "--output_dir", str(out),
            "--resume_from_checkpoint", resume]  # fmt: skip


@pytest.mark.parametrize("damage", DAMAGES)
def test_resume_skips_a_damaged_newest_checkpoint_for_the_previous_whole_one(trained, tmp_path, caplog, damage):
    name, spoil, problem = DAMAGES[damage]
    out = Path(shutil.copytree(trained, tmp_path / "out"))
    spoil(out / "checkpoint-16" / name)
    with caplog.at_level("INFO", logger="finetune.checkpoints"):
        run.main(resume_args(out))
    ours = [r for r in caplog.records if r.name == "finetune.checkpoints"]
    warnings = [r.getMessage() for r in ours if r.levelname == "WARNING"]
    assert len(warnings) == 1 and f"checkpoint-16: {problem}" in warnings[0], warnings
    assert f"Resuming from {out / 'checkpoint-8'}" in caplog.text
    # Resumed at step 8: steps 9-16 were trained again and checkpoint-16 saved anew, whole; the run ended at 24.
    args = parse_args(resume_args(out))[3]
    assert checkpoint_problem(out / "checkpoint-16", args) is None
    assert json.loads((out / "checkpoint-24" / "trainer_state.json").read_text())["global_step"] == 24


def test_without_a_whole_checkpoint_resume_is_refused_in_one_line(trained, tmp_path, capsys):
    """No silent restart of the optimizer and the schedule (what transformers does when optimizer.pt is missing)."""
    out = Path(shutil.copytree(trained, tmp_path / "out"))
    for checkpoint in ("checkpoint-8", "checkpoint-16"):
        (out / checkpoint / "optimizer.pt").unlink()
    assert run_command(run.main, resume_args(out)) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {out} holds no whole checkpoint"), lines
    assert "checkpoint-16: optimizer.pt is missing" in lines[0] and "Fix:" in lines[0]
    assert checkpoints(out) == ["checkpoint-16", "checkpoint-8"]  # nothing trained
    assert not (out / LOCK_NAME).exists(), "a refused run releases its output folder at once"


def test_a_damaged_best_checkpoint_is_found_before_training(trained, tmp_path, capsys):
    """The run ends with its best checkpoint: where an older one was the best and was damaged, the resumed run trained
    to its end, then failed on it (an unexpected SafetensorError), and so did every rerun."""
    out = Path(shutil.copytree(trained, tmp_path / "out"))
    state_file = out / "checkpoint-16" / "trainer_state.json"
    state = json.loads(state_file.read_text())
    state["best_model_checkpoint"] = str(out / "checkpoint-8")  # its first evaluation was the best
    state_file.write_text(json.dumps(state))
    truncate(out / "checkpoint-8" / "model.safetensors")
    assert run_command(run.main, resume_args(out)) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    problem = (
        "checkpoint-16: its best checkpoint, checkpoint-8, which the run ends with, is damaged: model.safetensors"
    )
    assert len(lines) == 1 and problem in lines[0] and "`--load_best_model_at_end false`" in lines[0], lines
    assert checkpoints(out) == ["checkpoint-16", "checkpoint-8"]  # nothing trained
    # Without the best model at the end, its damage does not matter.
    assert checkpoint_problem(out / "checkpoint-16", parse_args(resume_args(out))[3]) is not None
    no_best = parse_args([*resume_args(out), "--load_best_model_at_end", "false"])[3]
    assert checkpoint_problem(out / "checkpoint-16", no_best) is None


def test_a_resume_in_another_mixed_precision_is_said_with_the_fix(trained, tmp_path, caplog):
    """`bf16: auto` measures the machine again when a run resumes (a busy or another machine can measure otherwise):
    a resumed run that goes on in another precision than its checkpoint trained in says so, and how to keep it."""
    out = Path(shutil.copytree(trained, tmp_path / "out"))
    trained_in = json.loads((trained / "results.json").read_text())["hyperparameters"]["mixed_precision"]
    other, keep = (["--bf16", "false"], "`--bf16 true`") if trained_in == "bf16" else (["--bf16", "true"], None)
    with caplog.at_level("WARNING"):
        run.main([*resume_args(out, str(out / "checkpoint-8")), "--num_train_epochs", "2", *other])
    said = [r.getMessage() for r in caplog.records if "trained in mixed precision" in r.getMessage()]
    assert len(said) == 1 and f"step 8) trained in mixed precision {trained_in} and this run goes on in" in said[0]
    assert f"Fix: resume with {keep or '`--bf16 false --fp16 false`'} to go on as it trained." in said[0]
    caplog.clear()
    with caplog.at_level("WARNING"):  # resumed again in the precision it now trained in: nothing to say
        run.main([*resume_args(out), *other])
    assert "trained in mixed precision" not in caplog.text
    # A CPU checkpoint recorded as fp16, before fp16 on a CPU was refused, trained in float32: its fix named the
    # refused `--fp16 true`.
    fresh = Path(shutil.copytree(trained, tmp_path / "fresh"))
    state_file = fresh / "checkpoint-8" / "trainer_state.json"
    state = json.loads(state_file.read_text())
    state["stateful_callbacks"]["ResumeCheck"]["attributes"]["precision"] = "fp16"
    state_file.write_text(json.dumps(state))
    caplog.clear()
    with caplog.at_level("WARNING"):
        run.main([*resume_args(fresh, str(state_file.parent)), "--num_train_epochs", "2", "--bf16", "false"])
    assert "trained in mixed precision" not in caplog.text


def test_a_damaged_checkpoint_named_explicitly_is_refused_in_one_line(trained, tmp_path, capsys):
    out = Path(shutil.copytree(trained, tmp_path / "out"))
    truncate(out / "checkpoint-8" / "optimizer.pt")
    assert run_command(run.main, resume_args(out, str(out / "checkpoint-8"))) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "checkpoint-8' cannot be resumed: optimizer.pt is unreadable" in lines[0], lines

    # A whole one named explicitly is resumed, although a newer one is damaged.
    (out / "checkpoint-8" / "optimizer.pt").write_bytes((trained / "checkpoint-8" / "optimizer.pt").read_bytes())
    (out / "checkpoint-16" / "model.safetensors").unlink()
    results = run.main(resume_args(out, str(out / "checkpoint-8")))["scratch"]
    assert results.epochs == 3.0 and checkpoint_problem(out / "checkpoint-16", parse_args(resume_args(out))[3]) is None


def test_a_checkpoint_of_another_model_config_is_refused_in_one_line(trained, tmp_path, capsys):
    """Only tensor shapes were checked: weights trained with 2 heads and GELU went on as 4 heads and ReLU, and a head
    trained with class 0 = "0" as class 0 = "9" (the classes in another order), exit 0."""
    out = Path(shutil.copytree(trained, tmp_path / "out"))
    order = ["--include_labels", *map(str, range(9, -1, -1))]
    heads = ["--num_attention_heads", "4", "--hidden_act", "relu"]
    cases = ((heads, 'hidden_act "gelu" (now "relu"); num_attention_heads 2 (now 4)'),
             (order, "id2label (another value now); label2id"))  # fmt: skip
    for other, said in cases:
        assert run_command(run.main, [*resume_args(out), "--num_train_epochs", "3", *other]) == 1
        [line] = capsys.readouterr().err.strip().splitlines()
        assert line.startswith("error: The checkpoint ") and f"checkpoint-16 is of another model ({said}" in line, line
        assert "Fix: resume with the options it was trained with (its config.json)" in line
    assert checkpoints(out) == ["checkpoint-16", "checkpoint-8"]  # nothing trained


def test_a_checkpoint_whose_split_was_drawn_from_its_classes_alone_is_refused(trained, tmp_path, capsys):
    """A checkpoint of a run on some classes (`include_labels`) saved before the validation split was drawn from every
    class's images: resumed, its validation split would hold images it trained on. All classes in their order drew
    the same split then, and resume. A refused split no longer offers a new run from the checkpoint's weights."""

    def as_saved_before(checkpoint: Path, include_labels: list[str]) -> None:
        state = json.loads((checkpoint / "trainer_state.json").read_text())
        options = state["stateful_callbacks"]["ResumeCheck"]["attributes"]["options"]
        assert options.pop("held_out_images") == round(0.1 * 1797)  # the whole train split's
        options["include_labels"] = include_labels
        (checkpoint / "trainer_state.json").write_text(json.dumps(state))

    some = ["--include_labels", "0", "1", "2", "3", "4"]
    out = tmp_path / "some"
    run.main([*TINY, *some, "--num_train_epochs", "1", "--output_dir", str(out)])
    as_saved_before(out / "checkpoint-8", some[1:])
    assert run_command(run.main, [*resume_args(out), *some]) == 1
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "held out its validation split from the `include_labels` classes alone" in line, line
    assert checkpoints(out) == ["checkpoint-8"]  # nothing trained

    every_class = ["--include_labels", *map(str, range(10))]
    out = Path(shutil.copytree(trained, tmp_path / "every"))
    as_saved_before(out / "checkpoint-16", every_class[1:])
    assert run_command(run.main, [*resume_args(out), "--seed", "7", *every_class]) == 1
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "seed 42 (now 7)" in line and line.endswith("Fix: resume with the options it was trained with."), line
    assert run_command(run.main, [*resume_args(out), *every_class]) == 0
    assert "checkpoint-24" in checkpoints(out)


def test_a_checkpoint_of_other_steps_an_epoch_is_refused_in_one_line(trained, tmp_path, capsys):
    """The Trainer reads its step count through this run's optimizer steps an epoch: step 16 of 8 steps an epoch
    resumed at 4 an epoch would be read as epoch 4. Seen from the steps alone, also without training_args.bin."""
    out = Path(shutil.copytree(trained, tmp_path / "out"))
    (out / "checkpoint-16" / "training_args.bin").unlink()
    for other, now in ((["--per_device_train_batch_size", "16"], 4), (["--gradient_accumulation_steps", "2"], 4)):
        assert run_command(run.main, [*resume_args(out), *other]) == 1
        lines = capsys.readouterr().err.strip().splitlines()
        said = "error: The resumed checkpoint (step 16) was trained at 8 optimizer steps an epoch, and this run has"
        assert len(lines) == 1 and lines[0].startswith(f"{said} {now}:"), lines
        assert "Fix: resume with the options it was trained with, or start a new run" in lines[0]
    # The same steps an epoch at another batch size (9 for 8: 8 steps of 64 images) trains other steps.
    assert run_command(run.main, [*resume_args(out), "--per_device_train_batch_size", "9"]) == 1
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "(step 16) was trained at 8 images an optimizer step" in line and "this run takes 9:" in line, line
    # Fewer images: named by the option that chose them.
    assert run_command(run.main, [*resume_args(out), "--max_train_samples", "32"]) == 1
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "was trained with max_train_samples 64 (now 32):" in line, line
    assert checkpoints(out) == ["checkpoint-16", "checkpoint-8"]  # nothing trained
    # The same steps an epoch in other parts resumes, and what it saved resumes again with the same command.
    args = ["--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "2"]
    resumed = run.main([*resume_args(out), *args])["scratch"]
    assert resumed.epochs == 3.0 and resumed.hyperparameters["gradient_accumulation_steps"] == 2  # results say so
    assert resumed.hyperparameters["metric_for_best_model"] == "accuracy"  # what chose the kept model
    assert run.main([*resume_args(out), *args, "--num_train_epochs", "4"])["scratch"].epochs == 4.0


def test_a_run_resumed_with_ignore_data_skip_is_checked_by_its_saved_steps_an_epoch(tmp_path, capsys):
    """`ignore_data_skip` trains the resumed epoch again from its start, so the next checkpoint's step no longer
    counts its epoch (step 8 at epoch 0.5): resumed as trained it was refused (as 16 steps an epoch), and at 16 steps
    an epoch it was taken. The checkpoint says how many steps an epoch it was trained at."""
    out = tmp_path / "out"
    args = [*TINY, "--num_train_epochs", "1", "--save_strategy", "steps", "--save_steps", "4",
            "--load_best_model_at_end", "false", "--output_dir", str(out)]  # fmt: skip
    run.main(args)
    shutil.rmtree(out / "checkpoint-8")  # as if stopped after step 4
    run.main([*args, "--resume_from_checkpoint", "true", "--ignore_data_skip", "true"])
    assert json.loads((out / "checkpoint-8" / "trainer_state.json").read_text())["epoch"] == 0.5
    resume = [*args, "--resume_from_checkpoint", "true"]
    assert run_command(run.main, [*resume, "--per_device_train_batch_size", "4"]) == 1
    [line] = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert "(step 8) was trained at 8 optimizer steps an epoch, and this run has 16:" in line, line
    assert run.main([*resume, "--num_train_epochs", "2"])["scratch"].epochs == 2.0


def test_auto_find_batch_size_resumes_with_the_checkpoints_batch_size(tmp_path):
    """transformers takes up the batch size the finder settled on from the checkpoint, whatever the command says."""
    out = tmp_path / "out"
    args = [*TINY, "--auto_find_batch_size", "true", "--output_dir", str(out), "--num_train_epochs"]
    run.main([*args, "1"])
    results = run.main([*args, "2", "--per_device_train_batch_size", "16", "--resume_from_checkpoint", "true"])
    assert results["scratch"].epochs == 2.0 and checkpoints(out) == ["checkpoint-16", "checkpoint-8"]


def test_a_checkpoint_of_other_model_options_is_refused_in_one_line(trained, tmp_path, capfd):
    """Without transformers' load report (a table with a row per tensor, in terminal colours) before it. The tensors
    are compared where no config.json names the options (`config_changes` names them first otherwise)."""
    out = Path(shutil.copytree(trained, tmp_path / "out"))
    (out / "checkpoint-16" / "config.json").unlink()
    capfd.readouterr()
    cases = {
        "classifier.1.weight: [10, 64] saved, [10, 32] here; ": ["--hidden_size", "32"],
        "classifier.1.bias: [10] saved, [5] here; classifier.1.weight: [10, 64] saved": ["--include_labels", *"01234"],
    }
    for tensor, other in cases.items():
        assert run_command(run.main, [*resume_args(out), *other]) == 1
        err = capfd.readouterr().err
        [line] = [line for line in err.splitlines() if line.startswith("error:")]
        assert "LOAD REPORT" not in err and "\x1b[" not in err and "above report" not in line, err[-3000:]
        assert line.startswith(f"error: The checkpoint {out / 'checkpoint-16'} does not fit this model ({tensor}")
        assert "Fix: resume with the options it was trained with" in line and "a new `--output_dir`" in line


def test_checkpoints_of_a_save_only_model_run_are_not_resumed(tmp_path, capsys):
    """They hold no optimizer, schedule or RNG state: the Trainer would resume them with a new optimizer and the
    learning rate back at its warm-up. Refused, with the way to continue from their weights."""
    out = tmp_path / "out"
    run.main([*TINY, "--num_train_epochs", "1", "--save_only_model", "true", "--output_dir", str(out)])
    assert not (out / "checkpoint-8" / "optimizer.pt").exists()
    capsys.readouterr()  # the training's progress bars
    for resume in ("true", str(out / "checkpoint-8")):
        assert run_command(run.main, resume_args(out, resume)) == 1
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and "save_only_model" in lines[0], lines
        assert f"--model_name_or_path {out / 'checkpoint-8'}" in lines[0]


@pytest.mark.slow
def test_a_second_run_on_a_folder_in_use_is_refused_and_a_killed_runs_lock_is_taken_over(tmp_path, caplog):
    out = tmp_path / "out"
    endless = [*TINY, "--max_steps", "100000", "--eval_strategy", "no", "--save_strategy", "no",
               "--load_best_model_at_end", "false", "--output_dir", str(out)]  # fmt: skip
    first = subprocess.Popen(
        [sys.executable, "-m", "finetune.run", *endless],
        env={**subprocess_env(), "OMP_NUM_THREADS": "1"},  # one core: the second run starts beside it
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not (out / LOCK_NAME).exists():
            assert first.poll() is None, first.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "the first run never locked its output folder"
            time.sleep(0.05)
        second = subprocess.run(
            [sys.executable, "-m", "finetune.run", *TINY, "--output_dir", str(out)],
            env=subprocess_env(),
            cwd=tmp_path,
            capture_output=True,
            text=True,
        )
        assert second.returncode == 1
        errors = [line for line in second.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, second.stderr[-3000:]
        assert f"in use by another run (process {first.pid} on {socket.gethostname()}" in errors[0]
        assert "another `--output_dir`" in errors[0]
        assert first.poll() is None, "the refused run must leave the first one alone"
        # Nor a folder inside it (a `both` run's pretrained/: overwriting it deleted the live run's checkpoints), nor
        # one that holds it.
        for folder in (out / "pretrained", tmp_path):
            with pytest.raises(RuntimeError, match=f"in use by another run .process {first.pid} on ") as refused:
                run.main([*TINY, "--output_dir", str(folder), "--overwrite_output_dir", "true"])
            assert str(refused.value).startswith(f"{folder} is in use") and f"which holds {out})" in str(refused.value)
        assert not (out / "pretrained").exists() and not (tmp_path / LOCK_NAME).exists()
        first.kill()  # SIGKILL: no chance to remove its lock
        first.wait()
    finally:
        first.kill()
        first.wait()
    assert json.loads((out / LOCK_NAME).read_text())["pid"] == first.pid  # left behind, stale

    with caplog.at_level("INFO", logger="finetune.checkpoints"):
        results = run.main([*TINY, "--num_train_epochs", "1", "--output_dir", str(out)])["scratch"]
    assert f"process {first.pid}) is no longer alive" in caplog.text
    assert results.train.steps == 8 and not (out / LOCK_NAME).exists(), "released at the end"


def test_a_lock_of_another_host_is_never_taken_over(tmp_path):
    """Whether a process of another machine lives cannot be checked from here: the lock is reported, with its fix."""
    (tmp_path / LOCK_NAME).write_text(json.dumps({"pid": os.getpid(), "host": "node-7", "started": "earlier"}))
    with pytest.raises(RuntimeError, match=rf"process {os.getpid()} on node-7, .* delete {tmp_path / LOCK_NAME}"):
        RunLock(tmp_path).acquire()
    (tmp_path / LOCK_NAME).write_text("not json")
    with pytest.raises(RuntimeError, match="an unreadable lock"):
        RunLock(tmp_path).acquire()
    (tmp_path / LOCK_NAME).unlink()
    with RunLock(tmp_path) as lock:
        assert json.loads(lock.path.read_text())["host"] == socket.gethostname()
    assert not (tmp_path / LOCK_NAME).exists()


def test_sharded_and_lora_weights_are_checked_file_by_file(trained, tmp_path):
    """The weights of a big model (shards named by an index) and of a LoRA run (its adapter) are read too."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForImageClassification

    args = parse_args(resume_args(trained))[3]
    model = AutoModelForImageClassification.from_pretrained(trained / "checkpoint-16")
    sharded = Path(shutil.copytree(trained / "checkpoint-16", tmp_path / "sharded"))
    (sharded / "model.safetensors").unlink()
    model.save_pretrained(sharded, max_shard_size="50KB")
    shards = sorted(sharded.glob("model-*.safetensors"))
    assert len(shards) > 1 and checkpoint_problem(sharded, args) is None
    truncate(shards[-1])
    assert checkpoint_problem(sharded, args).startswith(f"{shards[-1].name} is unreadable")

    lora = Path(shutil.copytree(trained / "checkpoint-16", tmp_path / "lora"))
    (lora / "model.safetensors").unlink()
    get_peft_model(model, LoraConfig(r=2, target_modules=["qkv"])).save_pretrained(lora)
    assert checkpoint_problem(lora, args) is None
    truncate(lora / "adapter_model.safetensors")
    assert checkpoint_problem(lora, args).startswith("adapter_model.safetensors is unreadable")


def test_resume_auto_starts_a_new_run_and_resumes_an_interrupted_one(tmp_path, caplog):
    """`resume_from_checkpoint: auto`, for preemptible machines that restart the same command."""
    out = tmp_path / "out"
    args = [*TINY, "--output_dir", str(out), "--resume_from_checkpoint", "auto"]
    run.main([*args, "--num_train_epochs", "1"])  # a fresh folder: starts
    (out / "results.json").unlink()  # as if stopped after its first epoch's checkpoint
    with caplog.at_level("INFO"):
        results = run.main([*args, "--num_train_epochs", "2"])["scratch"]
    assert f"Resuming from {out / 'checkpoint-8'}" in caplog.text
    assert results.train.steps == 16 and checkpoints(out) == ["checkpoint-16", "checkpoint-8"]


def test_a_finished_run_whose_checkpoints_were_cut_short_names_fixes_that_work(tmp_path):
    """Its fix named `--resume_from_checkpoint auto`, which starts anew only a run without results: refused again."""
    out = tmp_path / "out"
    args = [*TINY, "--output_dir", str(out), "--num_train_epochs", "1"]
    run.main(args)
    for checkpoint in out.glob("checkpoint-*"):
        (checkpoint / "trainer_state.json").unlink()
    results = (out / "results.json").read_bytes()
    for resume in ("auto", "true"):
        with pytest.raises(
            ValueError, match=r"results.json are kept\. Fix: .* `--overwrite_output_dir true`"
        ) as error:
            run.main([*args, "--resume_from_checkpoint", resume])
        assert "resume_from_checkpoint auto" not in str(error.value)
    assert (out / "results.json").read_bytes() == results
    run.main([*args, "--overwrite_output_dir", "true"])  # the fix, as given


def test_a_max_steps_run_resumed_from_its_last_step_trains_no_further_step(tmp_path, caplog):
    """A `max_steps` run ending inside an epoch, resumed from its last checkpoint (finished, or stopped after its last
    step): the Trainer took one step more before it checked `max_steps`, and rewrote the results with it."""
    out = tmp_path / "out"
    args = [*TINY, "--max_steps", "12", "--output_dir", str(out), "--resume_from_checkpoint", "auto"]
    first = run.main(args)["scratch"]
    (out / "results.json").unlink()  # as if stopped after its last step's checkpoint
    with caplog.at_level("INFO"):
        again = run.main(args)["scratch"]
    assert again.train.steps == first.train.steps == 12 and checkpoints(out) == ["checkpoint-12", "checkpoint-8"]
    assert "at the run's last step (12): no step is trained" in caplog.text
    assert again.validation.accuracy == first.validation.accuracy and again.history == first.history


def test_a_resume_on_another_dataset_is_refused_and_on_the_same_folder_spelt_otherwise_goes_on(tmp_path, monkeypatch):
    """Another dataset of the same classes went on silently: its evaluations joined the first's in one history, the
    best model chosen across both."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    for folder, flip in (("digits", False), ("mirrored", True)):
        for i in range(80):
            class_dir = tmp_path / folder / str(digits.target[i])
            class_dir.mkdir(parents=True, exist_ok=True)
            image = digits.images[i][:, ::-1] if flip else digits.images[i]
            Image.fromarray((image * 15).astype(np.uint8)).save(class_dir / f"{i}.png")
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    args = [*TINY, "--num_train_epochs", "2", "--output_dir", str(out), "--resume_from_checkpoint", "auto"]
    run.main([*args, "--dataset_name", "digits"])
    (out / "results.json").unlink()
    shutil.rmtree(out / "checkpoint-16")  # as if stopped after its first epoch
    with pytest.raises(ResumeRefused, match=r"trained with dataset \S+digits \(now \S+mirrored\): its weights, tra"):
        run.main([*args, "--dataset_name", "mirrored"])
    # Files added since: as many images held out, other ones, some of them trained on (the run went on, exit 0).
    added = [tmp_path / "digits" / str(digits.target[i]) / f"{i}.png" for i in range(80, 84)]
    for i, path in zip(range(80, 84), added):
        Image.fromarray((digits.images[i] * 15).astype(np.uint8)).save(path)
    with pytest.raises(ResumeRefused, match=r"was validated on other images: the dataset's files changed since"):
        run.main([*args, "--dataset_name", "digits"])
    for path in added:
        path.unlink()
    assert run.main([*args, "--dataset_name", str(tmp_path / "digits")])["scratch"].train.steps == 16


def test_overwrite_output_dir_removes_the_earlier_run_only_once_the_new_one_can_train(tmp_path):
    """`--overwrite_output_dir` with a mistake elsewhere (a missing dataset, a ScratchViT that cannot be built) must
    fail before it deletes the earlier run: it was deleted first, then the new run refused, leaving neither."""
    out = tmp_path / "run"
    run.main([*TINY, "--max_steps", "2", "--output_dir", str(out)])
    earlier = sorted(p.name for p in out.iterdir())
    assert "results.json" in earlier and "checkpoint-2" in earlier
    for mistake in (["--dataset_name", str(tmp_path / "nope")], ["--patch_size", "3"]):
        with pytest.raises((FileNotFoundError, ValueError)):
            run.main([*TINY, "--max_steps", "2", "--output_dir", str(out), "--overwrite_output_dir", "true", *mistake])
        assert sorted(p.name for p in out.iterdir()) == earlier, mistake
    # Without a mistake the earlier run is replaced, as asked.
    run.main([*TINY, "--max_steps", "1", "--output_dir", str(out), "--overwrite_output_dir", "true"])
    assert (out / "checkpoint-1").is_dir() and not (out / "checkpoint-2").exists()


def test_overwrite_removes_what_would_serve_the_earlier_model_and_nothing_of_the_users(tmp_path):
    """A full fine-tune over a LoRA run left its adapters, merged/ and ONNX export: predict on the folder served the
    earlier LoRA model, with exit 0. A user's `checkpoint-notes` (not a `checkpoint-N`) was deleted with the run."""
    from test_run import tiny_vit_checkpoint

    from finetune.tools import export, predict

    base = tiny_vit_checkpoint(tmp_path / "base", num_labels=10)
    out = tmp_path / "run"
    pretrained = ["--model_type", "pretrained", "--model_name_or_path", str(base), *TINY[2:], "--max_steps", "2"]
    run.main([*pretrained, "--finetune_method", "lora", "--merge_lora", "true", "--output_dir", str(out)])
    export.main([str(out), "--format", "onnx"])
    export.main([str(out / "checkpoint-2"), "--format", "onnx"])  # beside it: onnx-checkpoint-2
    (out / "checkpoint-notes").mkdir()
    (out / "checkpoint-notes" / "mine.txt").write_text("mine")
    assert {"adapter_config.json", "merged", "onnx"} <= {p.name for p in out.iterdir()}
    run.main([*pretrained, "--output_dir", str(out), "--overwrite_output_dir", "true", "--learning_rate", "0.1"])
    names = {p.name for p in out.iterdir()}
    assert not names & {"adapter_config.json", "adapter_model.safetensors", "merged", "onnx", "onnx-checkpoint-2"}
    assert (out / "checkpoint-notes" / "mine.txt").read_text() == "mine"
    image = tmp_path / "digit.png"
    Image.fromarray(np.arange(64, dtype=np.uint8).reshape(8, 8) * 4).save(image)
    served = predict.main([str(out), str(image)])[0].scores
    assert served == predict.main([str(out / "checkpoint-2"), str(image)])[0].scores  # the new run's model


def test_a_lock_in_a_folder_that_turned_read_only_does_not_hide_the_runs_error(tmp_path, monkeypatch):
    """The output folder turned read-only mid-run: removing the lock raised, replacing the error that ended the run
    (a checkpoint that could not be written) with one about `.run.lock`, and again at exit with a traceback."""
    from finetune import checkpoints

    lock = RunLock(tmp_path / "run").acquire()
    real_unlink = Path.unlink

    def read_only(path, *args, **kwargs):
        if path.name == LOCK_NAME:
            raise OSError(30, "Read-only file system", str(path))
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(Path, "unlink", read_only)
    with pytest.raises(ValueError, match="^the run's own error$"):
        try:
            raise ValueError("the run's own error")
        finally:
            checkpoints.release_output_dirs()
    assert lock not in checkpoints.HELD and not lock.held and (tmp_path / "run" / LOCK_NAME).exists()


@pytest.mark.parametrize(
    "option, trained, others",
    [("--layer_decay", "0.5", [("0.9", "0.9"), ("none", "None")]),
     ("--finetune_method", "lora", [("full", "full"), ("linear_probe", "linear_probe")])],
)  # fmt: skip
def test_a_resume_with_another_layer_decay_or_finetune_method_is_refused_before_the_data_loads(
    tmp_path, capsys, option, trained, others
):
    """The saved optimizer state holds each layer's learning rate: resumed with another `layer_decay`, the run went
    on with the old rates and exit 0 (the same weights as the first run), and from none to some failed on torch's
    "loaded state dict has a different number of parameter groups". Another `finetune_method` failed on torch's or
    huggingface_hub's messages ("Missing key(s) in state_dict", "Repo id must be in the form ...")."""
    from test_run import tiny_vit_checkpoint

    base = tiny_vit_checkpoint(tmp_path / "base", num_labels=10)
    out = tmp_path / "out"
    first = ["--model_type", "pretrained", "--model_name_or_path", str(base), *TINY[2:], "--max_steps", "4"]
    first += ["--save_strategy", "steps", "--eval_strategy", "steps", "--save_steps", "2", "--eval_steps", "2"]
    first += ["--output_dir", str(out)]
    run.main([*first, option, trained])
    shutil.rmtree(out / "checkpoint-4")
    missing = ["--dataset_name", str(tmp_path / "missing.parquet")]  # said before the data loads, which would fail
    for other, now in others:
        assert run_command(run.main, [*first, option, other, "--resume_from_checkpoint", "true", *missing]) == 1
        [line] = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
        assert f"was trained with {option[2:]} {trained} (now {now}): its " in line, line
    assert checkpoints(out) == ["checkpoint-2"]  # nothing trained
    run.main([*first, option, trained, "--resume_from_checkpoint", "true"])  # the same one goes on
    assert checkpoints(out) == ["checkpoint-2", "checkpoint-4"]
