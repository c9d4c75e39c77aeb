"""Fine-tuning methods on real runs: linear probing keeps the backbone bit for bit, LoRA (through peft) saves an
adapter that loads in a clean process and equals its merged model, layer-wise learning-rate decay and the
no-weight-decay groups of the optimizer."""

import json
import logging
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file, save_file
from test_evaluate_only import DIGITS
from test_run import tiny_vit_checkpoint
from test_scratch_vit_hub import BLOCK_PROJECT_PACKAGES, run_without_the_package
from transformers import AutoModelForImageClassification, ViTImageProcessor

from finetune import run
from finetune.arguments import DataArguments, ModelArguments
from finetune.data import load_image_data
from finetune.models import apply_finetune_method, build_model, count_parameters, load_adapter_model, parameter_groups
from finetune.tools import attention, predict
from finetune.tools.model_card import build_model_card
from finetune.tools.report import format_count
from scratch_vit import ScratchViTConfig, ScratchViTForImageClassification


ROOT = Path(__file__).resolve().parent.parent
TRAIN = [
    *DIGITS, "--num_train_epochs", "1", "--per_device_train_batch_size", "32", "--learning_rate", "1e-2",
    "--horizontal_flip", "false", "--logging_steps", "4", "--report_to", "none",
]  # fmt: skip


def scratch_checkpoint(path: Path, num_labels: int = 3, **options) -> Path:
    """A small saved ScratchViT standing in for a pretrained source model."""
    config = ScratchViTConfig(
        image_size=8, patch_size=2, num_channels=1, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=32, num_labels=num_labels, **options,
    )  # fmt: skip
    torch.manual_seed(0)
    ScratchViTForImageClassification(config).save_pretrained(path)
    ViTImageProcessor(size={"height": 8, "width": 8}, image_mean=[0.5], image_std=[0.5]).save_pretrained(path)
    return path


def test_linear_probe_keeps_the_backbone_bit_identical(tmp_path):
    base = tiny_vit_checkpoint(tmp_path / "base")
    out = tmp_path / "probe"
    results = run.main(["--model_name_or_path", str(base), *TRAIN, "--output_dir", str(out),
                        "--finetune_method", "linear_probe", "--weight_decay", "0.1"])["pretrained"]  # fmt: skip
    before = load_file(base / "model.safetensors")
    after = load_file(out / "model.safetensors")
    backbone = [name for name in before if not name.startswith("classifier.")]
    assert backbone and all(torch.equal(before[name], after[name]) for name in backbone)
    assert after["classifier.weight"].shape == (10, 16)  # the new head for digits' 10 classes, trained
    assert results.num_trainable_parameters == 16 * 10 + 10
    assert results.hyperparameters["finetune_method"] == "linear_probe"


@pytest.mark.parametrize("method", ["linear_probe", "lora"])
def test_a_frozen_backbones_batch_norm_statistics_are_kept(tmp_path, method):
    """Its batch norms re-estimated their statistics on the new data in train mode: a LoRA adapter, which does not save
    them, then scored 20% where its run reported 25% (and its merged model)."""
    base = scratch_checkpoint(tmp_path / "base", patch_embedding_type="conv_stem")
    out = tmp_path / method
    merge = ["--merge_lora", "true"] if method == "lora" else []
    run.main(
        ["--model_name_or_path", str(base), *TRAIN, "--output_dir", str(out), "--finetune_method", method, *merge]
    )
    before = load_file(base / "model.safetensors")
    after = load_file(out / ("merged" if method == "lora" else "") / "model.safetensors")
    statistics = [name for name in before if name.endswith(("running_mean", "running_var"))]
    assert statistics and all(torch.equal(before[name], after[name]) for name in statistics)


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    base = tiny_vit_checkpoint(root / "base")
    out = root / "lora"
    args = ["--model_name_or_path", str(base), *TRAIN, "--output_dir", str(out),
            "--finetune_method", "lora", "--lora_r", "4", "--merge_lora", "true"]  # fmt: skip
    results = run.main(args)["pretrained"]
    return base, out, results


def pixel_batch() -> torch.Tensor:
    return torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(0))


def test_lora_saves_a_small_adapter_with_the_head(lora_run):
    base, out, results = lora_run
    adapter = json.loads((out / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == str(base) and adapter["r"] == 4
    assert sorted(adapter["target_modules"]) == ["q_proj", "v_proj"] and adapter["modules_to_save"] == ["classifier"]
    weights = load_file(out / "adapter_model.safetensors")
    assert any("lora_A" in name for name in weights) and any("classifier" in name for name in weights)
    assert not any("fc1" in name for name in weights)  # the frozen backbone is not saved again
    assert (out / "adapter_model.safetensors").stat().st_size < (out / "merged" / "model.safetensors").stat().st_size
    # 2 layers x (q, v) x (A: r x 16 + B: 16 x r) + the head 10 x 16 + 10
    assert results.num_trainable_parameters == 2 * 2 * (4 * 16 + 16 * 4) + 170
    assert results.architecture == "ViTForImageClassification"
    closing = run.summary({"pretrained": results}, {"pretrained": out}, None)
    assert f"files: {out}/ (model, merged/, results.json, checkpoint-*)" in closing


def test_lora_merged_and_unmerged_logits_agree(lora_run):
    _, out, _ = lora_run
    unmerged = load_adapter_model(out, merge=False).eval()
    merged = AutoModelForImageClassification.from_pretrained(out / "merged").eval()
    lora_b = [p for name, p in unmerged.named_parameters() if "lora_B" in name]
    assert any(p.abs().sum() > 0 for p in lora_b)  # the adapters trained: merging changes the weights
    with torch.no_grad():
        expected = unmerged(pixel_values=pixel_batch()).logits
        torch.testing.assert_close(merged(pixel_values=pixel_batch()).logits, expected, atol=1e-5, rtol=1e-5)


def test_evaluation_only_accepts_the_adapter_folder(lora_run, tmp_path, caplog):
    _, out, trained = lora_run
    args = ["--do_train", "false", "--model_name_or_path", str(out), *DIGITS, "--output_dir", str(tmp_path / "e")]
    evaluated = run.main(args)["pretrained"]
    # The base's 3-class head, which the adapter's replaces, is no "MISMATCH ... Reinit" warning of a table.
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and "LOAD REPORT" in r.getMessage()]
    assert evaluated.validation.accuracy == pytest.approx(trained.validation.accuracy)
    assert evaluated.confusion_matrix == trained.confusion_matrix


def test_an_adapter_whose_base_moved_names_its_base(lora_run, tmp_path):
    _, out, _ = lora_run
    moved = tmp_path / "moved"
    shutil.copytree(out, moved, ignore=shutil.ignore_patterns("checkpoint-*", "merged"))
    adapter = json.loads((moved / "adapter_config.json").read_text())
    (moved / "adapter_config.json").write_text(json.dumps({**adapter, "base_model_name_or_path": "gone/base"}))
    args = ["--do_train", "false", "--model_name_or_path", str(moved), *DIGITS, "--output_dir", str(tmp_path / "e")]
    with pytest.raises(OSError, match=r"^The adapter in .* base model 'gone/base', which could not be loaded"):
        run.main(args)


def test_an_adapter_of_a_base_named_by_a_relative_path_loads_from_any_folder(tmp_path, monkeypatch):
    """The quickstart config's `model_name_or_path: outputs/quickstart/source_model` with LoRA: adapter_config.json
    kept the relative path, and predict, export and attention of the run failed from any other folder."""
    tiny_vit_checkpoint(tmp_path / "work" / "base")
    monkeypatch.chdir(tmp_path / "work")
    run.main(["--model_name_or_path", "base", *TRAIN, "--output_dir", "lora", "--finetune_method", "lora",
              "--save_strategy", "epoch", "--load_best_model_at_end", "false"])  # fmt: skip
    for folder in ("lora", "lora/checkpoint-8"):
        adapter = json.loads((tmp_path / "work" / folder / "adapter_config.json").read_text())
        assert adapter["base_model_name_or_path"] == str(tmp_path / "work" / "base")
    monkeypatch.chdir(tmp_path)
    from PIL import Image

    Image.new("L", (8, 8), 100).save(tmp_path / "digit.png")
    assert len(predict.main([str(tmp_path / "work" / "lora"), str(tmp_path / "digit.png")])) == 1


def test_adapter_loads_in_a_clean_process_and_in_predict(lora_run, tmp_path):
    _, out, _ = lora_run
    code = (
        "import sys, torch\n"
        "from finetune.tools.predict import load_classifier\n"
        "model, _ = load_classifier(sys.argv[1], device='cpu')\n"
        "x = torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(0))\n"
        "print(model(pixel_values=x).logits.tolist())\n"
    )
    env = {"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", code, str(out)], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-2000:]
    merged = AutoModelForImageClassification.from_pretrained(out / "merged").eval()
    with torch.no_grad():
        expected = merged(pixel_values=pixel_batch()).logits
    np.testing.assert_allclose(json.loads(done.stdout.strip().splitlines()[-1]), expected.numpy(), atol=1e-5)
    image = tmp_path / "digit.png"
    from PIL import Image

    Image.fromarray(np.random.default_rng(0).integers(0, 256, (8, 8), dtype=np.uint8), "L").save(image)
    assert len(predict.main([str(out), str(image), "--top-k", "3"])) == 1
    assert len(attention.main([str(out), str(image), "--output", str(tmp_path / "maps")])) == 2


def test_an_adapter_file_lacking_weights_is_refused(lora_run, tmp_path):
    """peft only warns of adapter weights its file lacks and starts them at random: the model scored and predicted
    with them. A head the file lacks, peft refuses itself."""
    _, out, _ = lora_run
    cut = Path(shutil.copytree(out, tmp_path / "cut", ignore=shutil.ignore_patterns("checkpoint-*", "merged")))
    weights = load_file(cut / "adapter_model.safetensors")
    dropped = next(name for name in weights if "lora_A" in name)
    save_file({name: w for name, w in weights.items() if name != dropped}, cut / "adapter_model.safetensors")
    with pytest.raises(ValueError, match=rf"^The adapter weights in .*cut lack {re.escape(dropped)}, of the adapters"):
        load_adapter_model(cut)


def test_a_lora_run_fine_tunes_further_from_its_merged_model(lora_run, tmp_path):
    _, out, _ = lora_run
    again = tmp_path / "again"
    run.main(["--model_name_or_path", str(out), *TRAIN, "--max_steps", "1", "--output_dir", str(again),
              "--finetune_method", "linear_probe"])  # fmt: skip
    merged, after = load_file(out / "merged" / "model.safetensors"), load_file(again / "model.safetensors")
    backbone = [name for name in merged if not name.startswith("classifier.")]
    assert backbone and all(torch.equal(merged[name], after[name]) for name in backbone)  # the adapters folded in
    assert AutoModelForImageClassification.from_pretrained(again).config.id2label[9] == "9"


def test_a_lora_checkpoint_without_the_models_config_names_the_run_folder(lora_run, tmp_path):
    _, out, _ = lora_run
    [checkpoint] = out.glob("checkpoint-*")  # adapter files only: the run writes config.json at its end
    assert (checkpoint / "adapter_config.json").is_file() and not (checkpoint / "config.json").exists()
    with pytest.raises(FileNotFoundError, match=f"{checkpoint} is a LoRA checkpoint.*Pass the run's output directory"):
        run.main(["--model_name_or_path", str(checkpoint), *TRAIN, "--output_dir", str(tmp_path / "again")])


def test_the_card_of_an_adapter_of_a_local_base_shows_no_path_of_the_training_machine(lora_run, tmp_path):
    base, out, _ = lora_run
    out = Path(shutil.copytree(out, tmp_path / "lora"))
    adapter = json.loads((out / "adapter_config.json").read_text())
    (out / "adapter_config.json").write_text(json.dumps({**adapter, "base_model_name_or_path": str(base)}))
    card = build_model_card(out, "me/vit-lora")
    assert str(base.parent) not in card.text and card.data.base_model is None
    assert 'from_pretrained("path/to/base", config=config' in card.text
    assert "A LoRA adapter (peft) of the local model `base`" in card.text
    assert "interpolate_pos_encoding" not in card.text  # trained at its base's size


def test_the_run_folder_gets_the_projects_card_not_peft_template(lora_run, tmp_path):
    """peft's `save_pretrained` writes its blank template card (`Model Card for Model ID`) into the run folder, which
    `card` refused as edited by hand and `push` uploaded in place of the run's card: the run leaves no README.md."""
    from finetune.tools.model_card import write_model_card

    _, out, _ = lora_run
    assert not (out / "README.md").exists()
    out = Path(shutil.copytree(out, tmp_path / "lora", ignore=shutil.ignore_patterns("checkpoint-*", "merged")))
    text = write_model_card(out, "me/vit-lora")
    assert "PeftModel.from_pretrained" in text and "Model Card for Model ID" not in text


def test_lora_card_names_the_base_model_and_peft(lora_run, tmp_path):
    _, run_dir, results = lora_run
    out = Path(shutil.copytree(run_dir, tmp_path / "lora", ignore=shutil.ignore_patterns("checkpoint-*")))
    # As a run from the Hub's checkpoint writes them.
    for name, changes in (
        ("adapter_config.json", {"base_model_name_or_path": "google/vit-base-patch16-224-in21k"}),
        ("results.json", {"model_name_or_path": "google/vit-base-patch16-224-in21k", "model_is_local": False}),
    ):
        (out / name).write_text(json.dumps({**json.loads((out / name).read_text()), **changes}))
    card = build_model_card(out, "me/vit-lora")
    assert card.data.library_name == "peft" and card.data.base_model == "google/vit-base-patch16-224-in21k"
    assert "PeftModel.from_pretrained" in card.text and "lora" in card.data.tags
    # The model's own parameters, as many as merged (results.json counts the base with the adapters and the head's
    # trained copy), and the ones LoRA trained.
    size = count_parameters(AutoModelForImageClassification.from_pretrained(out / "merged"))
    trained = format_count(results.num_trainable_parameters)
    parameters = f"{format_count(size)} parameters in the base model, and {trained} trained by LoRA"
    assert f"({parameters}: the adapters and the head)" in card.text
    from finetune.tools.hub import upload_plan

    assert {"adapter_config.json", "adapter_model.safetensors", "config.json"} <= {n for n, _ in upload_plan(out)}


def test_the_merged_model_exports_with_its_runs_figures(lora_run):
    """merged/ is the run's kept model: its export carries the run's figures (compare and card read them), where a
    checkpoint's carries none of them."""
    from finetune.results import Results
    from finetune.tools.export import export_results

    _, out, results = lora_run
    exported = export_results(out / "merged")
    assert exported == Results.load(out) and exported.validation.accuracy == results.validation.accuracy
    checkpoint = next(out.glob("checkpoint-*"))
    of_checkpoint = export_results(checkpoint)
    assert of_checkpoint.validation is None and of_checkpoint.run_name.endswith(checkpoint.name)


def test_the_merged_model_pushes_with_its_runs_results_and_a_plain_card(lora_run, tmp_path, monkeypatch, capsys):
    """A LoRA run's merged/ (no peft needed) goes to the Hub as a plain transformers model, with its run's
    results.json and a card written from them; `files` and the card command accept it too."""
    from huggingface_hub import ModelCard, constants
    from test_hub import TOKEN, FakeHub

    from finetune.tools import hub, model_card

    _, out, results = lora_run
    merged = out / "merged"
    assert model_card.main([str(merged)]) == merged / "README.md"
    assert "results.json" in hub.main(["files", str(merged)])
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # the server is on localhost
    with FakeHub() as server:
        hub.push_output_dir(merged, "me/vit-merged", token=TOKEN, endpoint=server.url)
    [commit] = server.commits
    assert commit["files"]["results.json"] == (out / "results.json").read_bytes()
    assert not any(name.startswith("adapter_") for name in commit["files"])
    card = ModelCard(commit["files"]["README.md"].decode())
    assert card.data.library_name == "transformers" and "peft" not in card.data.tags
    assert card.data.eval_results[0].metric_value == results.validation.accuracy
    assert "AutoModelForImageClassification.from_pretrained(repo)" in card.text and "PeftModel" not in card.text
    # The merged model's size, not the run's (results.json counts the adapters and the head's trained copy too).
    size = count_parameters(AutoModelForImageClassification.from_pretrained(merged))
    trained = format_count(results.num_trainable_parameters)
    assert size < results.num_parameters
    assert f"({format_count(size)} parameters; LoRA trained {trained}: the adapters, merged in, and the head)" in (
        card.text
    )
    pushed = tmp_path / "pushed"
    pushed.mkdir()
    for name, content in commit["files"].items():
        (pushed / name).write_bytes(content)
    image = tmp_path / "digit.png"
    from PIL import Image

    Image.fromarray(np.random.default_rng(0).integers(0, 256, (8, 8), dtype=np.uint8), "L").save(image)
    [expected], [again] = predict.main([str(merged), str(image)]), predict.main([str(pushed), str(image)])
    assert again.probabilities == pytest.approx(expected.probabilities, abs=1e-6)


def test_lora_on_scratch_vit_targets_the_fused_qkv(tmp_path):
    base = scratch_checkpoint(tmp_path / "scratch-base")
    out = tmp_path / "lora"
    args = ["--model_name_or_path", str(base), *TRAIN, "--output_dir", str(out),
            "--finetune_method", "lora", "--lora_r", "2", "--layer_decay", "0.75", "--merge_lora", "true"]  # fmt: skip
    results = run.main(args)["pretrained"]
    assert json.loads((out / "adapter_config.json").read_text())["target_modules"] == ["qkv"]
    assert results.architecture == "ScratchViTForImageClassification"
    assert results.hyperparameters["layer_decay"] == 0.75
    model = load_adapter_model(out)
    assert type(model).__name__ == "ScratchViTForImageClassification" and model.config.num_labels == 10

    # The card's snippet loads the run folder where scratch_vit cannot be imported: the code is stored with it.
    assert {"configuration_scratch_vit.py", "modeling_scratch_vit.py"} <= {path.name for path in out.iterdir()}
    card = build_model_card(out, str(out)).text
    assert "is a ScratchViT" in card and "fine-tuned on" in card and "random initialisation" not in card
    snippet = card.split("```python\n", 1)[1].split("\n\ndef open_image", 1)[0]  # the loading, up to the image
    # The local base is a placeholder in the card; the reader puts in where their copy is.
    assert snippet.count('"path/to/scratch-base"') == 1
    snippet = snippet.replace('"path/to/scratch-base"', repr(str(base)))
    x = "torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(0))"
    code = (
        BLOCK_PROJECT_PACKAGES + snippet + f"import torch\nprint(json.dumps(model(pixel_values={x}).logits.tolist()))"
    )
    with torch.no_grad():
        expected = model(pixel_values=pixel_batch()).logits
    logits = json.loads(run_without_the_package(code, tmp_path).splitlines()[-1])
    np.testing.assert_allclose(logits, expected.numpy(), atol=1e-5)


def test_unknown_lora_targets_and_scratch_methods_are_refused():
    model = AutoModelForImageClassification.from_pretrained(tiny_vit_checkpoint_in_memory())
    with pytest.raises(ValueError, match="`qkv` names no layer outside the head. The linear layers of ViTFor"):
        apply_finetune_method(model, ModelArguments(finetune_method="lora", lora_target_modules=["qkv"]))
    with pytest.raises(ValueError, match="starts from random ones"):
        ModelArguments(model_type="scratch", finetune_method="lora")


def test_lora_targets_are_layers_outside_the_head_that_peft_adapts():
    from transformers import ConvNextConfig, LevitConfig, LevitForImageClassification, ResNetConfig

    def adapted(model, targets=None) -> int:
        lora = apply_finetune_method(model, ModelArguments(finetune_method="lora", lora_target_modules=targets))
        return sum(".lora_A." in name for name, _ in lora.named_parameters())

    labels = {"num_labels": 3}
    convnext = AutoModelForImageClassification.from_config(
        ConvNextConfig(hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, **labels)
    )
    # ConvNeXt's linear layers are its blocks' `pwconv1`, `pwconv2` and the head `classifier`, which trains in full.
    expected = "`classifier` names no layer outside the head. The linear layers of ConvNextForImageClassification "
    with pytest.raises(ValueError, match=re.escape(expected + "outside its head are ['pwconv1', 'pwconv2']")):
        adapted(convnext, ["classifier"])
    assert adapted(convnext, ["pwconv1"]) == 2  # one per block

    # ResNet's one linear layer is its head's `classifier.1`; `1` also names convolution blocks, which peft refuses.
    resnet = AutoModelForImageClassification.from_config(
        ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic", **labels)
    )
    with pytest.raises(ValueError, match="has none. Use `finetune_method: linear_probe` or `full`"):
        adapted(resnet)
    with pytest.raises(ValueError, match=r"`1` also names `resnet\..*` \(.*\), which LoRA cannot adapt"):
        adapted(resnet, ["1"])

    # LeViT names every linear layer `linear`, its head's `classifier.linear` too: peft adapts those of the backbone.
    levit = LevitForImageClassification(
        LevitConfig(
            image_size=32,
            hidden_sizes=[16, 24, 32],
            num_attention_heads=[1, 2, 2],
            depths=[1, 1, 1],
            key_dim=[8, 8, 8],
            **labels,
        )  # fmt: skip
    )
    linear = [n for n, m in levit.named_modules() if isinstance(m, torch.nn.Linear) and not n.startswith("classifier")]
    assert adapted(levit, ["linear"]) == len(linear)

    # A dotted name, as peft reads it: the layers whose names end in it.
    vit = AutoModelForImageClassification.from_pretrained(tiny_vit_checkpoint_in_memory())
    assert adapted(vit, ["attention.q_proj"]) == vit.config.num_hidden_layers


def tiny_vit_checkpoint_in_memory():
    import tempfile

    return tiny_vit_checkpoint(Path(tempfile.mkdtemp()) / "vit")


def expected_layer_rates(name: str, lr: float, decay: float) -> float:
    """The BEiT formula for 2 blocks, by hand: embeddings d^3, block 0 d^2, block 1 d^1, final norm and head d^0."""
    if ".layers.0." in name or ".layer.0." in name:
        return lr * decay**2
    if ".layers.1." in name or ".layer.1." in name:
        return lr * decay
    if ".embeddings." in name:
        return lr * decay**3
    return lr


def test_a_drop_path_rate_out_of_range_is_refused_for_a_pretrained_model(tmp_path):
    """It reached a ScratchViT's config after its checks: the run exited 0 with a model no one could load."""
    base = scratch_checkpoint(tmp_path / "base")
    args = ["--model_name_or_path", str(base), *TRAIN, "--output_dir", str(tmp_path / "run"), "--max_steps", "1"]
    for rate in ("-0.5", "1.5"):
        with pytest.raises(ValueError, match=rf"^`drop_path_rate` must be a probability in \[0, 1\), got {rate}\.$"):
            run.main([*args, f"--drop_path_rate={rate}"])
    assert not (tmp_path / "run" / "config.json").exists()


@pytest.mark.parametrize("kind", ["vit", "scratch"])
def test_layer_decay_rates_and_no_weight_decay_groups(kind, tmp_path):
    path = tiny_vit_checkpoint(tmp_path / "m") if kind == "vit" else scratch_checkpoint(tmp_path / "m")
    model = AutoModelForImageClassification.from_pretrained(path)
    groups = parameter_groups(model, learning_rate=1e-3, weight_decay=0.05, layer_decay=0.5)
    names = [n for n, _ in model.named_parameters()]
    assert sorted(n for g in groups for n in g["param_names"]) == sorted(names)  # each parameter exactly once
    for group in groups:
        for name in group["param_names"]:
            assert group["lr"] == pytest.approx(expected_layer_rates(name, 1e-3, 0.5), rel=1e-12), name
    no_decay = {n for g in groups if g["weight_decay"] == 0.0 for n in g["param_names"]}
    one_dim = {n for n, p in model.named_parameters() if p.ndim == 1}
    embeddings = {n for n in names if n.endswith("cls_token") or n.endswith("position_embeddings")}
    assert len(embeddings) == 2 and all(n.endswith("bias") or "norm" in n for n in one_dim)
    assert no_decay == one_dim | embeddings
    assert all(g["weight_decay"] == 0.05 for g in groups if g["weight_decay"] != 0.0)


def test_the_trainer_uses_the_groups(tmp_path):
    base = tiny_vit_checkpoint(tmp_path / "base")
    out = tmp_path / "run"
    args = ["--model_name_or_path", str(base), *TRAIN, "--output_dir", str(out), "--layer_decay", "0.5",
            "--weight_decay", "0.05", "--lr_scheduler_type", "constant", "--learning_rate", "1e-3"]  # fmt: skip
    from finetune import trainer as trainer_module

    seen = {}
    original = trainer_module.ImageClassificationTrainer.create_optimizer

    def spy(self, model=None):
        optimizer = original(self, model)
        seen["groups"] = [(g["lr"], g["weight_decay"], list(g["param_names"])) for g in optimizer.param_groups]
        return optimizer

    trainer_module.ImageClassificationTrainer.create_optimizer = spy
    try:
        run.main(args)
    finally:
        trainer_module.ImageClassificationTrainer.create_optimizer = original
    # The head's group first, so the Trainer logs the run's rate, not the embeddings' (1e-3 * 0.5 ** 3).
    logged = [e["learning_rate"] for e in json.loads((out / "trainer_state.json").read_text())["log_history"]
              if "learning_rate" in e]  # fmt: skip
    assert seen["groups"][0][0] == 1e-3 and logged and all(lr == pytest.approx(1e-3) for lr in logged)
    for lr, weight_decay, names in seen["groups"]:
        for name in names:
            assert lr == pytest.approx(expected_layer_rates(name, 1e-3, 0.5), rel=1e-12), name
            assert (weight_decay == 0.0) == (
                name.endswith(("bias", "cls_token", "position_embeddings")) or "norm" in name
            )


def test_optimizer_cls_and_kwargs_keeps_the_groups(tmp_path):
    """A Trainer given `optimizer_cls_and_kwargs` builds that optimizer, over the same groups as `optim`'s."""
    from finetune.augment import BatchTransform
    from finetune.trainer import ImageClassificationTrainer
    from finetune.training_args import ImageClassificationTrainingArguments

    model = AutoModelForImageClassification.from_pretrained(tiny_vit_checkpoint(tmp_path / "m"))
    args = ImageClassificationTrainingArguments(
        output_dir=str(tmp_path / "run"), report_to="none", eval_strategy="no", load_best_model_at_end=False,
        learning_rate=1e-3, weight_decay=0.05,
        bf16=False, fp16=False, tf32=None, torch_compile=False,  # built in code: no `auto` (hardware.choose_settings)
    )  # fmt: skip
    trainer = ImageClassificationTrainer(
        model=model,
        args=args,
        batch_transform=BatchTransform(8, (0.5,), (0.5,), in_channels=1, out_channels=1),
        layer_decay=0.5,
        optimizer_cls_and_kwargs=(torch.optim.SGD, {"momentum": 0.9}),
    )
    optimizer = trainer.create_optimizer()
    assert type(optimizer) is torch.optim.SGD and {g["momentum"] for g in optimizer.param_groups} == {0.9}
    expected = parameter_groups(model, learning_rate=1e-3, weight_decay=0.05, layer_decay=0.5)

    def key(groups):
        return sorted((g["lr"], g["weight_decay"], sorted(g["param_names"])) for g in groups)

    assert key(optimizer.param_groups) == key(expected)


@pytest.mark.parametrize(
    "checkpoint_labels, head",
    [
        ([str(i) for i in range(10)], "kept"),  # the dataset's classes: the head goes on learning them
        ([f"LABEL_{i}" for i in range(10)], "kept"),  # transformers' placeholders: nothing says it is another task
        ([str(9 - i) for i in range(10)], "reordered"),  # the same classes in another order: each keeps its row
        ([f"class {i}" for i in range(10)], "new"),  # other classes, as many of them
    ],
)
def test_a_head_trained_for_other_classes_starts_anew(tmp_path, checkpoint_labels, head):
    path = tiny_vit_checkpoint(tmp_path / "checkpoint", num_labels=10)
    checkpoint = AutoModelForImageClassification.from_pretrained(path)
    with torch.no_grad():
        checkpoint.classifier.bias.uniform_(-1, 1)  # a head that has learned something
    checkpoint.config.id2label = dict(enumerate(checkpoint_labels))
    checkpoint.config.label2id = {name: i for i, name in enumerate(checkpoint_labels)}
    checkpoint.save_pretrained(path)
    saved = checkpoint.state_dict()
    data = load_image_data(DataArguments(dataset_name="sklearn:digits", decoded_cache_dir="none"), seed=0)
    assert data.label_names == [str(i) for i in range(10)]

    model_args = ModelArguments(model_name_or_path=str(path), attn_implementation="sdpa")
    model, _, _ = build_model("pretrained", model_args, None, data)
    assert [model.config.id2label[i] for i in range(10)] == data.label_names
    rows = [checkpoint_labels.index(name) for name in data.label_names] if head == "reordered" else list(range(10))
    for name in ("weight", "bias"):
        assert torch.equal(getattr(model.classifier, name), saved[f"classifier.{name}"][rows]) == (head != "new")
    if head == "new":  # as `ViTForImageClassification` initialises a new head: N(0, initializer_range), zero bias
        bias, weight = model.classifier.bias, model.classifier.weight
        assert not bias.any() and abs(weight.std().item() - model.config.initializer_range) < 0.005
    encoder = [name for name in saved if not name.startswith("classifier.")]
    assert encoder and all(torch.equal(model.state_dict()[name], saved[name]) for name in encoder)
    if head == "reordered":  # each class's logit is the checkpoint's logit of that class
        pixels = torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            np.testing.assert_allclose(
                model(pixel_values=pixels).logits, checkpoint(pixel_values=pixels).logits[:, rows]
            )

    # `ignore_mismatched_sizes: false` keeps the checkpoint's head: refused where its classes are others.
    keep = ModelArguments(model_name_or_path=str(path), attn_implementation="sdpa", ignore_mismatched_sizes=False)
    if head == "new":
        with pytest.raises(ValueError, match=r"\(class 0, class 1, .*but `ignore_mismatched_sizes: false` keeps"):
            build_model("pretrained", keep, None, data)
    else:
        assert torch.equal(build_model("pretrained", keep, None, data)[0].classifier.bias, model.classifier.bias)


def test_a_head_is_reordered_where_its_output_is_one_linear_or_convolution_layer():
    from finetune.models import reorder_head

    model = torch.nn.Module()  # timm's BiT head: a 1x1 convolution
    model.classifier = torch.nn.Sequential(torch.nn.Conv2d(4, 3, 1), torch.nn.Flatten())
    weight, bias = model.classifier[0].weight.clone(), model.classifier[0].bias.clone()
    assert reorder_head(model, [2, 0, 1])
    assert torch.equal(model.classifier[0].weight, weight[[2, 0, 1]]) and torch.equal(
        model.classifier[0].bias, bias[[2, 0, 1]]
    )
    model.classifier = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 3))  # which one: left as it is
    weights = [layer.weight.clone() for layer in model.classifier]
    assert not reorder_head(model, [2, 0, 1]) and all(map(torch.equal, weights, (l.weight for l in model.classifier)))


def test_a_lora_run_at_another_resolution_reloads_its_resized_position_embeddings(tmp_path):
    """A LoRA run at 16 px from an 8 px base saves only its adapters and head: loading it again rebuilt the base at the
    run's 16 px config, where the base's 8 px position embeddings did not fit and started anew (random), so that
    evaluation, `predict` and a teacher read from the adapter folder scored another model than the one trained."""
    base = tiny_vit_checkpoint(tmp_path / "base")
    processor = tmp_path / "processor_16"
    ViTImageProcessor(size={"height": 16, "width": 16}, image_mean=[0.5], image_std=[0.5]).save_pretrained(processor)
    out = tmp_path / "lora"
    trained = run.main(["--model_name_or_path", str(base), "--image_processor_name", str(processor), *TRAIN,
                        "--output_dir", str(out), "--finetune_method", "lora", "--lora_r", "4",
                        "--merge_lora", "true", "--bf16", "false"])["pretrained"]  # fmt: skip
    merged = AutoModelForImageClassification.from_pretrained(out / "merged").eval()
    reloaded = load_adapter_model(out).eval()
    assert reloaded.config.image_size == 16
    pixels = torch.randn(4, 1, 16, 16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(reloaded(pixel_values=pixels).logits, merged(pixel_values=pixels).logits)
    args = ["--do_train", "false", "--model_name_or_path", str(out), *DIGITS, "--output_dir", str(tmp_path / "e")]
    # In float32: under bf16 autocast a near tie between two classes went either way (CI, two test processes).
    evaluated = run.main([*args, "--bf16", "false"])["pretrained"]
    assert evaluated.confusion_matrix == trained.confusion_matrix
    # The model card's code, as written (the base at its own size, its position embeddings interpolated at each
    # call), scores an image as the merged model does; loading the base at the run's size started them anew.
    image = tmp_path / "digit.png"
    Image.fromarray(np.arange(64, dtype=np.uint8).reshape(8, 8) * 4).save(image)
    code = build_model_card(out).text.split("```python\n")[1].split("```")[0]
    assert "interpolate_pos_encoding=True" in code
    namespace = {}
    exec(code.replace("path/to/base", str(base)).replace("path/to/lora", str(out)).replace("image.jpg", str(image)),
         namespace)  # fmt: skip
    pixels = ViTImageProcessor.from_pretrained(out)(Image.open(image).convert("L"), return_tensors="pt").pixel_values
    with torch.no_grad():
        torch.testing.assert_close(namespace["logits"], merged(pixel_values=pixels).logits)


def test_the_lora_card_says_how_to_get_a_model_pipeline_loads_and_that_way_works(lora_run, tmp_path, monkeypatch):
    """pipeline() and AutoModelForImageClassification load no adapter folder, which the card did not say: it says to
    save the merged model its code makes, and that model, loaded by the Auto classes, computes predict's logits."""
    base, out, _ = lora_run
    out = Path(shutil.copytree(out, tmp_path / "lora", ignore=shutil.ignore_patterns("checkpoint-*", "merged")))
    card = build_model_card(out).text
    assert 'model.save_pretrained("merged")` and `processor.save_pretrained("merged")` after the code above' in card
    image = tmp_path / "image.jpg"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (8, 8), dtype=np.uint8), "L").save(image)
    [code] = re.findall(r"```python\n(.*?)```", card, re.S)
    monkeypatch.chdir(tmp_path)
    names = {}
    exec(code.replace("path/to/lora", str(out)).replace("path/to/base", str(base)), names)
    names["model"].save_pretrained("merged")
    names["processor"].save_pretrained("merged")
    model, _ = predict.load_classifier(out, device="cpu")
    with torch.no_grad():
        expected = model(pixel_values=pixel_batch()).logits
        actual = AutoModelForImageClassification.from_pretrained("merged")(pixel_values=pixel_batch()).logits
    torch.testing.assert_close(actual, expected)
