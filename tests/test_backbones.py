"""Any backbone: DeiT, BEiT, Swin, ConvNeXt, DINOv2 and a timm model (through transformers' `TimmWrapper`) each
fine-tune with layer decay, evaluate, predict, draw attention where they have it and push to a local Hub server,
through the real pipeline on digits; each from a tiny random checkpoint saved offline with the image processor its
family ships with."""

import importlib.util
import json
import logging
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from huggingface_hub import ModelCard, constants
from PIL import Image
from safetensors.torch import load_file
from test_evaluate_only import DIGITS
from test_hub import TOKEN, FakeHub
from transformers import (
    AutoImageProcessor,
    AutoModelForImageClassification,
    BeitConfig,
    BeitForImageClassification,
    BeitImageProcessor,
    BitImageProcessor,
    ConvNextConfig,
    ConvNextForImageClassification,
    ConvNextImageProcessor,
    DeiTConfig,
    DeiTForImageClassification,
    DeiTImageProcessor,
    Dinov2Config,
    Dinov2ForImageClassification,
    SwinConfig,
    SwinForImageClassification,
    ViTImageProcessor,
)

from finetune import run
from finetune.models import layer_id, parameter_groups
from finetune.tools import attention, export, hub, predict


HAS_TIMM = importlib.util.find_spec("timm") is not None
needs_timm = pytest.mark.skipif(not HAS_TIMM, reason='timm is an optional extra: pip install -e ".[timm]"')
MEAN_STD = {"image_mean": [0.5] * 3, "image_std": [0.5] * 3}
VIT_SIZES = {"hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 32}


def deit(path: Path) -> None:
    DeiTForImageClassification(DeiTConfig(image_size=8, patch_size=2, **VIT_SIZES, num_labels=3)).save_pretrained(path)
    # DeiT's processor resizes to 256 and crops 224 on the Hub; here 10 then 8.
    DeiTImageProcessor(
        size={"height": 10, "width": 10}, crop_size={"height": 8, "width": 8}, **MEAN_STD
    ).save_pretrained(path)


def beit(path: Path) -> None:
    config = BeitConfig(image_size=8, patch_size=2, **VIT_SIZES, use_relative_position_bias=True, num_labels=3)
    BeitForImageClassification(config).save_pretrained(path)
    BeitImageProcessor(size={"height": 8, "width": 8}, do_center_crop=False, **MEAN_STD).save_pretrained(path)


def swin(path: Path) -> None:
    config = SwinConfig(image_size=8, patch_size=2, embed_dim=8, depths=[1, 2], num_heads=[1, 2], window_size=2)
    config.num_labels = 3
    SwinForImageClassification(config).save_pretrained(path)
    ViTImageProcessor(size={"height": 8, "width": 8}, **MEAN_STD).save_pretrained(path)


def convnext(path: Path) -> None:
    config = ConvNextConfig(patch_size=2, num_stages=2, hidden_sizes=[8, 16], depths=[1, 2], num_labels=3)
    ConvNextForImageClassification(config).save_pretrained(path)
    ConvNextImageProcessor(size={"shortest_edge": 8}, crop_pct=1.0, **MEAN_STD).save_pretrained(path)


def dinov2(path: Path) -> None:
    config = Dinov2Config(image_size=8, patch_size=2, **{**VIT_SIZES, "intermediate_size": None}, mlp_ratio=2)
    config.num_labels = 3
    Dinov2ForImageClassification(config).save_pretrained(path)
    BitImageProcessor(size={"shortest_edge": 10}, crop_size={"height": 8, "width": 8}, **MEAN_STD).save_pretrained(
        path
    )


def timm_vit(path: Path) -> None:
    from transformers import TimmWrapperConfig, TimmWrapperForImageClassification

    model_args = {"img_size": 8, "patch_size": 2, "embed_dim": 16, "depth": 2, "num_heads": 2}
    config = TimmWrapperConfig(architecture="vit_tiny_patch16_224", model_args=model_args, num_labels=3)
    # What a timm checkpoint on the Hub carries: its preprocessing as timm's `pretrained_cfg`.
    config.pretrained_cfg = {"input_size": [3, 8, 8], "mean": [0.5] * 3, "std": [0.5] * 3, "crop_pct": 1.0}
    TimmWrapperForImageClassification(config).save_pretrained(path)


# name -> (checkpoint maker, None when it has attention maps, else why not as `attention` says it)
BACKBONES = {
    "deit": (deit, None),
    "beit": (beit, None),
    "swin": (swin, "its attention is windowed"),  # no token attends to the whole image
    "convnext": (convnext, r"\(a convnext model\)"),
    "dinov2": (dinov2, None),
    "timm": (timm_vit, "transformers' TimmWrapper returns no attention weights"),  # though timm's ViT has them
}


def case(name: str):
    return pytest.param(name, marks=[needs_timm] if name == "timm" else [])


TRAIN = [
    *DIGITS, "--max_steps", "2", "--per_device_train_batch_size", "16", "--learning_rate", "1e-3",
    "--layer_decay", "0.75", "--logging_steps", "1", "--report_to", "none",
]  # fmt: skip


def checkpoint(root: Path, name: str) -> Path:
    torch.manual_seed(0)
    path = root / f"{name}-base"
    BACKBONES[name][0](path)
    return path


@pytest.fixture(scope="module")
def digit_image(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("images") / "digit.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (8, 8), dtype=np.uint8), "L").save(path)
    return path


@pytest.mark.parametrize("name", [case(name) for name in BACKBONES])
def test_backbone_fine_tunes_evaluates_predicts_draws_and_pushes(name, tmp_path, digit_image, monkeypatch):
    base, out = checkpoint(tmp_path, name), tmp_path / "run"
    results = run.main(["--model_name_or_path", str(base), *TRAIN, "--output_dir", str(out)])["pretrained"]

    model = AutoModelForImageClassification.from_pretrained(out)
    assert model.config.num_labels == 10 and results.architecture == type(model).__name__
    assert results.train.steps == 2 and results.hyperparameters["layer_decay"] == 0.75
    assert 0 <= results.validation.accuracy <= 1 and sum(map(sum, results.confusion_matrix)) == 45
    evaluated = run.main(["--do_train", "false", "--model_name_or_path", str(out), *DIGITS, "--attn_implementation",
                          "sdpa", "--output_dir", str(tmp_path / "eval")])["pretrained"]  # fmt: skip
    assert evaluated.validation.accuracy == pytest.approx(results.validation.accuracy)
    # A kernel choice reaches the models with transformers attention layers; ConvNeXt has none (transformers refused
    # `sdpa` for it) and timm keeps its own, so it is not recorded as applied there.
    without = name in ("convnext", "timm")
    choice = "the model's default" if without else "as given"
    assert evaluated.hyperparameters["attention_choice"] == choice

    # The run names the dataset's classes, not its base's (timm's config keeps them apart, as `label_names`).
    digits = [str(i) for i in range(10)]
    assert [model.config.id2label[i] for i in range(10)] == digits
    [prediction] = predict.main([str(out), str(digit_image), "--top_k", "3"])
    assert len(prediction.probabilities) == 10 and sum(prediction.probabilities) == pytest.approx(1, abs=1e-5)
    assert set(prediction.labels) <= set(digits)
    if all(importlib.util.find_spec(name) for name in export.EXTRA_MODULES):  # its labels read from config.json
        exported = export.main([str(out), "--format", "onnx", "--images", str(digit_image)]).path.parent
        [served] = predict.main([str(exported), str(digit_image), "--top_k", "3"])
        assert served.labels == prediction.labels
        # The model card's onnxruntime line, run as written from the run folder, serves the same prediction.
        [serving] = re.findall(r"`(onnxruntime\.InferenceSession\(.*?)`", hub.write_model_card(out))
        import onnxruntime

        monkeypatch.chdir(out)
        names = {"onnxruntime": onnxruntime, "AutoImageProcessor": AutoImageProcessor}
        [logits] = eval(serving, {**names, "images": [Image.open(digit_image).convert("RGB")]})
        assert model.config.id2label[int(logits.argmax())] == served.labels[0]
    maps = tmp_path / "maps"
    if BACKBONES[name][1] is None:
        assert [p.name for p in attention.main([str(out), str(digit_image), "--output", str(maps)])] == [
            "digit_attention.png",
            "digit_rollout.png",
        ]
    else:
        with pytest.raises(
            ValueError, match=f"^{results.architecture} has no attention to draw.*{BACKBONES[name][1]}"
        ):
            attention.main([str(out), str(digit_image), "--output", str(maps)])

    # Pushed to a local Hub server: what it received loads in a folder of its own and predicts as the run does.
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # the server is on localhost
    with FakeHub() as server:
        hub.push_output_dir(out, f"me/{name}", token=TOKEN, endpoint=server.url)
    [commit] = server.commits
    pushed = tmp_path / "pushed"
    for path, content in commit["files"].items():
        (pushed / path).parent.mkdir(parents=True, exist_ok=True)
        (pushed / path).write_bytes(content)
    [again] = predict.main([str(pushed), str(digit_image), "--top_k", "3"])
    assert again.probabilities == pytest.approx(prediction.probabilities, abs=1e-6)
    card = ModelCard((pushed / "README.md").read_text())
    assert card.data.eval_results[0].metric_value == results.validation.accuracy
    assert results.architecture in card.text
    # Tagged by its architecture (a ConvNeXt was tagged `vit`), and pointed to attention maps only where drawn.
    assert name in card.data.tags and "vit" not in card.data.tags
    assert ("finetune.tools.attention" in card.text) == (BACKBONES[name][1] is None)


@needs_timm
def test_a_timm_runs_saved_processor_resizes_as_training_did(tmp_path, digit_image):
    """timm checkpoints resize bicubically (`pretrained_cfg`); training and evaluation resize bilinearly. The saved
    processor, which pipeline(), the card's code and ONNX serving use, kept the bicubic resize: its pixels of 8 px
    digits enlarged to 16 were up to 30 levels from evaluation's, and 5 of 12 top-1 differed from predict's."""
    from transformers import TimmWrapperConfig, TimmWrapperForImageClassification

    model_args = {"img_size": 16, "patch_size": 4, "embed_dim": 16, "depth": 2, "num_heads": 2}
    config = TimmWrapperConfig(architecture="vit_tiny_patch16_224", model_args=model_args, num_labels=3)
    config.pretrained_cfg = {"input_size": [3, 16, 16], "mean": [0.5] * 3, "std": [0.5] * 3, "crop_pct": 1.0,
                             "interpolation": "bicubic"}  # fmt: skip
    TimmWrapperForImageClassification(config).save_pretrained(base := tmp_path / "base")
    out = tmp_path / "run"
    results = run.main(["--model_name_or_path", str(base), *TRAIN, "--output_dir", str(out)])["pretrained"]
    model, processor = predict.load_classifier(out)
    image = Image.open(digit_image).convert("RGB")
    ours = predict.preprocess([image], model, processor, stored_size=results.stored_image_size)
    saved = AutoImageProcessor.from_pretrained(out)(image, return_tensors="pt").pixel_values
    assert ours.shape == saved.shape == (1, 3, 16, 16)
    assert ((ours - saved) * 0.5 * 255).abs().max() < 2  # levels: rounding only
    # A checkpoint saved with timm's bicubic resize (before it was set) resumes: preprocessing, not the model.
    [checkpoint] = out.glob("checkpoint-*")
    config = json.loads((checkpoint / "config.json").read_text())
    config["pretrained_cfg"]["interpolation"] = "bicubic"
    (checkpoint / "config.json").write_text(json.dumps(config))
    (out / "results.json").unlink()
    resumed = ["--model_name_or_path", str(base), *TRAIN, "--output_dir", str(out), "--resume_from_checkpoint", "true"]
    assert run.main(resumed)["pretrained"].train.steps == 2


@needs_timm
@pytest.mark.parametrize(
    "crop_mode, stored_shape, photo_shape", [("squash", (16, 16), (16, 24)), ("center", (6, 10), (6, 10))]
)
def test_a_timm_runs_saved_processor_frames_photos_as_training_did(
    crop_mode, stored_shape, photo_shape, tmp_path, caplog
):
    """timm's processor frames a photo by its `crop_mode`: a `squash` checkpoint's (timm's ConvNeXt at 384 px) squeezed
    the whole photo where training and predict took its centre square, and a `center` one cropped the centre of images
    stored whole (all 10x6: no square to take) where training squeezed them: pipeline(), the card's code and its
    onnxruntime line scored pixels up to 40 and 46 levels from predict's."""
    from transformers import TimmWrapperConfig, TimmWrapperForImageClassification

    model_args = {"img_size": 16, "patch_size": 4, "embed_dim": 16, "depth": 2, "num_heads": 2}
    config = TimmWrapperConfig(architecture="vit_tiny_patch16_224", model_args=model_args, num_labels=3)
    config.pretrained_cfg = {"input_size": [3, 16, 16], "mean": [0.5] * 3, "std": [0.5] * 3, "crop_pct": 1.0,
                             "crop_mode": crop_mode, "interpolation": "bilinear"}  # fmt: skip
    TimmWrapperForImageClassification(config).save_pretrained(base := tmp_path / "base")
    logging.Logger.warning_once.cache_clear()  # transformers' once-a-process warnings said again
    rng = np.random.default_rng(0)
    for label in "abc":  # images of one size, stored as they are
        (tmp_path / "images" / label).mkdir(parents=True)
        for i in range(8):
            pixels = rng.integers(0, 256, (*stored_shape, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(tmp_path / "images" / label / f"{i}.png")
    data = ["--dataset_name", str(tmp_path / "images"), "--validation_size", "0.25", "--decoded_cache_dir", "none"]
    train = [*TRAIN[TRAIN.index("--max_steps") :], "--per_device_eval_batch_size", "16"]
    results = run.main(
        ["--model_name_or_path", str(base), *data, *train, "--output_dir", str(out := tmp_path / "run")]
    )
    # Smooth ramps: the resampling differs by a level, the framing by dozens.
    height, width = photo_shape
    ramp = np.linspace(0, 255, width)[None, :] * np.linspace(0.2, 1, height)[:, None]
    image = Image.fromarray(np.stack([ramp, ramp[::-1], ramp[:, ::-1]], -1).round().astype(np.uint8))
    model, processor = predict.load_classifier(out)
    stored = results["pretrained"].stored_image_size
    ours = predict.preprocess([image], model, processor, stored_size=stored)
    saved = AutoImageProcessor.from_pretrained(out)(image, return_tensors="pt").pixel_values
    assert ours.shape == saved.shape == (1, 3, 16, 16)
    assert ((ours - saved) * 0.5 * 255).abs().max() < 2  # levels
    # Its processor lives in config.json: the Trainer saved it too, and transformers warned at every save that timm's
    # `save_pretrained` "is disabled", as if serving would lack it.
    assert not [r for r in caplog.records if "save_pretrained" in r.getMessage()]


@pytest.mark.parametrize("name", [case(name) for name in BACKBONES])
def test_layer_decay_orders_every_backbone_from_embeddings_to_head(name, tmp_path):
    model = AutoModelForImageClassification.from_pretrained(checkpoint(tmp_path, name))
    groups = parameter_groups(model, learning_rate=1.0, weight_decay=0.05, layer_decay=0.5)
    rate = {n: g["lr"] for g in groups for n in g["param_names"]}
    assert sorted(rate) == sorted(n for n, _ in model.named_parameters())  # each parameter exactly once
    names = list(rate)
    embeddings = [n for n in names if "embed" in n]
    head = [n for n in names if n.split(".")[-2] in ("classifier", "head")]
    assert embeddings and head
    depths, num_blocks = layer_id(model)
    assert num_blocks == {"swin": 3, "convnext": 3}.get(name, 2)  # stages x blocks, not config.num_hidden_layers
    assert {rate[n] for n in embeddings} == {0.5 ** (num_blocks + 1)}  # the lowest rate
    assert {rate[n] for n in head} == {1.0}
    block_rates = [max(rate[n] for n in names if depths[n] == d) for d in range(1, num_blocks + 1)]
    assert block_rates == [0.5 ** (num_blocks + 1 - d) for d in range(1, num_blocks + 1)]  # strictly increasing
    assert min(rate.values()) == 0.5 ** (num_blocks + 1)
    for parameter, depth in BETWEEN_BLOCKS.get(name, {}).items():
        assert depths[parameter] == depth, parameter


# Hierarchical models: blocks count on across stages; what joins two stages trains with the block before it.
BETWEEN_BLOCKS = {
    "swin": {
        "swin.encoder.layers.0.blocks.0.mlp.fc1.weight": 1,
        "swin.encoder.layers.0.downsample.reduction.weight": 1,  # patch merging after stage 0
        "swin.encoder.layers.1.blocks.1.mlp.fc1.weight": 3,
    },
    "convnext": {
        "convnext.encoder.stages.1.downsampling_layer.1.weight": 1,  # downsampling before stage 1
        "convnext.encoder.stages.1.layers.0.pwconv1.weight": 2,
    },
}


def test_layer_decay_refuses_a_model_without_numbered_blocks():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    with pytest.raises(ValueError, match="`layer_decay` needs the blocks of Sequential.*Drop `layer_decay`"):
        parameter_groups(model, 1e-3, 0.05, layer_decay=0.75)


@needs_timm
@pytest.mark.parametrize("method", ["full", "linear_probe", "lora"])
def test_a_timm_checkpoint_of_other_classes_gets_a_new_head_of_its_own_kind(method, tmp_path, caplog):
    """timm's head is the timm model's own (`timm_model.head` here; `fc`, `head.fc`, ... elsewhere), not `classifier`:
    ten other named classes were refused ("has no classification head `classifier` to start anew"), linear probing
    and LoRA too, and a head of another size was warned of as weights that "do not fit"."""
    timm_vit(base := tmp_path / "base")
    config = json.loads((base / "config.json").read_text())
    (base / "config.json").write_text(json.dumps({**config, "num_classes": 10, "label_names": list("abcdefghij")}))
    args = [*TRAIN, "--finetune_method", method]
    if method == "linear_probe":  # the head trains alone, at the full rate: a layer decay is refused as unused
        args += ["--layer_decay", "none"]
    results = run.main([*args, "--model_name_or_path", str(base), "--output_dir", str(tmp_path / "run")])["pretrained"]
    assert [r for r in caplog.records if "classifies a, b, c, d, e" in r.getMessage()]  # its head starts anew
    if method == "linear_probe":  # the head alone trains
        before, after = load_file(base / "model.safetensors"), load_file(tmp_path / "run" / "model.safetensors")
        assert results.num_trainable_parameters == 16 * 10 + 10
        backbone = [name for name in before if not name.startswith("timm_model.head.")]
        assert backbone and all(torch.equal(before[name], after[name]) for name in backbone)
    # A head of another size (3 classes): replaced on loading, said as such, not as weights that do not fit.
    timm_vit(three := tmp_path / "three")
    run.main([*args, "--model_name_or_path", str(three), "--output_dir", str(tmp_path / "run3")])
    assert [r for r in caplog.records if "has a 3-class head: a new 10-class head starts" in r.getMessage()]
    assert not [r for r in caplog.records if "does not fit the model everywhere" in r.getMessage()]


@pytest.mark.parametrize("method", ["linear_probe", "lora"])
def test_a_model_with_a_distillation_head_trains_and_saves_both_heads(method, tmp_path, caplog):
    """DeiT's and LeViT's "with teacher" classifiers average two heads (DeiT's `cls_classifier` and
    `distillation_classifier`, LeViT's `classifier` and `classifier_distill`): other classes were refused ("no
    classification head `classifier` to start anew"), and LeViT's second head stayed random under linear probing and
    LoRA, and was not saved with the adapter: its folder predicted differently at every load."""
    from transformers import DeiTForImageClassificationWithTeacher, LevitConfig, LevitForImageClassificationWithTeacher

    from finetune.models import classification_heads

    torch.manual_seed(0)
    config = DeiTConfig(image_size=8, patch_size=2, **VIT_SIZES, num_labels=10)
    config.id2label = dict(enumerate("abcdefghij"))
    DeiTForImageClassificationWithTeacher(config).save_pretrained(base := tmp_path / "base")
    DeiTImageProcessor(size={"height": 8, "width": 8}, do_center_crop=False, **MEAN_STD).save_pretrained(base)
    args = [*TRAIN, "--layer_decay", "none", "--finetune_method", method, "--learning_rate", "1e-2"]
    run.main([*args, "--model_name_or_path", str(base), "--output_dir", str(out := tmp_path / "run")])
    assert [r for r in caplog.records if "classifies a, b, c, d, e" in r.getMessage()]  # both heads start anew
    if method == "linear_probe":
        before, after = load_file(base / "model.safetensors"), load_file(out / "model.safetensors")
        heads = ("cls_classifier.", "distillation_classifier.")
        assert all(not torch.equal(before[name], after[name]) for name in before if name.startswith(heads))
        assert all(torch.equal(before[name], after[name]) for name in before if not name.startswith(heads))
    else:  # the adapter folder holds both heads: every load predicts as the run evaluated
        saved = load_file(out / "adapter_model.safetensors")
        assert [n for n in saved if "distillation_classifier" in n] and [n for n in saved if ".cls_classifier" in n]
        image = np.random.default_rng(0).integers(0, 256, (8, 8), dtype=np.uint8)
        Image.fromarray(image, "L").save(path := tmp_path / "digit.png")
        first, second = (predict.main([str(out), str(path), "--top_k", "10"])[0] for _ in range(2))
        assert first.probabilities == pytest.approx(second.probabilities, abs=1e-6)
    levit = LevitForImageClassificationWithTeacher(LevitConfig(num_labels=3))  # the same for LeViT's two heads
    assert list(classification_heads(levit)) == ["classifier", "classifier_distill"]


@needs_timm
def test_a_timm_model_takes_stochastic_depth(tmp_path):
    """`drop_path_rate` on a timm model was refused as "has no stochastic depth" though `--help` named timm's: timm's
    `create_model` takes it, through the wrapper config's `model_args`, and the saved model keeps it."""
    timm_vit(base := tmp_path / "base")
    run.main([*TRAIN, "--model_name_or_path", str(base), "--output_dir", str(out := tmp_path / "run"),
              "--drop_path_rate", "0.1", "--layer_decay", "none"])  # fmt: skip
    assert json.loads((out / "config.json").read_text())["model_args"]["drop_path_rate"] == 0.1
    model = AutoModelForImageClassification.from_pretrained(out)
    assert model.timm_model.blocks[-1].drop_path1.drop_prob == pytest.approx(0.1)  # timm's rate at the last block


def test_a_checkpoint_whose_label_ids_are_not_its_heads_rows_is_refused_in_one_line(tmp_path, digit_image):
    """`id2label` {0, 2, 5} on a 3-output head (ids that name no row): fine-tuning, evaluation and predict all failed
    with `KeyError: 1`, as transformers' pipeline() does."""
    deit(base := tmp_path / "base")
    config = json.loads((base / "config.json").read_text())
    config["id2label"], config["label2id"] = {"0": "a", "2": "b", "5": "c"}, {"a": 0, "b": 2, "c": 5}
    (base / "config.json").write_text(json.dumps(config))
    refused = r"numbers its classes 0, 2, 5 \(`id2label`\), but its head's 3 outputs are 0 to 2\. Fix: renumber"
    with pytest.raises(ValueError, match=refused):
        run.main(["--model_name_or_path", str(base), *TRAIN, "--output_dir", str(tmp_path / "run")])
    with pytest.raises(ValueError, match=refused):
        run.main(["--do_train", "false", "--model_name_or_path", str(base), *DIGITS, "--include_labels", "0", "1",
                  "2", "--output_dir", str(tmp_path / "eval")])  # fmt: skip
    with pytest.raises(ValueError, match=refused):
        predict.main([str(base), str(digit_image)])


def test_a_checkpoint_whose_label_ids_are_names_is_refused_naming_the_field(tmp_path, digit_image):
    """`id2label` keyed by names ({"a": "a", ...}): every command said only transformers' "invalid literal for int()
    with base 10: 'a'", naming neither the file nor the field."""
    deit(base := tmp_path / "base")
    config = json.loads((base / "config.json").read_text())
    (base / "config.json").write_text(json.dumps({**config, "id2label": {name: name for name in "abc"}}))
    refused = r"config.json of .* keys `id2label` by names \(a, b, c\), not by the head's outputs\. Fix: number"
    with pytest.raises(ValueError, match=refused):
        run.main(["--model_name_or_path", str(base), *TRAIN, "--output_dir", str(tmp_path / "run")])
    with pytest.raises(ValueError, match=refused):
        predict.main([str(base), str(digit_image)])


def test_a_backbone_without_a_head_is_refused_as_such_by_predict_export_and_evaluation(tmp_path, digit_image):
    """A bare encoder (as google/vit-base-patch16-224-in21k is a ViTModel) passed to predict, export or `do_train:
    false` was refused with "lack classifier.bias, classifier.weight ... Fix: the config.json saved with these
    weights", which it is: the fix is to fine-tune it first."""
    from transformers import Dinov2Model

    Dinov2Model(Dinov2Config(image_size=8, patch_size=2, **{**VIT_SIZES, "intermediate_size": None})).save_pretrained(
        base := tmp_path / "base"
    )
    BitImageProcessor(size={"shortest_edge": 10}, crop_size={"height": 8, "width": 8}).save_pretrained(base)
    refused = r"is a Dinov2Model without a classification head: .* Fix: fine-tune it \(`python -m finetune\.run "
    with pytest.raises(ValueError, match=refused):
        predict.main([str(base), str(digit_image)])
    with pytest.raises(ValueError, match=refused):
        export.main([str(base), "--format", "onnx", "--images", str(digit_image)])
    with pytest.raises(ValueError, match=refused):
        run.main(
            ["--do_train", "false", "--model_name_or_path", str(base), *DIGITS, "--output_dir", str(tmp_path / "eval")]
        )


def test_a_model_with_sub_configs_loads_its_best_checkpoint_and_resumes(tmp_path):
    """CLIP's and SigLIP's configs hold sub-configs (`vision_config`), saved without their default fields: every
    CLIPForImageClassification run trained, then failed at its end, loading its best checkpoint ("is of another model
    (text_config (another value now); vision_config ...)"), with no results written. A sub-config's real change still
    refuses a resume."""
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel

    torch.manual_seed(0)
    text = {**VIT_SIZES, "vocab_size": 100, "max_position_embeddings": 8, "bos_token_id": 0, "eos_token_id": 1}
    vision = {**VIT_SIZES, "image_size": 8, "patch_size": 2}
    CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=8)).save_pretrained(
        base := tmp_path / "b"
    )
    CLIPImageProcessor(size={"shortest_edge": 8}, crop_size={"height": 8, "width": 8}).save_pretrained(base)
    args = [
        "--model_name_or_path",
        str(base),
        *TRAIN,
        "--layer_decay",
        "none",
        "--output_dir",
        str(out := tmp_path / "run"),
    ]
    results = run.main(args)["pretrained"]
    assert results.architecture == "CLIPForImageClassification" and results.train.steps == 2
    [checkpoint] = out.glob("checkpoint-*")
    config = json.loads((checkpoint / "config.json").read_text())
    config["vision_config"]["hidden_act"] = "gelu"  # CLIP's is quick_gelu: the same weights, another model
    (checkpoint / "config.json").write_text(json.dumps(config))
    (out / "results.json").unlink()
    with pytest.raises(ValueError, match=r"checkpoint-2 is of another model \(vision_config \(another value now\)\)"):
        run.main([*args, "--resume_from_checkpoint", "true"])


@needs_timm
@pytest.mark.parametrize("in_chans", [3, 1])
def test_a_checkpoint_as_timm_saves_it_fine_tunes(in_chans, tmp_path, digit_image):
    """timm's own `save_for_hf` (what `push_to_hf_hub` uploads) records `num_classes` in `model_args`, which
    transformers' TimmWrapper passes on beside its own: fine-tuning such a checkpoint failed with "TypeError: ...
    got multiple values for keyword argument 'num_classes' (unexpected)". A grayscale one (`in_chans: 1`) was fed
    3 channels ("cannot classify 8x8 images (... expected input[1, 3, 8, 8] to have 1 channels"): a timm config
    has no `num_channels`, which the run's now says."""
    import timm
    from timm.models import save_for_hf

    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", img_size=8, patch_size=2, embed_dim=16, depth=2, num_heads=2,
                              num_classes=5, in_chans=in_chans)  # fmt: skip
    statistics = {"mean": (0.5,) * in_chans, "std": (0.5,) * in_chans}
    model.pretrained_cfg = {**model.pretrained_cfg, "input_size": (in_chans, 8, 8), "crop_pct": 1.0, **statistics}
    save_for_hf(model, base := tmp_path / "base", model_config={"label_names": list("abcde")})
    assert json.loads((base / "config.json").read_text())["model_args"]["num_classes"] == 5
    out = tmp_path / "run"
    results = run.main(["--model_name_or_path", str(base), *TRAIN, "--output_dir", str(out)])["pretrained"]
    assert results.train.steps == 2
    saved = json.loads((out / "config.json").read_text())
    assert "num_classes" not in saved["model_args"] and saved["model_args"]["embed_dim"] == 16
    assert saved.get("num_channels", 3) == in_chans
    [prediction] = predict.main([str(out), str(digit_image)])
    assert len(prediction.probabilities) == 10


@needs_timm
def test_a_checkpoint_as_timm_saves_it_predicts_and_exports_as_timm_runs_it(tmp_path, digit_image):
    """predict and export load a folder of timm's own `save_for_hf` as it is, whose `model_args` name `num_classes`
    beside the wrapper's `num_labels`: both failed with "TypeError: ... got multiple values for keyword argument
    'num_classes' (unexpected)". The loaded model computes timm's own model's logits, with its class names."""
    import timm
    from timm.models import save_for_hf

    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", img_size=8, patch_size=2, embed_dim=16, depth=2, num_heads=2,
                              num_classes=3).eval()  # fmt: skip
    model.pretrained_cfg = {**model.pretrained_cfg, "input_size": (3, 8, 8), "crop_pct": 1.0}
    save_for_hf(model, base := tmp_path / "base", model_config={"label_names": list("abc")})
    loaded, processor = predict.load_classifier(base, device="cpu")
    pixel_values = predict.preprocess([Image.open(digit_image)], loaded, processor)
    with torch.no_grad():
        torch.testing.assert_close(loaded(pixel_values=pixel_values).logits, model(pixel_values))
    [prediction] = predict.main([str(base), str(digit_image), "--top_k", "3"])
    assert sorted(prediction.labels) == list("abc")
    exported = export.main([str(base), "--format", "onnx", "--images", str(digit_image)])
    assert exported.max_abs_difference <= exported.atol
