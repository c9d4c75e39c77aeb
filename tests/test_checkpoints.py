"""Checkpoints are atomic: a save that fails (a full disk) or is interrupted (Ctrl-C) leaves no `checkpoint-N` that a
resume would pick, and `resume_from_checkpoint: true` then continues from the last complete checkpoint."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from finetune import run
from finetune.arguments import parse_args
from finetune.checkpoints import resolve_checkpoint


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


def test_a_failed_write_leaves_no_checkpoint_and_resume_continues_from_the_last_complete_one(tmp_path):
    out = tmp_path / "out"
    run.main([*TINY, "--num_train_epochs", "1", "--output_dir", str(out)])
    assert checkpoints(out) == ["checkpoint-8"]

    # A 100 kB file-size limit (as a full disk): the second epoch trains, then its checkpoint cannot be written.
    args = [*TINY, "--num_train_epochs", "2", "--output_dir", str(out), "--resume_from_checkpoint", "true"]
    command = f"ulimit -f 100 && exec {sys.executable} -m finetune.run " + " ".join(args)
    failed = subprocess.run(
        ["bash", "-c", command], env=subprocess_env(), cwd=tmp_path, capture_output=True, text=True
    )
    assert failed.returncode != 0
    assert "File too large" in failed.stderr + failed.stdout
    assert checkpoints(out) == ["checkpoint-8"]  # no checkpoint-16 without weights

    results = run.main(args)["scratch"]
    assert checkpoints(out) == ["checkpoint-16", "checkpoint-8"]
    assert results.epochs == 2.0 and results.train.steps == 8  # the second epoch only: resumed at step 8
    assert json.loads((out / "checkpoint-16" / "trainer_state.json").read_text())["global_step"] == 16


PAUSE_IN_SECOND_SAVE = """
import sys, time
from finetune import run
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


def test_sigint_during_a_save_leaves_no_checkpoint_and_resume_continues(tmp_path):
    out, marker = tmp_path / "out", tmp_path / "saving"
    args = [*TINY, "--num_train_epochs", "2", "--output_dir", str(out)]
    process = subprocess.Popen(
        [sys.executable, "-c", PAUSE_IN_SECOND_SAVE, str(marker), *args],
        env=subprocess_env(),
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
        assert (out / "tmp-checkpoint-16").is_dir()  # being written
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) != 0
    finally:
        process.kill()
        process.wait()
    assert checkpoints(out) == ["checkpoint-8"]
    assert not (out / "results.json").exists()

    results = run.main([*args, "--resume_from_checkpoint", "true"])["scratch"]
    assert checkpoints(out) == ["checkpoint-16", "checkpoint-8"]
    assert results.epochs == 2.0 and results.train.steps == 8


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


def test_resume_skips_an_incomplete_checkpoint_and_a_named_one_is_checked(tmp_path, caplog):
    """A `checkpoint-N` without weights (written by an older version, or damaged) is skipped by `true`, not resumed
    into a crash; a checkpoint named explicitly must be complete."""
    out = tmp_path / "out"
    for step, files in ((8, ("model.safetensors", "trainer_state.json")), (16, ("trainer_state.json",))):
        (out / f"checkpoint-{step}").mkdir(parents=True)
        for name in files:
            (out / f"checkpoint-{step}" / name).write_text("{}")
    args = parse_args([*TINY, "--output_dir", str(out), "--resume_from_checkpoint", "true"])[3]
    with caplog.at_level("WARNING"):
        assert resolve_checkpoint(out, args) == str(out / "checkpoint-8")
    assert "Skipping the incomplete checkpoint" in caplog.text and "checkpoint-16" in caplog.text
    args = parse_args([*TINY, "--output_dir", str(out), "--resume_from_checkpoint", str(out / "checkpoint-16")])[3]
    with pytest.raises(FileNotFoundError, match=r"checkpoint-16' is incomplete \(no model.safetensors\)"):
        resolve_checkpoint(out, args)
