"""Comparison report: tables hold the results.json numbers, plots are written and readable, history falls back to
trainer_state.json."""

import json
import os
import re

import numpy as np
import pytest
from helpers_runs import make_run_dir, run_trained_on_photos, tiny_scratch_model
from PIL import Image

from finetune.results import Results, find_run_dirs, history_from_log_history
from finetune.tools import compare
from finetune.tools import report as report_module


TEN_LABELS = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


@pytest.fixture(scope="module")
def both_output(tmp_path_factory):
    """A `model_type: both` output: pretrained/ (with history) and scratch/ (history only in trainer_state.json,
    10 classes, no test split)."""
    root = tmp_path_factory.mktemp("both")
    make_run_dir(root / "pretrained", "pretrained", validation_accuracy=0.9134, test_accuracy=0.9021, seed=1)
    make_run_dir(
        root / "scratch",
        "scratch",
        model=tiny_scratch_model(labels=TEN_LABELS),
        validation_accuracy=0.6245,
        test_accuracy=None,
        seed=2,
        with_history=False,
    )
    return root


@pytest.fixture(scope="module")
def report(both_output):
    return compare.write_comparison([both_output], both_output / "comparison")


def parse_table(markdown: str, first_header: str) -> list[dict[str, str]]:
    """The rows of the Markdown table whose header starts with `| first_header |`, as dicts by column name."""
    lines = markdown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_header} |"))
    headers = [c.strip() for c in lines[start].strip("|").split("|")]
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(headers, (c.strip() for c in line.strip("|").split("|")))))
    return rows


def percent(cell: str) -> float:
    return float(cell.rstrip("%")) / 100


def test_report_files_exist_and_pngs_are_readable(report, both_output):
    out = both_output / "comparison"
    assert report == out / "report.md"
    for name in ("learning_curves.png", "confusion_matrix_pretrained.png", "confusion_matrix_scratch.png"):
        with Image.open(out / name) as image:
            image.load()
            assert image.format == "PNG"
            assert image.width >= 400 and image.height >= 300
    with Image.open(out / "learning_curves.png") as image:
        assert image.width > 2 * image.height * 0.9  # two panels side by side
    text = report.read_text()
    for name in ("learning_curves.png", "confusion_matrix_pretrained.png", "confusion_matrix_scratch.png"):
        assert f"]({name})" in text


def test_summary_table_equals_results(report, both_output):
    rows = {row["Run"]: row for row in parse_table(report.read_text(), "Run")}
    assert set(rows) == {"pretrained", "scratch"}
    for name in rows:
        results = json.loads((both_output / name / "results.json").read_text())
        row = rows[name]
        assert percent(row["Validation accuracy"]) == pytest.approx(results["validation"]["accuracy"], abs=5e-5)
        if results["test"] is None:
            assert row["Test accuracy"] == report_module.MISSING
        else:
            assert percent(row["Test accuracy"]) == pytest.approx(results["test"]["accuracy"], abs=5e-5)
        assert row["Architecture"] == f"`{results['architecture']}`"
        assert row["Parameters"] == report_module.format_count(results["num_parameters"])
        assert float(row["Epochs"]) == results["epochs"]
        images_per_second = results["train"]["images_per_second"]
        assert float(row["Images/s"].replace(",", "")) == pytest.approx(images_per_second, abs=0.05)
        assert row["Training time"] == report_module.format_duration(results["train"]["seconds"])
        assert row["Dataset"] == f"`{results['dataset']}`"
    assert rows["pretrained"]["Initialisation"] == "pretrained (`google/vit-base-patch16-224-in21k`)"
    assert rows["scratch"]["Initialisation"] == "scratch"


def test_per_class_table_equals_results(report, both_output):
    rows = parse_table(report.read_text(), "Class")
    pretrained = json.loads((both_output / "pretrained" / "results.json").read_text())
    scratch = json.loads((both_output / "scratch" / "results.json").read_text())
    assert [row["Class"] for row in rows] == TEN_LABELS  # union of both runs' classes, in label order
    by_class = {row["Class"]: row for row in rows}
    for label, accuracy in pretrained["per_class_accuracy"].items():
        assert percent(by_class[label]["pretrained (test)"]) == pytest.approx(accuracy, abs=5e-5)
    for label, accuracy in scratch["per_class_accuracy"].items():
        assert percent(by_class[label]["scratch (validation)"]) == pytest.approx(accuracy, abs=5e-5)
    assert by_class["truck"]["pretrained (test)"] == report_module.MISSING


def test_history_falls_back_to_trainer_state(both_output):
    run = Results.load(both_output / "scratch")
    state = json.loads((both_output / "scratch" / "trainer_state.json").read_text())
    evals = [e for e in state["log_history"] if "eval_accuracy" in e]
    assert [h.eval_accuracy for h in run.history] == [e["eval_accuracy"] for e in evals]
    assert [h.epoch for h in run.history] == [e["epoch"] for e in evals]
    # the training loss of a row is the last one logged before that evaluation
    assert run.history[0].train_loss == state["log_history"][0]["loss"]


def test_learning_curve_draws_only_logged_training_losses():
    """A short run logs its training loss once (step 50) and evaluates at epochs 17-20: the loss is one point of the
    curve, not repeated as a flat line across the later evaluations."""
    log = [{"loss": 0.7, "step": 50, "epoch": 16.7}]
    log += [{"eval_loss": 0.5, "eval_accuracy": 0.8, "epoch": float(e), "step": 3 * e} for e in range(17, 21)]
    history = history_from_log_history(log)
    assert [h.train_loss for h in history] == [0.7, None, None, None]
    assert [h.eval_loss for h in history] == [0.5] * 4
    # Drawn where it was logged, not at the evaluation that followed; the validation figures at their evaluations.
    assert report_module._series(history, "train_loss") == ((16.7,), (0.7,))
    assert report_module._series(history, "eval_loss") == ((17.0, 18.0, 19.0, 20.0), (0.5,) * 4)


def test_a_taught_runs_training_loss_is_named_as_distillation(both_output, tmp_path, monkeypatch):
    """A taught run's training loss mixes in the loss on the teacher's logits: drawn as "train" beside the validation
    cross-entropy, it read as the same loss, far below it."""
    from matplotlib.figure import Figure

    drawn = []
    monkeypatch.setattr(Figure, "savefig", lambda figure, *args, **kwargs: drawn.append(figure))
    alone, taught = Results.load(both_output / "pretrained"), Results.load(both_output / "pretrained")
    taught.hyperparameters["teacher_model_name_or_path"] = "runs/teacher"
    report_module.plot_learning_curves([alone, taught], ["alone", "taught"], tmp_path / "curves.png")
    legend = [text.get_text() for text in drawn[0].axes[0].get_legend().get_texts()]
    assert legend == ["alone train", "alone validation", "taught train (with distillation)", "taught validation"]


def test_summary_json_for_the_model_card(report, both_output):
    summary = json.loads((both_output / "comparison" / "comparison.json").read_text())
    assert [row["run_dir"] for row in summary["runs"]] == ["pretrained", "scratch"]
    assert report_module.summary_table(summary["runs"]) in report.read_text()


def test_class_names_no_font_has_are_said_once_and_other_fonts_fill_in(tmp_path, monkeypatch, caplog):
    """A class name in a script DejaVu Sans lacks: matplotlib warned twice per character and drew boxes. An installed
    font of that script fills in (here matplotlib's own STIX font, which has the mathematical letter 𝑨); a
    character no font has (鳥) is said in one line."""
    import warnings

    monkeypatch.setattr(report_module, "FALLBACK_FONTS", ("STIXGeneral",))
    with warnings.catch_warnings(), caplog.at_level("WARNING"):
        warnings.simplefilter("error")
        report_module.plot_confusion_matrix([[1, 0], [0, 1]], ["𝑨", "cat"], "t", tmp_path / "stix.png")
        assert not caplog.records  # drawn with STIX's glyph
        report_module.plot_confusion_matrix([[1, 0], [1, 1]], ["鳥", "𝑨"], "t", tmp_path / "bird.png")
        monkeypatch.setattr(report_module, "FALLBACK_FONTS", ())
        report_module.plot_learning_curves([], [], tmp_path / "none.png")
        report_module.plot_confusion_matrix([[1, 0], [0, 1]], ["𝑨", "cat"], "t", tmp_path / "boxes.png")
    assert [r.getMessage().split(" (in")[0] for r in caplog.records] == [
        "No installed font has 鳥",
        "No installed font has 𝑨",
    ]
    assert "Install a font of their script (e.g. Noto Sans CJK)" in caplog.records[0].getMessage()
    assert Image.open(tmp_path / "bird.png").size[0] > 100

    @report_module._plot_fonts()
    def plot_that_warns():
        warnings.warn("another warning", DeprecationWarning, stacklevel=1)

    with pytest.warns(DeprecationWarning, match="another warning"):  # other warnings go on as they were
        plot_that_warns()


def test_a_report_of_the_users_is_never_replaced(tmp_path, both_output):
    """`compare --output notes` replaced notes/report.md, the user's own, and a report edited by hand, exit 0."""
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "report.md").write_text("# my own report\n")
    with pytest.raises(
        FileExistsError, match=r"notes/report.md was edited .* and is kept\. Fix: another --output, or"
    ):
        compare.write_comparison([both_output], notes)
    assert (notes / "report.md").read_text() == "# my own report\n" and sorted(notes.iterdir()) == [
        notes / "report.md"
    ]
    # One written here is replaced as long as it is unchanged; edited, it is kept.
    report = compare.write_comparison([both_output], tmp_path / "report")
    assert compare.write_comparison([both_output], tmp_path / "report") == report
    report.write_text(report.read_text() + "A note of mine.\n")
    with pytest.raises(
        FileExistsError, match=re.escape(f"move it away first: mv {report} {report.parent}/report.edited.md")
    ):
        compare.main([str(both_output), "--output", str(report.parent)])
    assert report.read_text().endswith("A note of mine.\n")
    (report.parent / "report.edited.md").write_text("kept earlier\n")  # the fix never names a file that exists
    with pytest.raises(FileExistsError, match=re.escape(f"mv {report} {report.parent}/report.edited-2.md")):
        compare.write_comparison([both_output], report.parent)
    # A report of an earlier version, written without the mark: kept beside the new one.
    earlier = "# Comparison of a and b\n\n## Runs\n\n- a: `../a`\n"
    report.write_text(earlier)
    assert compare.write_comparison([both_output], report.parent) == report
    assert (report.parent / "report.earlier.md").read_text() == earlier and "<!-- Written by" in report.read_text()


def test_normalize_confusion_rows():
    normalized = report_module.normalize_confusion([[3, 1], [0, 0]])
    np.testing.assert_allclose(normalized, [[0.75, 0.25], [0.0, 0.0]])


def test_missing_values_and_cli(tmp_path, capsys):
    run = make_run_dir(tmp_path / "a", "scratch", extras=False, test_accuracy=None)
    results = json.loads((run / "results.json").read_text())
    results.update(train={"loss": None, "seconds": None, "images_per_second": None})
    results["confusion_matrix"] = []
    (run / "results.json").write_text(json.dumps(results))
    report = compare.main([str(run), "--output", str(tmp_path / "report")])
    assert capsys.readouterr().out.strip() == str(report)
    row = parse_table(report.read_text(), "Run")[0]
    # Without a measured training loop the column stays empty: the whole run's wall time is another figure.
    assert row["Test accuracy"] == row["Images/s"] == row["Training time"] == report_module.MISSING
    assert not list((tmp_path / "report").glob("confusion_matrix_*.png"))


def test_not_a_run_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="no results.json"):
        find_run_dirs([tmp_path])
    with pytest.raises(ValueError, match="no results.json"):  # one `error:` line from the command
        compare.main([str(tmp_path), "--output", str(tmp_path / "out")])


def test_an_onnx_export_is_not_compared_as_another_run(tmp_path):
    """RUN/onnx holds its run's results.json: compared beside its run, it was a second row of the same figures."""
    run = make_run_dir(tmp_path / "a", "scratch")
    (run / "onnx").mkdir()
    for name in ("model.onnx", "results.json"):
        (run / "onnx" / name).write_bytes((run / "results.json").read_bytes() if name == "results.json" else b"onnx")
    with pytest.raises(ValueError, match=r"onnx: an ONNX export, whose results.json is its run's\. Fix: compare the"):
        compare.main([str(run), str(run / "onnx"), "--output", str(tmp_path / "report")])
    assert not (tmp_path / "report").exists()


def test_runs_scored_on_other_images_are_said_to_be(tmp_path):
    """Runs of the same dataset with other classes (`include_labels`), or a validation split held out from train with
    another seed: the report and the model card say that the figures are not on the same images."""
    from finetune.tools.model_card import build_model_card

    ten = make_run_dir(tmp_path / "ten", model=tiny_scratch_model(labels=TEN_LABELS), extras=False)
    three = make_run_dir(tmp_path / "three", extras=False)
    report = compare.write_comparison([three, ten], three / "comparison").read_text()
    assert "**Not scored on the same images**: the runs differ in their classes, so" in report
    card = build_model_card(three).text
    assert "all on `uoft-cs/cifar10`, not scored on the same images (they differ in their classes);" in card
    other = make_run_dir(tmp_path / "other", extras=False)
    for run, seed in ((three, 0), (other, 0)):
        results = json.loads((run / "results.json").read_text())
        results["hyperparameters"].update(validation_size=0.1, seed=seed)
        (run / "results.json").write_text(json.dumps(results))
    assert "Not scored" not in compare.write_comparison([three, other], tmp_path / "same").read_text()
    results = json.loads((other / "results.json").read_text())
    results["hyperparameters"]["data_seed"] = 1
    (other / "results.json").write_text(json.dumps(results))
    report = compare.write_comparison([three, other], tmp_path / "split").read_text()
    assert "the runs differ in their held-out validation split (its seed or size)," in report


def test_a_dataset_is_named_in_public_reports_without_local_paths():
    """Separate split files were shown with their absolute paths (the `:` of `train: PATH` read as `sklearn:`'s), in
    the report and the model card that goes to the Hub."""
    files = "train: /srv/me/data/train.csv, validation: /srv/me/data/val, test: /srv/test.parquet"
    assert report_module.display_dataset(files) == "train: train.csv, validation: val, test: test.parquet"
    assert report_module.display_dataset("/srv/me/photos") == "photos"
    for name in ("sklearn:digits", "uoft-cs/cifar10"):
        assert report_module.display_dataset(name) == name


def test_runs_scored_in_part_on_training_images_are_each_said_so_in_a_paragraph_of_their_own(tmp_path):
    runs = [make_run_dir(tmp_path / name, extras=False) for name in ("a", "b", "old")]
    for run, copies in zip(runs, ({"validation": 1234, "test": 2}, {"validation": 3})):
        results = json.loads((run / "results.json").read_text())
        results["num_samples"] = {"train": 45000, "validation": 5000, "test": 10000}
        results["training_image_copies"] = copies
        (run / "results.json").write_text(json.dumps(results))
    report = compare.write_comparison(runs, tmp_path / "report").read_text()  # old: a results.json without copies
    note = (
        "**a**: 1,234 of its 5,000 validation images and 2 of its 10,000 test images have the pixels of training "
        "images (a photo saved twice): its validation and test figures read high.\n\n**b**: 3 of its 5,000 validation"
    )
    assert note in report and "**old**" not in report


def test_the_report_is_never_written_into_the_images_a_run_trained_on(tmp_path):
    # Its plots there were read as the images of a class of their own (`report/`) by the next run on that folder.
    run = run_trained_on_photos(tmp_path)
    for output in (tmp_path / "photos", tmp_path / "photos" / "report"):
        with pytest.raises(
            ValueError, match=r"inside photos, the images the model was trained on.*Nothing was written"
        ):
            compare.main([str(run), "--output", str(output)])
    assert sorted(p.name for p in (tmp_path / "photos").rglob("*")) == ["cat.png", "cats"]
    assert compare.main([str(run), "--output", str(tmp_path / "report")]).is_file()


def test_runs_whose_names_make_the_same_file_name_keep_a_confusion_matrix_each(tmp_path):
    # `猫` and `狗` (and `Cat`, `cat` on macOS) were both written to one file: the report showed the last run's twice.
    runs = [
        make_run_dir(tmp_path / name, run_name=name, extras=False, seed=i)
        for i, name in enumerate(["猫", "狗", "Cat", "cat"])
    ]
    report = compare.write_comparison(runs, tmp_path / "report").read_text()
    linked = re.findall(r"!\[Confusion matrix of (.+?)\]\((.+?)\)", report)
    files = [file for _, file in linked]
    assert [name for name, _ in linked] == ["猫", "狗", "Cat", "cat"]
    assert len({file.lower() for file in files}) == 4, files
    assert all((tmp_path / "report" / file).is_file() for file in files)


def test_the_report_is_never_written_into_a_runs_folder(tmp_path):
    # `compare RUN --output RUN` wrote report.md, comparison.json and the plots among the run's files, exit 0: where
    # neither its card nor push looks for a report, and kept beside the next run trained there.
    run = make_run_dir(tmp_path / "run", "scratch")
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    for output in (run, run / "checkpoint-3"):
        with pytest.raises(FileExistsError, match=r"is a run's or a model's folder \(it holds .*Nothing was written"):
            compare.main([str(run), "--output", str(output)])
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before
    assert compare.main([str(run), "--output", str(run / "comparison")]).is_file()


def test_runs_that_have_not_finished_are_refused_as_such(tmp_path):
    """A `both` output whose scratch/ was stopped (checkpoints, no results.json) was compared as its pretrained/ alone,
    exit 0; a stopped, diverged or training run given by name was "not a run directory"."""
    import socket

    both = tmp_path / "both"
    make_run_dir(both / "pretrained", "pretrained", extras=False)
    (both / "scratch" / "checkpoint-24").mkdir(parents=True)
    with pytest.raises(
        ValueError, match=r"scratch is a run that has not finished: stopped at checkpoint-24 .*by name"
    ):
        compare.main([str(both), "--output", str(tmp_path / "report")])
    diverged = tmp_path / "diverged"
    diverged.mkdir()
    log = [{"eval_accuracy": 0.1, "step": 24}, {"step": 34, "nonfinite_step": 34, "nonfinite_loss": True}]
    (diverged / "trainer_state.json").write_text(json.dumps({"log_history": log}))
    with pytest.raises(ValueError, match=r"diverged is a run that has not finished: diverged at step 34 \(non-finite"):
        compare.main([str(diverged), "--output", str(tmp_path / "report")])
    # A finished run trained on (resumed) holds the results.json of its earlier session.
    lock = {"pid": os.getppid(), "host": socket.gethostname(), "started": "2026-01-01T00:00:00+0000"}
    (both / "pretrained" / ".run.lock").write_text(json.dumps(lock))
    with pytest.raises(
        ValueError, match=rf"pretrained is a run that has not finished: still training \(process {os.getppid()}"
    ):
        compare.main([str(both / "pretrained"), "--output", str(tmp_path / "report")])
    assert not (tmp_path / "report").exists()
    (both / "pretrained" / ".run.lock").unlink()
    (both / "pretrained" / "checkpoint-3").mkdir()
    (both / "pretrained" / "checkpoint-3" / "trainer_state.json").write_text(json.dumps({"log_history": log[:1]}))
    with pytest.raises(ValueError, match=r"checkpoint-3 is not a run directory: it has no results.json"):
        compare.main([str(both / "pretrained" / "checkpoint-3"), "--output", str(tmp_path / "report")])
    assert compare.main([str(both / "pretrained"), "--output", str(tmp_path / "report")]).is_file()


def test_other_input_sizes_skipped_steps_and_early_stops_are_said(tmp_path):
    """The report of a 224 px and a 32 px model, or of a run that skipped non-finite steps or stopped early, read as
    that of models trained alike: results.json records each, the report said none."""
    runs = [make_run_dir(tmp_path / name, extras=False) for name in ("a", "b")]
    results = json.loads((runs[1] / "results.json").read_text())
    results["image_size"] = 2 * results["image_size"]
    results["train"].update(nonfinite_steps=3, stopped_by="early_stopping")
    (runs[1] / "results.json").write_text(json.dumps(results))
    report = compare.write_comparison(runs, tmp_path / "report").read_text()
    size = results["image_size"]
    assert f"**Other input sizes**: a at {size // 2} px, b at {size} px; each model saw the images resized" in report
    assert "**b**: 3 optimizer step(s) skipped for a non-finite loss or gradients; ended by early stopping" in report
    assert "**a**:" not in report


def test_runs_of_the_same_classes_in_another_order_are_scored_on_the_same_images(tmp_path):
    # `include_labels` in another order renumbers the same classes: "not scored on the same images" was said.
    ten = make_run_dir(tmp_path / "ten", model=tiny_scratch_model(labels=TEN_LABELS), extras=False)
    reversed_ = make_run_dir(tmp_path / "reversed", model=tiny_scratch_model(labels=TEN_LABELS[::-1]), extras=False)
    assert "Not scored" not in compare.write_comparison([ten, reversed_], tmp_path / "report").read_text()
