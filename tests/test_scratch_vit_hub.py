"""Saving ScratchViT as a Hub-style folder and loading it with remote code where `scratch_vit` is not installed."""

import ast
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import (
    AutoConfig,
    AutoImageProcessor,
    AutoModel,
    AutoModelForImageClassification,
    ViTImageProcessor,
)

import scratch_vit
from scratch_vit import ScratchViTConfig, ScratchViTForImageClassification, ScratchViTModel


ID2LABEL = {0: "cat", 1: "dog", 2: "frog"}

# Run in a fresh interpreter with `-I` (no PYTHONPATH, no cwd on sys.path). The project is installed in editable
# mode, whose finder would still import it from the venv, so the child blocks our packages before anything else.
BLOCK_PROJECT_PACKAGES = textwrap.dedent(
    """
    import importlib.abc
    import json
    import sys


    class BlockProjectPackages(importlib.abc.MetaPathFinder):
        blocked = ("scratch_vit", "finetune")

        def find_spec(self, fullname, path=None, target=None):
            if fullname.split(".")[0] in self.blocked:
                raise ModuleNotFoundError(f"{fullname} is blocked in this test", name=fullname)
            return None


    sys.meta_path.insert(0, BlockProjectPackages())
    try:
        import scratch_vit  # noqa: F401
    except ImportError:
        pass
    else:
        raise SystemExit("scratch_vit is importable in the child process; the remote-code test would prove nothing")
    """
)
CHILD = BLOCK_PROJECT_PACKAGES + textwrap.dedent(
    """
    import torch
    from PIL import Image
    from transformers import AutoConfig, AutoModel, AutoModelForImageClassification, pipeline

    folder, pixels_path, image_path, result_path = sys.argv[1:5]
    config = AutoConfig.from_pretrained(folder, trust_remote_code=True)
    model = AutoModelForImageClassification.from_pretrained(folder, trust_remote_code=True).eval()
    with torch.no_grad():
        logits = model(torch.load(pixels_path)).logits
    torch.save(logits, result_path + ".pt")
    encoder = AutoModel.from_pretrained(folder, trust_remote_code=True).eval()  # the bare encoder, without the head
    with torch.no_grad():
        torch.save(encoder(torch.load(pixels_path)).last_hidden_state, result_path + "_encoder.pt")

    classifier = pipeline("image-classification", model=folder, trust_remote_code=True)
    predictions = classifier(Image.open(image_path))
    features = pipeline("image-feature-extraction", model=folder, trust_remote_code=True)(Image.open(image_path))
    result = {
        "config_class": type(config).__module__ + "." + type(config).__name__,
        "model_class": type(model).__module__ + "." + type(model).__name__,
        "encoder_class": type(encoder).__module__ + "." + type(encoder).__name__,
        "features": features,
        "pipeline_model_class": type(classifier.model).__module__,
        "predictions": predictions,
        "scratch_vit_loaded": any(name.split(".")[0] == "scratch_vit" for name in sys.modules),
    }
    with open(result_path + ".json", "w") as f:
        json.dump(result, f)
    """
)


def save_folder(path, seed: int = 0) -> ScratchViTForImageClassification:
    config = ScratchViTConfig(
        image_size=16,
        patch_size=4,
        hidden_size=24,
        num_hidden_layers=2,
        num_attention_heads=3,
        intermediate_size=48,
        position_embedding_type="sinusoidal",
        head_type="mlp",
        id2label=ID2LABEL,
        label2id={v: k for k, v in ID2LABEL.items()},
    )
    torch.manual_seed(seed)
    model = ScratchViTForImageClassification(config).eval()
    with torch.no_grad():  # distinct logits per class, so the pipeline's ranking is meaningful
        for param in model.parameters():
            param.add_(0.3 * torch.randn_like(param))
    model.save_pretrained(path)
    processor = ViTImageProcessor(
        do_resize=True,
        size={"height": 16, "width": 16},
        do_rescale=True,
        do_normalize=True,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    )
    processor.save_pretrained(path)
    return model


def test_saved_folder_has_remote_code_files(tmp_path):
    save_folder(tmp_path)
    files = {p.name for p in tmp_path.iterdir()}
    expected = {
        "config.json",
        "configuration_scratch_vit.py",
        "modeling_scratch_vit.py",
        "model.safetensors",
        "preprocessor_config.json",
    }
    assert expected <= files
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "scratch_vit"
    assert config["auto_map"] == {
        "AutoConfig": "configuration_scratch_vit.ScratchViTConfig",
        "AutoModel": "modeling_scratch_vit.ScratchViTModel",
        "AutoModelForImageClassification": "modeling_scratch_vit.ScratchViTForImageClassification",
    }
    assert config["id2label"] == {"0": "cat", "1": "dog", "2": "frog"}
    # The copied code must be the package's code, and may only import relatively what is copied along.
    package_dir = os.path.dirname(scratch_vit.__file__)
    for name in ("configuration_scratch_vit.py", "modeling_scratch_vit.py"):
        with open(os.path.join(package_dir, name)) as source:
            assert (tmp_path / name).read_text() == source.read()
    imports = imported_modules((tmp_path / "modeling_scratch_vit.py").read_text())
    assert {name for name in imports if name.startswith(".")} == {".configuration_scratch_vit"}
    assert not [name for name in imports if name.startswith(("scratch_vit", "finetune", "transformers.models"))]


def imported_modules(source: str) -> set[str]:
    """Every module a Python file imports, relative ones with their leading dots."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.add("." * node.level + (node.module or ""))
    return names


def run_without_the_package(code: str, tmp_path, *args) -> str:
    """Run `code` (which starts with `BLOCK_PROJECT_PACKAGES`) with `args` in a fresh offline interpreter, in an empty
    folder, with its own Hugging Face caches; return its stdout."""
    script, work = tmp_path / "child.py", tmp_path / "empty_cwd"
    script.write_text(code)
    work.mkdir(exist_ok=True)
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PYTHON", "HF_", "TRANSFORMERS"))}
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_HOME=str(tmp_path / "hf_home"),
        HF_MODULES_CACHE=str(tmp_path / "hf_modules"),
    )
    command = [sys.executable, "-I", str(script), *map(str, args)]
    completed = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=240)
    assert completed.returncode == 0, completed.stderr[-4000:]
    return completed.stdout


def test_remote_code_loads_without_the_package(tmp_path):
    folder = tmp_path / "model"
    model = save_folder(folder)

    pixels = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    torch.save(pixels, tmp_path / "pixels.pt")
    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 256, size=(40, 30, 3), dtype=np.uint8))
    image.save(tmp_path / "image.png")
    result_path = tmp_path / "result"
    run_without_the_package(CHILD, tmp_path, folder, tmp_path / "pixels.pt", tmp_path / "image.png", result_path)
    result = json.loads((tmp_path / "result.json").read_text())

    # The classes came from the code copied into the modules cache, not from an installed package.
    assert not result["scratch_vit_loaded"]
    assert result["config_class"].startswith("transformers_modules.")
    assert result["config_class"].endswith("configuration_scratch_vit.ScratchViTConfig")
    assert result["model_class"].startswith("transformers_modules.")
    assert result["model_class"].endswith("modeling_scratch_vit.ScratchViTForImageClassification")
    assert result["pipeline_model_class"].startswith("transformers_modules.")
    assert result["encoder_class"].startswith("transformers_modules.")
    assert result["encoder_class"].endswith("modeling_scratch_vit.ScratchViTModel")
    assert any((tmp_path / "hf_modules").rglob("modeling_scratch_vit.py"))

    with torch.no_grad():
        expected_logits = model(pixels).logits
    child_logits = torch.load(tmp_path / "result.pt")
    torch.testing.assert_close(child_logits, expected_logits, rtol=0, atol=1e-6)
    with torch.no_grad():
        expected_states = model.vit(pixels).last_hidden_state
    torch.testing.assert_close(torch.load(tmp_path / "result_encoder.pt"), expected_states, rtol=0, atol=1e-6)

    # The pipeline preprocesses with the saved processor and names classes from id2label; recompute its scores here.
    processor = AutoImageProcessor.from_pretrained(folder)
    with torch.no_grad():
        probs = model(**processor(images=image, return_tensors="pt")).logits.softmax(-1)[0]
    predictions = result["predictions"]
    assert [p["label"] for p in predictions] == [ID2LABEL[i] for i in probs.argsort(descending=True).tolist()]
    torch.testing.assert_close(
        torch.tensor([p["score"] for p in predictions]), probs.sort(descending=True).values, rtol=0, atol=1e-5
    )
    assert abs(sum(p["score"] for p in predictions) - 1.0) < 1e-5
    # image-feature-extraction gives the encoder's last hidden state: one vector per token of the 4x4 patch grid.
    with torch.no_grad():
        states = model.vit(**processor(images=image, return_tensors="pt")).last_hidden_state
    torch.testing.assert_close(torch.tensor(result["features"]), states, rtol=0, atol=1e-5)


def test_auto_classes_resolve_in_process(tmp_path):
    config = AutoConfig.for_model("scratch_vit", hidden_size=16, num_attention_heads=2, num_labels=3)
    assert type(config) is ScratchViTConfig
    assert type(AutoModel.from_config(config)) is ScratchViTModel
    assert type(AutoModelForImageClassification.from_config(config)) is ScratchViTForImageClassification

    # With the package imported, a saved folder loads through the registered classes, no remote code needed.
    model = save_folder(tmp_path)
    assert type(AutoConfig.from_pretrained(tmp_path)) is ScratchViTConfig
    loaded = AutoModelForImageClassification.from_pretrained(tmp_path)
    assert type(loaded) is ScratchViTForImageClassification
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    base = AutoModel.from_pretrained(tmp_path)
    assert type(base) is ScratchViTModel
    for name, tensor in model.vit.state_dict().items():
        assert torch.equal(base.state_dict()[name], tensor), name


@pytest.mark.parametrize("bad_type", ["vit_scratch", "scratch-vit"])
def test_unknown_model_type_is_not_resolved(bad_type):
    with pytest.raises(ValueError, match=bad_type):
        AutoConfig.for_model(bad_type)


ENCODER_CHILD = BLOCK_PROJECT_PACKAGES + textwrap.dedent(
    """
    import torch
    from transformers import AutoModelForImageClassification

    folder, pixels_path, result_path = sys.argv[1:4]
    model = AutoModelForImageClassification.from_pretrained(folder, trust_remote_code=True, num_labels=4).eval()
    with torch.no_grad():
        outputs = model(torch.load(pixels_path), output_hidden_states=True)
    assert outputs.logits.shape == (2, 4), outputs.logits.shape
    torch.save(model.vit(torch.load(pixels_path)).last_hidden_state.detach(), result_path)
    print(type(model).__module__ + "." + type(model).__name__)
    """
)


def test_remote_code_puts_a_new_head_on_a_saved_encoder(tmp_path):
    # A bare encoder (as google/vit-base-patch16-224-in21k is a ViTModel) is fine-tuned with
    # AutoModelForImageClassification; with remote code that needs the class in the encoder folder's `auto_map`.
    folder = tmp_path / "encoder"
    config = ScratchViTConfig(
        image_size=16, patch_size=4, hidden_size=24, num_hidden_layers=2, num_attention_heads=3, intermediate_size=48
    )
    torch.manual_seed(0)
    encoder = ScratchViTModel(config).eval()
    encoder.save_pretrained(folder)
    auto_map = json.loads((folder / "config.json").read_text())["auto_map"]
    assert auto_map["AutoModelForImageClassification"] == "modeling_scratch_vit.ScratchViTForImageClassification"
    assert auto_map["AutoModel"] == "modeling_scratch_vit.ScratchViTModel"

    pixels = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    torch.save(pixels, tmp_path / "pixels.pt")
    stdout = run_without_the_package(ENCODER_CHILD, tmp_path, folder, tmp_path / "pixels.pt", tmp_path / "states.pt")
    assert stdout.strip().startswith("transformers_modules.")
    assert stdout.strip().endswith("modeling_scratch_vit.ScratchViTForImageClassification")
    with torch.no_grad():
        expected = encoder(pixels).last_hidden_state
    torch.testing.assert_close(torch.load(tmp_path / "states.pt"), expected, rtol=0, atol=1e-6)
