"""transformers' own common model tests (`ModelTesterMixin`, `ConfigTester`) run against ScratchViT.

Their sources are not in transformers' wheel, only in its sdist. Point `TRANSFORMERS_TESTS_DIR` at the unpacked sdist
of the installed version; .ci/run does. Without it, or for another version, the module skips and says how to get it.

transformers' `tests` package is imported under another name (`TESTS_ALIAS`), so it does not clash with this folder,
and is assembled in a temporary folder, because the sdist ships only
the top-level `tests/*.py` files, without the `tests/__init__.py` that `test_configuration_common` imports and without
the sibling modules they import relatively. Those siblings come from the sdist should it ever ship them, else from the
small stand-ins below.
"""

import atexit
import importlib
import importlib.util
import os
import re
import shutil
import sys
import tempfile
import unittest
from pathlib import Path
from unittest import mock

import pytest
import transformers
from torch import nn
from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES, MODEL_MAPPING_NAMES

from scratch_vit import ScratchViTConfig, ScratchViTForImageClassification, ScratchViTModel


TESTS_ALIAS = "transformers_common_tests"
VERSION = transformers.__version__
GET_SOURCES = (
    f"pip download transformers=={VERSION} --no-binary :all: --no-deps && tar xzf transformers-{VERSION}.tar.gz && "
    f"export TRANSFORMERS_TESTS_DIR=$PWD/transformers-{VERSION}"
)

# The siblings `test_modeling_common` and `test_configuration_common` import that the sdist does not ship. The
# exporters' and generation's mixins stay empty: ScratchViT does not generate (the common tests check that its tester
# does not inherit `GenerationTesterMixin`) and its ONNX export has its own tests (test_export.py).
STAND_INS = {
    "exporters/test_export.py": '''
class ExportTesterMixin:
    """Stand-in: the sdist has no tests/exporters; no export tests run."""
''',
    "generation/test_utils.py": '''
class GenerationTesterMixin:
    """Stand-in: the sdist has no tests/generation; ScratchViT does not generate."""
''',
    "utils/test_configuration_utils.py": """
# Stand-in: the sdist has no tests/utils. Every common `PreTrainedConfig` keyword, set away from its default, for
# `ConfigTester.check_config_arguments_init` to check that a config's `__init__` hands them on.
config_common_kwargs = {
    "return_dict": False,
    "output_hidden_states": True,
    "output_attentions": True,
    "dtype": "float16",
    "chunk_size_feed_forward": 5,
    "architectures": ["SomeModelForImageClassification"],
    "id2label": {0: "cat", 1: "dog", 2: "bird"},
    "label2id": {"cat": 0, "dog": 1, "bird": 2},
    "problem_type": "multi_label_classification",
}
""",
}


def source_version(root: Path) -> str | None:
    """The transformers version of an unpacked sdist, from its PKG-INFO."""
    info = root / "PKG-INFO"
    match = re.search(r"^Version: (\S+)$", info.read_text(encoding="utf-8"), re.M) if info.is_file() else None
    return match.group(1) if match else None


def import_common_tests():
    """Import transformers' `tests` package as `TESTS_ALIAS`; skip the module with the command that fetches it."""
    root = os.environ.get("TRANSFORMERS_TESTS_DIR")
    if not root:
        pytest.skip(f"transformers' common tests need its test sources: {GET_SOURCES}", allow_module_level=True)
    root = Path(root)
    version = source_version(root)
    if not (root / "tests/test_modeling_common.py").is_file() or version != VERSION:
        pytest.skip(
            f"TRANSFORMERS_TESTS_DIR ({root}) holds no tests of transformers {VERSION} (found {version}): "
            f"{GET_SOURCES}",
            allow_module_level=True,
        )
    package = Path(tempfile.mkdtemp(prefix="transformers-common-tests-"))
    atexit.register(shutil.rmtree, package, ignore_errors=True)
    (package / "__init__.py").write_text("")
    for module in (root / "tests").glob("*.py"):
        shutil.copy(module, package / module.name)
    for relative, text in STAND_INS.items():
        if (root / "tests" / relative).is_file():
            continue  # shipped: found through the package's `__path__` below
        (package / relative).parent.mkdir(exist_ok=True)
        (package / relative).parent.joinpath("__init__.py").touch()
        (package / relative).write_text(text)
    spec = importlib.util.spec_from_file_location(
        TESTS_ALIAS, package / "__init__.py", submodule_search_locations=[str(package), str(root / "tests")]
    )
    sys.modules[TESTS_ALIAS] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sys.modules[TESTS_ALIAS])
    modeling = importlib.import_module(f"{TESTS_ALIAS}.test_modeling_common")
    configuration = importlib.import_module(f"{TESTS_ALIAS}.test_configuration_common")
    return modeling, configuration.ConfigTester


modeling_common, ConfigTester = import_common_tests()
ModelTesterMixin, floats_tensor, ids_tensor = (
    modeling_common.ModelTesterMixin,
    modeling_common.floats_tensor,
    modeling_common.ids_tensor,
)


class ScratchViTModelTester:
    """Builds a tiny ScratchViT config and inputs for the common tests (as transformers' `ViTModelTester`)."""

    def __init__(
        self,
        parent,
        batch_size=13,
        image_size=16,
        patch_size=2,
        num_channels=3,
        is_training=True,
        use_labels=True,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        hidden_act="gelu",
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
        num_labels=10,
        initializer_range=0.02,
        **variant,
    ):
        self.parent = parent
        self.batch_size = batch_size
        self.image_size = image_size
        self.patch_size = patch_size
        self.num_channels = num_channels
        self.is_training = is_training
        self.use_labels = use_labels
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.hidden_act = hidden_act
        self.hidden_dropout_prob = hidden_dropout_prob
        self.attention_probs_dropout_prob = attention_probs_dropout_prob
        self.num_labels = num_labels
        self.initializer_range = initializer_range
        self.variant = variant  # ScratchViT's own options: pooling, position_embedding_type, ...
        # Tokens: one per patch, plus the CLS token unless the pooling is a mean over the patches.
        self.seq_length = (image_size // patch_size) ** 2 + (variant.get("pooling", "cls") == "cls")

    def get_config(self) -> ScratchViTConfig:
        return ScratchViTConfig(
            image_size=self.image_size,
            patch_size=self.patch_size,
            num_channels=self.num_channels,
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            intermediate_size=self.intermediate_size,
            hidden_act=self.hidden_act,
            hidden_dropout_prob=self.hidden_dropout_prob,
            attention_probs_dropout_prob=self.attention_probs_dropout_prob,
            initializer_range=self.initializer_range,
            num_labels=self.num_labels,
            **self.variant,
        )

    def prepare_config_and_inputs(self):
        pixel_values = floats_tensor([self.batch_size, self.num_channels, self.image_size, self.image_size])
        labels = ids_tensor([self.batch_size], self.num_labels) if self.use_labels else None
        return self.get_config(), pixel_values, labels

    def prepare_config_and_inputs_for_common(self):
        config, pixel_values, _ = self.prepare_config_and_inputs()
        return config, {"pixel_values": pixel_values}

    def create_and_check_model(self, config, pixel_values, labels):
        model = ScratchViTModel(config).eval()
        result = model(pixel_values)
        self.parent.assertEqual(result.last_hidden_state.shape, (self.batch_size, self.seq_length, self.hidden_size))
        self.parent.assertEqual(result.pooler_output.shape, (self.batch_size, self.hidden_size))

    def create_and_check_for_image_classification(self, config, pixel_values, labels):
        model = ScratchViTForImageClassification(config).eval()
        result = model(pixel_values, labels=labels)
        self.parent.assertEqual(result.logits.shape, (self.batch_size, self.num_labels))
        self.parent.assertEqual(result.loss.shape, ())

        config.num_channels = 1  # grayscale
        model = ScratchViTForImageClassification(config).eval()
        result = model(floats_tensor([self.batch_size, 1, self.image_size, self.image_size]))
        self.parent.assertEqual(result.logits.shape, (self.batch_size, self.num_labels))


class ScratchViTModelTest(ModelTesterMixin, unittest.TestCase):
    """The common tests on the default ScratchViT (learned positions, CLS pooling, linear head)."""

    all_model_classes = (ScratchViTModel, ScratchViTForImageClassification)
    test_resize_embeddings = False  # no token embeddings (as ViT)
    variant = {}

    def setUp(self):
        # The common tests tell a bare encoder (no loss to train) and an image classifier (labels to give) apart by the
        # class names in transformers' model mappings. ScratchViT is registered with the Auto classes at run time,
        # so it is not among those names: name it there, as it would be were it one of transformers' own models.
        for names, class_name in (
            (MODEL_MAPPING_NAMES, ScratchViTModel.__name__),
            (MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES, ScratchViTForImageClassification.__name__),
        ):
            patcher = mock.patch.dict(names, {ScratchViTConfig.model_type: class_name})
            patcher.start()
            self.addCleanup(patcher.stop)
        self.model_tester = ScratchViTModelTester(self, **self.variant)
        self.config_tester = ConfigTester(
            self, config_class=ScratchViTConfig, has_text_modality=False, hidden_size=37, num_attention_heads=1
        )

    def test_config(self):
        self.config_tester.run_common_tests()

    def test_model(self):
        self.model_tester.create_and_check_model(*self.model_tester.prepare_config_and_inputs())

    def test_for_image_classification(self):
        self.model_tester.create_and_check_for_image_classification(*self.model_tester.prepare_config_and_inputs())

    def test_model_get_set_embeddings(self):
        # ScratchViT's input embeddings are the patch projection and it has no output embeddings (as ViT).
        config, _ = self.model_tester.prepare_config_and_inputs_for_common()
        for model_class in self.all_model_classes:
            model = model_class(config)
            self.assertIsInstance(model.get_input_embeddings(), nn.Module)
            self.assertIsNone(model.get_output_embeddings())

    def test_can_init_all_missing_weights(self):
        # transformers runs this check only on its models added since 2023, read from the config file's copyright
        # line; ScratchViT's files carry none (it was written in 2026), so show the check a file that names its year.
        with tempfile.TemporaryDirectory() as folder:
            dated = Path(folder, "configuration_scratch_vit.py")
            dated.write_text("# Copyright 2026\n")
            getfile = modeling_common.inspect.getfile
            with mock.patch.object(
                modeling_common.inspect,
                "getfile",
                side_effect=lambda obj: str(dated) if obj is ScratchViTConfig else getfile(obj),
            ):
                super().test_can_init_all_missing_weights()

    @unittest.skip(reason="ScratchViT does not use inputs_embeds (as ViT)")
    def test_inputs_embeds(self):
        pass


class ScratchViTVariantsModelTest(ScratchViTModelTest):
    """The common tests on every ScratchViT option switched away from ViT's: a convolutional stem (with BatchNorm),
    sinusoidal positions, mean pooling (no CLS token), normalized queries and keys, stochastic depth, an MLP head."""

    variant = {
        "patch_embedding_type": "conv_stem",
        "position_embedding_type": "sinusoidal",
        "pooling": "mean",
        "qk_norm": True,
        "drop_path_rate": 0.1,
        "head_type": "mlp",
        "head_dropout_prob": 0.1,
    }
