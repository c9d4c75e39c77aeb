"""Bad input stops `finetune/run.py` early with an error that names the problem and the fix."""

import io

import pytest
from PIL import Image

from finetune import run
from finetune.arguments import parse_args


SCRATCH = ["--model_type", "scratch", "--image_size", "8", "--patch_size", "2", "--hidden_size", "8",
           "--num_hidden_layers", "1", "--num_attention_heads", "2", "--num_train_epochs", "1",
           "--decoded_cache_dir", "none"]  # fmt: skip


def write_yaml(path, text):
    path.write_text(text)
    return str(path)


def test_yaml_values_are_typed_and_the_command_line_overrides_them(tmp_path):
    config = write_yaml(tmp_path / "c.yaml", "model_type: scratch\nlearning_rate: 2e-5\nhidden_size: 96\n"
                        "num_train_epochs: 3\nhorizontal_flip: false\nreport_to: [tensorboard]\n")  # fmt: skip
    model_args, data_args, scratch_args, training_args = parse_args(
        ["--config", config, "--num_train_epochs", "5", "--output_dir", str(tmp_path)]
    )
    assert model_args.model_type == "scratch"
    assert training_args.learning_rate == 2e-5 and isinstance(training_args.learning_rate, float)
    assert training_args.num_train_epochs == 5
    assert scratch_args.hidden_size == 96 and scratch_args.patch_size is None
    assert data_args.horizontal_flip is False
    assert training_args.report_to == ["tensorboard"]
    # The pipeline's own defaults: keep the best model by validation accuracy.
    assert training_args.load_best_model_at_end and training_args.metric_for_best_model == "accuracy"


def test_unknown_yaml_key_is_named_with_a_suggestion(tmp_path):
    config = write_yaml(tmp_path / "c.yaml", "hiden_size: 64\nlearning_rate: 1e-3\n")
    with pytest.raises(ValueError, match=r"(?s)'hiden_size'.*Did you mean 'hidden_size'"):
        parse_args(["--config", config])


def test_unknown_command_line_key_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"(?s)'learnig_rate'.*'learning_rate'"):
        parse_args(["--learnig_rate", "3"])


def test_missing_config_file():
    with pytest.raises(FileNotFoundError, match="does-not-exist.yaml"):
        parse_args(["--config", "does-not-exist.yaml"])


def test_missing_dataset_path(tmp_path):
    missing = tmp_path / "no_such_data.parquet"
    with pytest.raises(FileNotFoundError, match="no_such_data.parquet"):
        run.main([*SCRATCH, "--dataset_name", str(missing), "--output_dir", str(tmp_path / "out")])
    assert not (tmp_path / "out" / "results.json").exists()


def test_dataset_without_label_column(tmp_path):
    import datasets

    image = Image.new("RGB", (8, 8))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    ds = datasets.Dataset.from_dict(
        {"image": [{"bytes": buffer.getvalue(), "path": None}] * 4, "target": [0, 1, 0, 1]}
    )
    ds = ds.cast_column("image", datasets.Image())
    path = tmp_path / "train.parquet"
    ds.to_parquet(str(path))
    with pytest.raises(ValueError, match=r"(?s)target.*label_column_name"):
        run.main([*SCRATCH, "--dataset_name", str(path), "--output_dir", str(tmp_path / "out")])


@pytest.mark.parametrize(
    "extra, match",
    [
        (["--num_channels", "2"], r"(?s)2-channel.*1 channel.*num_channels: 1"),
        (["--num_channels", "3", "--convert_channels", "false"], r"(?s)3-channel.*convert_channels: true"),
    ],
)
def test_model_channels_that_disagree_with_the_data(tmp_path, extra, match):
    with pytest.raises(ValueError, match=match):
        run.main([*SCRATCH, *extra, "--dataset_name", "sklearn:digits", "--output_dir", str(tmp_path / "out")])


def test_hub_model_unreachable_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(OSError, match=r"(?s)google/vit-base-patch16-224-in21k.*HF_HUB_OFFLINE.*local directory"):
        run.main(["--model_type", "pretrained", "--dataset_name", "sklearn:digits", "--decoded_cache_dir", "none",
                  "--output_dir", str(tmp_path / "out")])  # fmt: skip


def test_local_model_path_that_does_not_exist(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"(?s)not a directory.*Hub model id"):
        run.main(["--model_type", "pretrained", "--model_name_or_path", str(tmp_path / "missing_model"),
                  "--dataset_name", "sklearn:digits", "--decoded_cache_dir", "none",
                  "--output_dir", str(tmp_path / "out")])  # fmt: skip


def test_invalid_scratch_config_names_the_field(tmp_path):
    with pytest.raises(ValueError, match=r"(?s)`hidden_size` \(8\).*`num_attention_heads` \(3\)"):
        run.main([*SCRATCH, "--num_attention_heads", "3", "--dataset_name", "sklearn:digits",
                  "--output_dir", str(tmp_path / "out")])  # fmt: skip
