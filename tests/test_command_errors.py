"""Every command ends an error as one line `error: ...` with exit status 1, and shows a traceback only when asked."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers_runs import make_run_dir
from PIL import Image
from transformers import ResNetConfig, ResNetForImageClassification

from finetune import cli, run
from finetune.errors import run_command


ROOT = Path(__file__).resolve().parent.parent


def failing(error: BaseException):
    def main(argv):
        raise error

    return main


def test_an_error_is_one_line_and_status_1(capsys, monkeypatch):
    monkeypatch.delenv("LOG_LEVEL", raising=False)
    assert run_command(failing(ValueError("Bad value.\nFix: another value.")), []) == 1
    assert capsys.readouterr().err == "error: Bad value. Fix: another value.\n"
    assert run_command(failing(KeyError("id2label")), []) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: KeyError: 'id2label' (unexpected; rerun with --debug") and err.count("\n") == 1
    assert run_command(failing(KeyboardInterrupt()), []) == 130
    assert run_command(lambda argv: argv, ["a"]) == 0


@pytest.mark.parametrize(
    "argv, line",
    [
        (["--ema_decay", "x"], "error: --ema_decay: invalid float value: 'x'"),
        (["--eval_strategy", "sometimes"], "error: --eval_strategy: invalid choice: 'sometimes' (choose from"),
        (["--learnig_rate", "3"], "error: Unknown option(s) on the command line: '--learnig_rate' (Did you mean"),
        (["--config"], "error: --config: expected one argument"),
    ],
)
def test_a_malformed_command_line_is_one_line_and_status_2(capsys, monkeypatch, argv, line):
    monkeypatch.delenv("LOG_LEVEL", raising=False)
    assert run_command(run.main, argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(line) and err.count("\n") == 1, err


def test_another_process_keeps_the_status_of_an_error_of_every_process_and_says_its_own(capsys, monkeypatch):
    """A process other than its machine's first (`LOCAL_RANK` 1) leaves to that one the errors every process raises
    alike (a refused command line, a signal), and still says an error of its own."""
    monkeypatch.delenv("LOG_LEVEL", raising=False)
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert run_command(run.main, ["--ema_decay", "x"]) == 2
    assert run_command(failing(KeyboardInterrupt()), []) == 130
    assert capsys.readouterr().err == ""
    assert run_command(failing(OSError("No space left on device.")), []) == 1
    said = "the disk (or quota) is full. Fix: free space on it, or write elsewhere; then rerun the same command"
    assert capsys.readouterr().err == f"error: No space left on device: {said} (files already whole are kept).\n"


@pytest.mark.parametrize("command", ["predict", "attention", "compare", "card", "export", "push"])
def test_each_tools_malformed_command_line_is_one_line_and_status_2(capsys, monkeypatch, command):
    monkeypatch.delenv("LOG_LEVEL", raising=False)
    assert cli.main([command, "a", "b", "--no_such_option", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "usage:" not in err, err


def test_a_traceback_only_when_asked(monkeypatch):
    seen = []
    with pytest.raises(ValueError, match="bad"):
        run_command(lambda argv: seen.append(argv) or failing(ValueError("bad"))(argv), ["x", "--debug"])
    assert seen == [["x"]]  # the flag is the helper's, not the command's
    assert run_command(lambda argv: seen.append(argv), ["--debug", "underflow_overflow"]) == 0
    assert seen[-1] == ["--debug", "underflow_overflow"]  # TrainingArguments' own `--debug OPTION`
    with pytest.raises(ValueError, match="bad"):
        run_command(failing(ValueError("bad")), ["--log_level", "debug"])
    monkeypatch.setenv("LOG_LEVEL", "DEBUG")
    with pytest.raises(ValueError, match="bad"):
        run_command(failing(ValueError("bad")), [])


def test_train_module_error_exit(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    env.pop("LOG_LEVEL", None)
    result = subprocess.run(
        [sys.executable, "-m", "finetune.run", "--num_train_epochs", "0", "--output_dir", str(tmp_path / "out")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith("error: Nothing to train")
    assert "Traceback" not in result.stderr and not (tmp_path / "out").exists()


def test_predict_on_a_folder_without_images_fails(tmp_path, capsys):
    model_dir = make_run_dir(tmp_path / "run", extras=False)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("not an image")
    assert cli.main(["predict", str(model_dir), str(tmp_path / "empty")]) == 1
    assert "error: No image files in" in capsys.readouterr().err
    (tmp_path / "broken.png").write_bytes(b"not a png")
    assert cli.main(["predict", str(model_dir), str(tmp_path / "broken.png")]) == 1
    assert "error: None of the 1 file(s) could be read as an image" in capsys.readouterr().err


def test_attention_on_an_unreadable_image_fails(tmp_path, capsys):
    model_dir = make_run_dir(tmp_path / "run", extras=False)
    (tmp_path / "broken.png").write_bytes(b"not a png")
    out = tmp_path / "maps"
    assert cli.main(["attention", str(model_dir), str(tmp_path / "broken.png"), "--output", str(out)]) == 1
    assert "could be read as an image; nothing was written" in capsys.readouterr().err
    assert not list(out.glob("*.png"))


def test_attention_on_a_model_without_attention(tmp_path, capsys):
    config = ResNetConfig(embedding_size=8, hidden_sizes=[8, 8], depths=[1, 1], num_labels=2)
    ResNetForImageClassification(config).save_pretrained(tmp_path / "resnet")
    make_run_dir(tmp_path / "vit", extras=False)  # for its image processor
    (tmp_path / "vit" / "preprocessor_config.json").replace(tmp_path / "resnet" / "preprocessor_config.json")
    Image.new("RGB", (16, 16)).save(tmp_path / "image.png")
    argv = ["attention", str(tmp_path / "resnet"), str(tmp_path / "image.png"), "--output", str(tmp_path / "maps")]
    assert cli.main(argv) == 1
    assert "error: ResNetForImageClassification has no attention to draw" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["attention", "compare", "export", "predict"])
@pytest.mark.parametrize("output", ["notes.txt", "notes.txt/report"])
def test_an_output_folder_where_a_file_is_fails_naming_the_file(tmp_path, capsys, command, output):
    """It was `[Errno 17] File exists` (or `[Errno 20] Not a directory`, for export after the whole export), naming
    neither the option nor the fix; the file stays as it was."""
    model_dir = make_run_dir(tmp_path / "run", extras=False)
    Image.new("RGB", (16, 16)).save(tmp_path / "image.png")
    (tmp_path / "notes.txt").write_text("keep me")
    capsys.readouterr()  # the setup's progress bars
    if command == "predict":  # its --output is a file: only a file on its way is in the way
        output = output.replace("/report", "/out.csv") if "/" in output else "notes.txt/out.csv"
    argv = [command, str(model_dir), *([str(tmp_path / "image.png")] if command in ("attention", "predict") else [])]
    argv += ["--format", "onnx"] if command == "export" else []
    assert cli.main([*argv, "--output", str(tmp_path / output)]) == 1
    err = capsys.readouterr().err
    file = tmp_path / "notes.txt"
    assert err.startswith(f"error: --output '{tmp_path / output}': {file} is a file, not a folder. Fix:"), err
    assert err.count("\n") == 1
    assert (tmp_path / "notes.txt").read_text() == "keep me"


IN_THE_WAY = "--output 'notes.txt': notes.txt is a file, not a folder. Fix:"


@pytest.mark.parametrize(
    "script, argv, line",
    [
        ("train_budget.py", "--config c.yaml --minutes 1 --output notes.txt", IN_THE_WAY),
        ("sweep.py", "--config c.yaml --variant a --output notes.txt", IN_THE_WAY),
        ("lr_sweep.py", "--output notes.txt", IN_THE_WAY),
        ("batch_scaling.py", "--output notes.txt", IN_THE_WAY),
        ("finetune_methods.py", "vit_b16 --output notes.txt", IN_THE_WAY),
        ("interrupt.py", "--output notes.txt", IN_THE_WAY),
        ("distillation.py", "--teacher teacher --runs notes.txt --output notes.txt", IN_THE_WAY),
        ("gpu_sweep.py", "--output notes.txt", IN_THE_WAY),
        ("decoded_cache.py", "--output notes.txt/cache.json", "--output 'notes.txt/cache.json': notes.txt is a file"),
        ("data_pipeline.py", "--output notes.txt/pipeline.json", "--output 'notes.txt/pipeline.json': notes.txt is"),
        ("photo_cache.py", "--output notes.txt/photos.json", "--output 'notes.txt/photos.json': notes.txt is a file"),
        ("model_speed.py", "--preset tiny --repeats 1 --steps 1 --output teacher", "--output 'teacher' is a folder"),
        ("precision.py", "--repeats 1 --steps 1 --output teacher", "--output 'teacher' is a folder, not a file"),
        (
            "ema_update.py",
            "--models scratch --repeats 1 --output teacher",
            "--output 'teacher' is a folder, not a file",
        ),
        ("startup.py", "--samples 1 --settle 0.01 --timeout 1", "outputs/quickstart/digits/3/00.png, outputs/"),
        # A missing --data: datasets' error without the fix, or (the GPU suite) every part failing after the peak.
        ("data_pipeline.py", "--data missing.parquet --output out/p.json", "--data missing.parquet is not a file."),
        ("gpu_suite.py", "--data missing.parquet --output out", "--data missing.parquet is not a file. Fix:"),
    ],
)
def test_a_benchmark_refuses_what_it_cannot_use_in_one_line_before_measuring(tmp_path, script, argv, line):
    """A file where --output's folder goes (or a folder where its file goes), or the quickstart not run: the
    measurements were made first, then lost to a traceback."""
    done = run_benchmark(tmp_path, script, argv)
    assert done.returncode == 1 and done.stderr.startswith(f"error: {line}"), done.stderr
    assert done.stderr.count("\n") == 1 and (tmp_path / "notes.txt").read_text() == "keep me"
    assert not (tmp_path / "out").exists()


PHOTOS_JSON = "--output notes.txt/photos.json"
DISTILL = "--teacher teacher --runs notes.txt --output out"


@pytest.mark.parametrize(
    "script, argv, line",
    [
        # Each with a folder in the way too (--output, distillation's --runs): the option is refused first; unchecked,
        # it failed there, fast (distillation's taught runs: after the students alone had trained, minutes).
        ("photo_cache.py", f"--batch_size 0 {PHOTOS_JSON}", "--batch_size must be >= 1, got 0"),
        ("photo_cache.py", f"--batch_size -4 {PHOTOS_JSON}", "--batch_size must be >= 1, got -4"),
        ("photo_cache.py", f"--steps 0 {PHOTOS_JSON}", "--steps must be >= 1, got 0"),
        ("photo_cache.py", f"--num_images 0 {PHOTOS_JSON}", "--num_images must be >= 1, got 0"),
        ("photo_cache.py", f"--num_classes 0 {PHOTOS_JSON}", "--num_classes must be >= 1, got 0"),
        ("photo_cache.py", f"--decode_workers 0 {PHOTOS_JSON}", "--decode_workers must be >= 1, got 0"),
        ("photo_cache.py", f"--image_size 100 {PHOTOS_JSON}", "--image_size must be a multiple of 32 (the model's"),
        ("gpu_sweep.py", "--parallel 0 --output notes.txt", "--parallel must be >= 1 (leave it out to run every"),
        ("gpu_sweep.py", "--parallel -1 --output notes.txt", "--parallel must be >= 1 (leave it out to run every"),
        ("distillation.py", f"{DISTILL} --seeds 42 x", "--seeds: invalid int value: 'x'"),
        ("distillation.py", f"{DISTILL} --distillation_temperature x", "--distillation_temperature: invalid float"),
        ("distillation.py", f"{DISTILL} --seeds 1 2 --no_such 1", "Unknown option(s) on the command line: '--no_"),
    ],
)
def test_a_benchmark_refuses_a_meaningless_option_in_one_line_and_status_2(tmp_path, script, argv, line):
    """An option the measurement cannot use: it measured anyway (`photo_cache.py --batch_size 0` printed a table of
    0 images/s and exited 0, `gpu_sweep.py --parallel 0` ran every variant at once) or failed late (a distillation
    option of the taught runs, after the students alone had trained). Refused as a malformed command line, before
    anything is made, --output too."""
    done = run_benchmark(tmp_path, script, argv)
    assert done.returncode == 2 and done.stderr.startswith(f"error: {line}"), done.stderr
    assert done.stderr.count("\n") == 1 and (tmp_path / "notes.txt").read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "teacher"]


def run_benchmark(tmp_path: Path, script: str, argv: str) -> subprocess.CompletedProcess:
    """`benchmarks/SCRIPT ARGV` in `tmp_path`, beside a file `notes.txt` and a quickstart teacher `teacher/`."""
    (tmp_path / "notes.txt").write_text("keep me")
    (tmp_path / "teacher").mkdir()
    (tmp_path / "teacher" / "results.json").write_text("{}")
    command = [sys.executable, str(ROOT / "benchmarks" / script), *argv.split()]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    env.pop("LOG_LEVEL", None)  # `debug` would add the traceback
    return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_a_failed_distillation_run_is_named(tmp_path):
    """Its line was the run's own (here: a teacher folder that is not a saved model), naming neither the student
    (alone or taught, which seed) nor its folder. (A malformed option is refused before any run: the test above.)"""
    alone = tmp_path / "runs" / "scratch_alone"  # trained already: a rerun with other options for the taught runs
    alone.mkdir(parents=True)
    (alone / "results.json").write_text("{}")
    argv = ["--seed", "42", "--data_seed", "42", "--report_to", "none", "--teacher_model_name_or_path", "null"]
    (alone / "benchmark_argv.json").write_text(json.dumps(argv))
    done = run_benchmark(tmp_path, "distillation.py", "--teacher teacher --runs runs --output out")
    assert done.returncode == 1 and done.stderr.count("error:") == 1, done.stderr
    assert done.stderr.splitlines()[-1].startswith(
        "error: The taught student of seed 42 (runs/scratch_taught) failed: teacher has no config.json: it is not a "
        "saved model."
    )


def test_a_predictions_file_where_a_folder_is_fails_before_predicting(tmp_path, capsys):
    """It failed after printing every prediction, with "[Errno 21] Is a directory"."""
    model_dir = make_run_dir(tmp_path / "run", extras=False)
    Image.new("RGB", (16, 16)).save(tmp_path / "image.png")
    (tmp_path / "out.csv").mkdir()
    capsys.readouterr()
    output = tmp_path / "out.csv"
    assert cli.main(["predict", str(model_dir), str(tmp_path / "image.png"), "--output", str(output)]) == 1
    out, err = capsys.readouterr()
    assert err == f"error: --output '{output}' is a folder, not a file. Fix: a file name in it, or another path.\n"
    assert "image.png" not in out


def test_an_optimizer_whose_package_is_missing_fails_at_start_up(tmp_path, capsys):
    """bitsandbytes' 8-bit AdamW without bitsandbytes stopped only once the data was loaded and the model built, as an
    'unexpected' ImportError; now at start-up, in one line with the fix, before the output folder is made."""
    import importlib.util

    from test_run import TINY_SCRATCH

    if importlib.util.find_spec("bitsandbytes"):
        pytest.skip("bitsandbytes is installed here")
    argv = [*TINY_SCRATCH, "--optim", "adamw_bnb_8bit", "--output_dir", str(tmp_path / "run"), "--report_to", "none"]
    assert run_command(run.main, argv) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: `optim: adamw_bnb_8bit`: You need to install `bitsandbytes`"), err
    assert err.endswith("Or choose another `optim` (the default: adamw_torch_fused).")
    assert "unexpected" not in err and not (tmp_path / "run").exists()


PUSH_RUN = ["--model_type", "scratch", "--image_size", "8", "--patch_size", "2", "--hidden_size", "8",
            "--num_hidden_layers", "1", "--num_attention_heads", "2", "--num_train_epochs", "1",
            "--dataset_name", "sklearn:digits", "--max_train_samples", "32", "--max_eval_samples", "16",
            "--decoded_cache_dir", "none", "--push_to_hub", "true"]  # fmt: skip


@pytest.mark.parametrize(
    "hub, offline, expected",
    [
        (["--hub_model_id", "me/vit-digits", "--hub_token", "not-a-real-token"], True, "with HF_HUB_OFFLINE=1 set"),
        (["--hub_model_id", "me/vit-digits"], False, "needs a Hub token with write access: set HF_TOKEN"),
        (["--hub_model_id", "me/vit digits", "--hub_token", "t"], False, "`hub_model_id: me/vit digits` is not a Hub"),
    ],
)
def test_a_push_that_cannot_succeed_is_refused_before_training(tmp_path, capsys, monkeypatch, hub, offline, expected):
    """Offline, without a token or to an invalid repo id, the push would fail only once training had ended."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE"):  # no token from the environment
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no_token"))  # no stored login either
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(tmp_path / "no_tokens"))
    out = tmp_path / "out"
    assert run_command(run.main, [*PUSH_RUN, "--output_dir", str(out), *hub]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: `") and expected in err and "Nothing was trained" in err, err
    assert "not-a-real-token" not in err and not out.exists()


def test_a_failed_push_after_training_is_one_line_and_keeps_the_model(tmp_path, capsys, monkeypatch):
    """A Hub that cannot be reached fails the push after training: the error names the retry command and the trained
    model stays."""
    from huggingface_hub import constants

    from finetune.tools import hub

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing listens
    monkeypatch.setattr(hub, "RETRY_WAIT_SECONDS", 0.01)
    out = tmp_path / "out"
    argv = [*PUSH_RUN, "--output_dir", str(out), "--hub_model_id", "me/vit-digits", "--hub_token", "not-a-real-token"]
    assert run_command(run.main, argv) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: Pushing ") and "is still in place" in err and "Retry with: " in err, err
    assert "not-a-real-token" not in err
    assert (out / "model.safetensors").is_file() and (out / "results.json").is_file()


def test_both_models_repo_ids_are_checked_before_training(tmp_path, capsys, monkeypatch):
    """`model_type: both` pushes to hub_model_id-pretrained and -scratch: a suffixed id over the Hub's 96 characters
    failed only after both trainings."""
    from huggingface_hub import constants
    from test_run import tiny_vit_checkpoint

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    base = tiny_vit_checkpoint(tmp_path / "base", num_labels=10)
    repo_id = "me/" + "v" * 90  # valid alone
    out = tmp_path / "out"
    argv = [*PUSH_RUN, "--model_type", "both", "--model_name_or_path", str(base), "--output_dir", str(out),
            "--hub_model_id", repo_id, "--hub_token", "t"]  # fmt: skip
    assert run_command(run.main, argv) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"error: `hub_model_id: {repo_id}-pretrained` is not a Hub repo id"), err
    assert not (out / "pretrained").exists()
