"""`export`: a trained run becomes an ONNX model whose onnxruntime logits equal PyTorch's on real images; the run's
folder without weights, a missing extra and an unfaithful export each end in one line."""

import copy
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from test_backbones import BACKBONES, case, checkpoint
from test_run import TINY_SCRATCH, tiny_vit_checkpoint
from transformers import AutoModelForImageClassification

from finetune import run
from finetune.errors import run_command
from finetune.tools import attention, export, predict
from finetune.tools.compare import write_comparison


pytest.importorskip("onnxruntime", reason='the export extra is missing: pip install -e ".[export]"')
ROOT = Path(__file__).resolve().parent.parent
SHORT = ["--max_steps", "2", "--num_train_epochs", "1", "--report_to", "none"]


@pytest.fixture(scope="module")
def scratch_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("export") / "scratch"
    run.main([*TINY_SCRATCH, *SHORT, "--output_dir", str(out)])
    return out


@pytest.fixture(scope="module")
def vit_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("export")
    args = [a if a != "scratch" else "pretrained" for a in TINY_SCRATCH]
    base = tiny_vit_checkpoint(root / "base", num_channels=3)
    run.main([*args, *SHORT, "--model_name_or_path", str(base), "--output_dir", str(root / "vit")])
    return root / "vit"


def digit_files(folder: Path, count: int = 3) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    paths = [folder / f"digit{i}.png" for i in range(count)]
    for path in paths:
        Image.fromarray(rng.integers(0, 256, (13, 11), dtype=np.uint8), "L").save(path)
    return paths


def test_scratch_run_exports_and_serves_as_predict_classifies(scratch_run, tmp_path, capsys):
    result = export.main([str(scratch_run), "--format", "onnx"])

    assert result.path == scratch_run / "onnx" / "model.onnx" and result.path.is_file()
    assert result.num_images == export.CHECK_IMAGES and result.max_abs_difference <= export.DEFAULT_ATOL
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith(f"Checked on {export.CHECK_IMAGES} image(s) of the run's dataset") and "max abs" in line
    # Served from the export folder alone by `predict`: onnxruntime, the folder's processor and labels, the
    # probabilities predict gives from the run's weights, and neither transformers nor torchvision imported.
    files = digit_files(tmp_path / "images")
    [expected] = predict.main([str(scratch_run), str(files[0])])
    assert not list(result.path.parent.glob("*.safetensors"))
    code = (
        "import json, sys\n"
        "from finetune.tools import predict\n"
        "[p] = predict.main(sys.argv[1:])\n"
        "print(json.dumps([p.probabilities, sorted({m.split('.')[0] for m in sys.modules})]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", code, str(result.path.parent), str(files[0])], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr
    probabilities, modules = json.loads(done.stdout.splitlines()[-1])
    np.testing.assert_allclose(probabilities, expected.probabilities, atol=1e-5)
    assert "onnxruntime" in modules and not {"transformers", "torchvision", "scratch_vit"} & set(modules)
    # The export runs at its resolution only, in one line; without onnxruntime the line names the install command.
    assert run_command(predict.main, [str(result.path.parent), str(files[0]), "--image_size", "16"]) == 1
    assert "runs at the resolution it was exported at (8x8)" in capsys.readouterr().err
    code = (
        "import sys\nsys.modules['onnxruntime'] = None  # as if the extra were not installed\n"
        "from finetune.errors import run_command\nfrom finetune.tools import predict\n"
        "sys.exit(run_command(predict.main))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(result.path.parent), str(files[0])], capture_output=True, text=True, env=env
    )
    assert done.returncode == 1 and done.stderr.strip().splitlines()[-1] == (
        f'error: {result.path.parent} is an ONNX export; running it needs onnxruntime: pip install -e ".[export]"'
    )
    # What needs the PyTorch model says so in one line.
    assert run_command(attention.main, [str(result.path.parent), str(files[0]), "--output", str(tmp_path)]) == 1
    [line] = capsys.readouterr().err.strip().splitlines()[-1:]
    assert line.startswith("error: ") and "is an ONNX export" in line and "run's output directory" in line


def test_a_checkpoint_exports_checked_on_its_runs_dataset(scratch_run, tmp_path, capsys):
    """A checkpoint-* has no results.json: the run folder around it names the dataset, as for predict."""
    [checkpoint_dir] = scratch_run.glob("checkpoint-*")
    result = export.main([str(checkpoint_dir), "--format", "onnx", "--output", str(tmp_path / "onnx")])
    assert result.num_images == export.CHECK_IMAGES and result.max_abs_difference <= export.DEFAULT_ATOL
    assert "image(s) of the run's dataset" in capsys.readouterr().out
    # The run's results.json goes with the export, as from the run folder, so predict on the export reads how the run
    # stored its images (a whole non-square frame) and a multi-label run's thresholds; not its figures, which are the
    # kept model's, not this checkpoint's (a card or `compare` of the export would claim them).
    trained, exported = (json.loads((d / "results.json").read_text()) for d in (scratch_run, tmp_path / "onnx"))
    assert exported["stored_image_size"] == trained["stored_image_size"]
    assert exported["label_names"] == trained["label_names"]
    assert trained["validation"] and trained["history"] and trained["per_class_accuracy"] and trained["train"]["loss"]
    assert exported["validation"] is exported["test"] is None and not exported["history"]
    assert not exported["per_class_accuracy"] and not exported["confusion_matrix"]
    assert exported["train"]["loss"] is None
    with pytest.raises(ValueError, match=r"onnx: no figures to compare \(the export of a checkpoint\)"):
        write_comparison([scratch_run, tmp_path / "onnx"], tmp_path / "comparison")
    # A rerun replaces this export of the same model, in its default folder too; another checkpoint's is refused.
    run_dir = Path(shutil.copytree(scratch_run, tmp_path / "run", ignore=shutil.ignore_patterns("onnx")))
    checkpoint_dir = run_dir / checkpoint_dir.name
    for output in (["--output", str(tmp_path / "onnx")], []):
        for _ in range(2):
            assert export.main([str(checkpoint_dir), "--format", "onnx", *output]).path.is_file()
    # By default beside the checkpoint, not in it: a resumed run deletes checkpoints it rotates out with all in them.
    assert (run_dir / f"onnx-{checkpoint_dir.name}" / "model.onnx").is_file()
    assert not (checkpoint_dir / "onnx").exists()
    other = shutil.copytree(checkpoint_dir, run_dir / "checkpoint-1", ignore=shutil.ignore_patterns("onnx"))
    assert run_command(export.main, [str(other), "--format", "onnx", "--output", str(tmp_path / "onnx")]) == 1
    assert "already holds" in capsys.readouterr().err


def test_a_run_of_a_local_dataset_named_relatively_is_not_checked_on_a_hub_dataset(tmp_path, monkeypatch):
    """Trained on `digits` (a folder, named from where the run ran): exported from elsewhere, the name was looked up
    on the Hub (where another dataset of that name would have checked the export)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    for i in range(60):
        (tmp_path / "a" / "digits" / str(digits.target[i] % 3)).mkdir(parents=True, exist_ok=True)
        Image.fromarray((digits.images[i] * 15).astype(np.uint8)).save(
            tmp_path / "a" / "digits" / str(digits.target[i] % 3) / f"{i}.png"
        )
    monkeypatch.chdir(tmp_path / "a")
    args = ["digits" if a == "sklearn:digits" else a for a in TINY_SCRATCH]
    run.main([*args, *SHORT, "--output_dir", "run"])
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"^The run trained on the local dataset 'digits', which is not at"):
        export.main([str(tmp_path / "a" / "run"), "--format", "onnx"])
    monkeypatch.chdir(tmp_path / "a")
    assert export.main(["run", "--format", "onnx"]).num_images > 0


def test_vit_run_exports_to_the_output_checked_on_given_files(vit_run, tmp_path, capsys):
    files = digit_files(tmp_path / "images")
    out = tmp_path / "served"
    (tmp_path / "tmp-served").mkdir()  # a folder of the user's: the export's scratch folder had this name, and
    (tmp_path / "tmp-served" / "notes.txt").write_text("mine")  # deleted it
    result = export.main([str(vit_run), "--format", "onnx", "--output", str(out), "--images", str(files[0].parent)])
    assert (tmp_path / "tmp-served" / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["images", "served", "tmp-served"]  # no scratch folder left

    assert result.path == out / "model.onnx" and {p.name for p in out.iterdir()} >= {
        "model.onnx",
        "config.json",
        "preprocessor_config.json",
    }
    assert result.num_images == 3 and result.max_abs_difference <= 1e-4
    assert "image(s) of the given files" in capsys.readouterr().out
    # Any batch size: the graph was traced on 3 images and serves 1 and 5.
    for batch in (1, 5):
        pixels = torch.randn(batch, 3, 8, 8, generator=torch.Generator().manual_seed(batch))
        assert predict.OnnxClassifier(result.path.parent)(pixels).logits.shape == (batch, 10)


@pytest.mark.parametrize("name", [case(name) for name in BACKBONES])
def test_every_backbone_exports_faithfully(name, tmp_path):
    files = digit_files(tmp_path / "images", count=2)
    base = checkpoint(tmp_path, name)
    result = export.main([str(base), "--format", "onnx", "--images", *map(str, files)])
    assert result.path.is_file() and result.num_images == 2 and result.max_abs_difference <= 1e-4
    # `predict` serves the export (its labels read from the exported config) as it serves the model's folder.
    served, expected = (predict.main([str(folder), *map(str, files)]) for folder in (result.path.parent, base))
    assert [p.labels for p in served] == [p.labels for p in expected]
    assert [p.probabilities for p in served] == [pytest.approx(p.probabilities, abs=1e-4) for p in expected]


def test_an_export_that_computes_other_logits_fails_the_check(scratch_run):
    onnx = scratch_run / "onnx" / "model.onnx"
    if not onnx.is_file():
        export.main([str(scratch_run), "--format", "onnx"])
    model = AutoModelForImageClassification.from_pretrained(scratch_run).eval()
    pixels = torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    assert export.check_onnx(onnx, model, pixels, atol=1e-4) <= 1e-4
    with torch.no_grad():
        model.classifier[-1].bias += 1e-3  # the served graph no longer matches the model
    with pytest.raises(ValueError, match="does not compute the model's logits: .* up to 0.001 .* atol 0.0001"):
        export.check_onnx(onnx, model, pixels, atol=1e-4)


def test_an_export_that_fails_its_check_leaves_nothing_to_serve(scratch_run, tmp_path, monkeypatch):
    """An exporter that gets the model wrong: the command fails, and no model.onnx is left where predict would serve
    it (one was, with exit 0)."""
    write = export.export_onnx

    def unfaithful(model, example, path):
        model = copy.deepcopy(model)
        with torch.no_grad():
            model.classifier[-1].bias += 1e-3
        return write(model, example, path)

    monkeypatch.setattr(export, "export_onnx", unfaithful)
    with pytest.raises(ValueError, match="does not compute the model's logits: .* up to 0.001 .* atol 0.0001"):
        export.main([str(scratch_run), "--format", "onnx", "--output", str(tmp_path / "onnx")])
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("atol", ["nan", "-1", "inf"])
def test_an_atol_no_difference_can_be_within_is_a_usage_error(scratch_run, capsys, atol):
    """`--atol nan` failed every export with "differs by up to 8.34e-07 ..., more than atol nan"."""
    assert run_command(export.main, [str(scratch_run), "--format", "onnx", "--atol", atol]) == 2
    assert f"--atol must be a finite number >= 0 (e.g. 0.0001), got {float(atol):g}." in capsys.readouterr().err


def test_a_run_without_weights_is_one_line(scratch_run, tmp_path, capsys):
    broken = tmp_path / "broken"
    shutil.copytree(scratch_run, broken, ignore=shutil.ignore_patterns("*.safetensors", "checkpoint-*", "onnx"))
    assert run_command(export.main, [str(broken), "--format", "onnx"]) == 1
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: {broken} holds a config.json but no weights") and "Pass a complete" in line
    assert not (broken / "onnx").exists()


def test_a_missing_extra_names_the_install_command(scratch_run, tmp_path):
    code = (
        "import runpy, sys\n"
        "sys.modules['onnxruntime'] = None  # as if the extra were not installed\n"
        "sys.argv = ['export', sys.argv[1], '--format', 'onnx']\n"
        "runpy.run_module('finetune.tools.export', run_name='__main__')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", code, str(scratch_run)], capture_output=True, text=True, env=env)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        'error: Exporting needs onnxruntime (the `export` extra): pip install -e ".[export]"'
    )


def test_an_output_that_holds_another_model_is_refused_and_left_as_it_was(scratch_run, vit_run, tmp_path, capsys):
    other = tmp_path / "other"
    shutil.copytree(scratch_run, other, ignore=shutil.ignore_patterns("checkpoint-*", "onnx"))
    before = {p.name: p.read_bytes() for p in other.iterdir() if p.is_file()}
    assert run_command(export.main, [str(vit_run), "--format", "onnx", "--output", str(other)]) == 1
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: {other} already holds") and "config.json" in line and "another folder" in line
    assert {p.name: p.read_bytes() for p in other.iterdir() if p.is_file()} == before
    # Another run's export is not this run's either; an earlier export of this same run is replaced.
    export.main([str(scratch_run), "--format", "onnx"])
    assert run_command(export.main, [str(vit_run), "--format", "onnx", "--output", str(scratch_run / "onnx")]) == 1
    assert "already holds" in capsys.readouterr().err
    served = tmp_path / "served"
    for _ in range(2):
        assert export.main([str(vit_run), "--format", "onnx", "--output", str(served)]).path.is_file()
    assert export.main([str(scratch_run), "--format", "onnx"]).path == scratch_run / "onnx" / "model.onnx"


@pytest.mark.slow
def test_an_interrupted_export_leaves_no_half_folder_and_its_rerun_exports(scratch_run, tmp_path):
    """Ctrl-C once model.onnx is written, before the files beside it: nothing appears that a rerun would refuse as
    another model's export, or that predict would fail on."""
    run_dir = tmp_path / "run"
    shutil.copytree(scratch_run, run_dir, ignore=shutil.ignore_patterns("onnx"))
    before = sorted(p.name for p in run_dir.iterdir())
    code = (
        "import os, signal, sys\n"
        "from finetune.errors import run_command\nfrom finetune.tools import export\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal, whatever the test runner set\n"
        "write = export.export_onnx\n"
        "def interrupted(*args):\n"
        "    path = write(*args)\n    os.kill(os.getpid(), signal.SIGINT)\n    return path\n"
        "export.export_onnx = interrupted\n"
        "sys.exit(run_command(export.main))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", code, str(run_dir), "--format", "onnx"], capture_output=True, text=True, env=env
    )
    assert done.returncode == 128 + signal.SIGINT, done.stderr
    assert sorted(p.name for p in run_dir.iterdir()) == before
    # An export killed outright (SIGKILL) leaves its folder: removed by the next, unless its process still runs.
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    host = socket.gethostname()
    (run_dir / f".onnx.export-{host}-{int(dead.stdout)}").mkdir()
    (run_dir / f".onnx.export-{host}-1").mkdir()  # pid 1 runs
    assert export.main([str(run_dir), "--format", "onnx"]).path == run_dir / "onnx" / "model.onnx"
    assert sorted(p.name for p in run_dir.iterdir()) == sorted([*before, "onnx", f".onnx.export-{host}-1"])
    assert predict.main([str(run_dir / "onnx"), str(digit_files(tmp_path / "images", count=1)[0])])


def test_an_export_folder_is_refused_where_the_pytorch_weights_are_needed(scratch_run, tmp_path):
    onnx = export.main([str(scratch_run), "--format", "onnx", "--output", str(tmp_path / "onnx")]).path.parent
    pretrained = [a if a != "scratch" else "pretrained" for a in TINY_SCRATCH]
    for args in (
        [*TINY_SCRATCH, "--teacher_model_name_or_path", str(onnx)],
        [*pretrained, "--model_name_or_path", str(onnx)],
        [*pretrained, "--model_name_or_path", str(onnx), "--do_train", "false"],
    ):
        with pytest.raises(ValueError, match=f"{onnx} is an ONNX export.*the run's output directory it was exported"):
            run.main([*args, *SHORT, "--output_dir", str(tmp_path / "run")])
