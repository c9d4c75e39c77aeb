"""The `vit-finetune` command: installed as a console script, dispatching to each module's `main`."""

import contextlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers_runs import make_run_dir

from finetune import cli


def test_compare_subcommand_writes_the_report(tmp_path, capsys):
    run = make_run_dir(tmp_path / "a", "scratch", extras=False)
    assert cli.main(["compare", str(run), "--output", str(tmp_path / "report")]) == 0
    assert (tmp_path / "report" / "report.md").is_file()
    assert capsys.readouterr().out.strip().endswith("report.md")


def test_the_tools_take_paths_from_the_home_folder_as_training_does(tmp_path, monkeypatch, capsys):
    """A quoted `~/...` (a script's, a config's): training expands it, and predict said "Repo id must be in the form
    'repo_name'", card "holds no trained model", compare "is not a run directory"."""
    from helpers_runs import tiny_scratch_model
    from PIL import Image

    monkeypatch.setenv("HOME", str(tmp_path))
    make_run_dir(tmp_path / "runs" / "a", "scratch", model=tiny_scratch_model(), extras=False)
    Image.new("L", (8, 8), 128).save(tmp_path / "seven.png")
    assert cli.main(["predict", "~/runs/a", "~/seven.png", "--top_k", "1", "--output", "~/out/p.csv"]) == 0
    assert (tmp_path / "out" / "p.csv").is_file()
    assert (
        cli.main(["compare", "~/runs/a", "--output", "~/report"]) == 0 and (tmp_path / "report" / "report.md").exists()
    )
    assert cli.main(["card", "~/runs/a"]) == 0 and (tmp_path / "runs" / "a" / "README.md").is_file()
    assert cli.main(["attention", "~/runs/a", "~/seven.png", "--output", "~/maps"]) == 0
    assert sorted(p.name for p in (tmp_path / "maps").iterdir()) == ["seven_attention.png", "seven_rollout.png"]
    assert "error" not in capsys.readouterr().err


def test_usage_and_unknown_command(capsys):
    assert cli.main([]) == 2
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in cli.COMMANDS)
    assert cli.main(["trian"]) == 2
    err = capsys.readouterr().err  # one line, with the closest command
    assert err.startswith("error: unknown command 'trian': did you mean `train`? the commands are train, quickstart,")
    assert err.count("\n") == 1


def test_console_script_is_installed():
    script = shutil.which("vit-finetune", path=str(Path(sys.executable).parent))
    if script is None:
        pytest.skip("the package is not installed in this environment (pip install -e .)")
    result = subprocess.run([script, "--help"], capture_output=True, text=True, check=True)
    assert "train" in result.stdout and "compare" in result.stdout


@pytest.mark.parametrize(
    "command, module",
    [("predict", "finetune.tools.predict"), ("push", "finetune.tools.hub push"), ("export", "finetune.tools.export")],
)
def test_a_commands_usage_names_it_as_it_was_typed(command, module):
    """`vit-finetune predict --help` and its errors say `vit-finetune predict`, not the module it runs."""
    for argv, prog in (
        (["finetune.cli", command], f"vit-finetune {command}"),
        (module.split(), f"python -m {module}"),
    ):
        result = subprocess.run([sys.executable, "-m", *argv, "--help"], capture_output=True, text=True, timeout=120)
        assert result.returncode == 0 and result.stdout.startswith(f"usage: {prog} "), result.stdout[:200]


def test_run_module_is_launchable_with_dash_m(tmp_path):
    """`accelerate launch -m finetune.run` and `python -m finetune.run` reach the same entry point."""
    result = subprocess.run(
        [sys.executable, "-m", "finetune.run", "--help"], capture_output=True, text=True, check=True, timeout=120
    )
    assert "--max_train_minutes" in result.stdout and "--model_type" in result.stdout


HELP_COMMANDS = {
    "python -m finetune.run": ["-m", "finetune.run", "--help"],
    "vit-finetune train": ["-m", "finetune.cli", "train", "--help"],
}


@pytest.mark.parametrize("prog", HELP_COMMANDS)
def test_help_is_short_grouped_and_imports_neither_torch_nor_transformers(prog):
    result = subprocess.run(
        [sys.executable, "-X", "importtime", *HELP_COMMANDS[prog]], capture_output=True, text=True, check=True
    )
    imported = {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in result.stderr.splitlines()}
    assert not imported & {"torch", "transformers", "datasets"}, "the help is built from the dataclasses alone"
    out = result.stdout
    assert out.startswith(f"usage: {prog} [--config FILE.yaml]")
    headings = ["--config", "model options:", "data options:", "scratch model options:", "training loop options:"]
    assert [out.index(h) for h in headings] == sorted(out.index(h) for h in headings)
    assert "--ema_decay" in out and "--help_all lists them all" in out.replace("\n", " ")
    assert len(out.splitlines()) < 300 and "--adam_beta1" not in out


def test_help_all_lists_every_option(capsys):
    from finetune.arguments import parse_options

    with pytest.raises(SystemExit) as exit_status:
        parse_options(["--help_all"])
    out = capsys.readouterr().out
    assert exit_status.value.code == 0 and "--adam_beta1" in out and "--config" in out and "--ema_decay" in out


def test_ctrl_c_while_the_command_imports_its_libraries_is_one_line(tmp_path):
    """Ctrl-C in the first seconds of `vit-finetune train`, while torch and transformers import, printed a traceback
    of their import: the command is imported inside the error handling, which says it in one line."""
    import signal
    import time

    command = [sys.executable, "-m", "finetune.cli", "train", "--dataset_name", "sklearn:digits", "--output_dir", "o"]
    for _ in range(5):  # again where the command ended before the signal (in .ci/run, beside the suite's other worker)
        # A Ctrl-C reaches a command in the foreground, where SIGINT is not ignored: not so where this suite runs as a
        # background job (`pytest ... &`), which starts with it ignored, as do the processes it starts.
        process = subprocess.Popen(
            command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )  # fmt: skip
        # While the libraries import (2-3 s): once torch's library is mapped.
        maps, deadline = Path(f"/proc/{process.pid}/maps"), time.monotonic() + 60
        with contextlib.suppress(OSError):  # the process may end while its map is read
            while process.poll() is None and "libtorch" not in maps.read_text() and time.monotonic() < deadline:
                time.sleep(0.05)
        if process.poll() is None:
            break
        process.communicate()
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    # 130, or (about one time in three when the signal lands early in the imports, though the error line shows it was
    # handled) Python ends itself by SIGINT at exit: a shell reports both as 130.
    said = f"returncode {process.returncode}, stderr:\n{err[-3000:]}"  # what CI prints, should it fail
    assert process.returncode in (130, -signal.SIGINT) and "Traceback" not in err, said
    assert err.strip().splitlines()[-1].startswith("error: interrupted (Ctrl-C)"), said


def test_predicts_help_names_every_kind_of_model_it_serves(capsys):
    """predict serves any backbone a run trains, a LoRA run and an ONNX export; its help said "a saved ScratchViT or
    ViT classifier"."""
    from finetune.tools import predict

    with pytest.raises(SystemExit):
        predict.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "ConvNeXt" in text and "ONNX export" in text and "ScratchViT or ViT" not in text
