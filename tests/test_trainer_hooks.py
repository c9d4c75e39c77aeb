"""The pipeline extends transformers' Trainer through its public surface, plus two private methods named (with the
reason) in finetune/trainer.py's docstring. These tests fail, by name, the day a transformers release changes those
two, and the day our code starts to lean on another private Trainer method."""

import ast
import inspect
import re
from pathlib import Path

import transformers
from transformers import Trainer

from finetune.trainer import ImageClassificationTrainer


ROOT = Path(__file__).resolve().parent.parent
# The private Trainer methods overridden, with the parameters the overrides take.
PRIVATE_OVERRIDES = {
    "_load_from_checkpoint": ["self", "resume_from_checkpoint", "model"],
    "_load_best_model": ["self"],
}


def test_the_private_trainer_methods_we_override_still_exist_as_we_override_them():
    for name, parameters in PRIVATE_OVERRIDES.items():
        method = getattr(Trainer, name, None)
        assert method is not None, (
            f"transformers {transformers.__version__} has no Trainer.{name}, which finetune/trainer.py overrides to "
            "reload checkpoints strictly: move that loading to the method that replaced it."
        )
        found = list(inspect.signature(method).parameters)
        assert found == parameters, (
            f"transformers {transformers.__version__} changed Trainer.{name}{tuple(found)} (was {tuple(parameters)}): "
            "update the override in finetune/trainer.py."
        )


def test_no_other_private_trainer_method_is_overridden_or_called():
    private = {name for name in dir(Trainer) if name.startswith("_") and not name.startswith("__")}
    assert set(vars(ImageClassificationTrainer)) & private == set(PRIVATE_OVERRIDES)
    used = {}
    for path in sorted((ROOT / "finetune").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in private:
                used.setdefault(node.attr, []).append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert set(used) <= set(PRIVATE_OVERRIDES), f"private Trainer members used: {used}"


def test_no_private_internals_of_argparse_or_huggingface_hub():
    """`parser._actions` and huggingface_hub's `_http` module were read once; their public APIs do the job."""
    found = []
    for path in sorted((ROOT / "finetune").rglob("*.py")):
        text = path.read_text()
        for pattern in (r"\._actions\b", r"_GLOBAL_CLIENT_FACTORY", r"huggingface_hub\._[a-z]", r"argparse\._[a-z]"):
            found += [f"{path.relative_to(ROOT)}: {m.group()}" for m in re.finditer(pattern, text)]
    assert not found, found


def test_the_private_model_members_we_read_still_exist():
    """finetune/trainer.py names the private model and config members read (and why); these fail the day they go."""
    assert isinstance(getattr(transformers.PretrainedConfig, "_attn_implementation", None), property), (
        f"transformers {transformers.__version__} has no PretrainedConfig._attn_implementation, which finetune/run.py "
        "records with the results: read the attention kernel from its replacement."
    )
    found = list(inspect.signature(transformers.PreTrainedModel._init_weights).parameters)
    assert found == ["self", "module"], (
        f"transformers {transformers.__version__} changed PreTrainedModel._init_weights{tuple(found)}: update "
        "finetune/models.reset_head."
    )
    assert "_is_hf_initialized" in inspect.getsource(transformers.modeling_utils), (
        f"transformers {transformers.__version__} no longer marks loaded tensors `_is_hf_initialized`: update "
        "finetune/models.reset_head."
    )
    private = {
        name
        for cls in (transformers.PreTrainedModel, transformers.PretrainedConfig)
        for name in dir(cls)
        if name.startswith("_") and not name.startswith("__")
    }
    used = set()
    for path in sorted((ROOT / "finetune").rglob("*.py")):
        used |= {n.attr for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Attribute)} & private
    assert used == {"_attn_implementation", "_init_weights"}, f"private model/config members used: {used}"
