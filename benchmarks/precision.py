"""Training-step throughput of a config's ScratchViT as shipped (precision and attention `auto`) against float32 and
against forced bf16 autocast, on this CPU or GPU.

    python benchmarks/precision.py --config configs/cifar10_scratch_cpu30_stem.yaml --output precision.json
    python benchmarks/precision.py --emulate_no_bf16      # a CPU without native bf16, on one that has it

The model and the choices come from the config through the pipeline's own argument parsing, so "as shipped" is
exactly what `python -m finetune.run --config CONFIG` would train with. Variants are timed in turns (one repeat of
each, then the next round), so a change in machine load hits all alike; the table gives the median images/s and the
median of the per-round ratios to float32.

`--emulate_no_bf16` reruns the benchmark in a child process with `ONEDNN_MAX_CPU_ISA=AVX512_CORE_VNNI` (oneDNN, which
runs PyTorch's bf16 matmuls on the CPU, then uses no AVX512-BF16/AMX instructions) and `ATEN_CPU_CAPABILITY=avx2`
(PyTorch's own vectorised kernels at AVX2); `finetune.hardware` reads the oneDNN cap, so `auto` then chooses as on a
CPU without native bf16. On a CPU that has no native bf16 anyway, both runs measure the same thing.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
from model_speed import make_step, time_steps  # noqa: E402

from finetune import hardware  # noqa: E402
from finetune.arguments import parse_args, scratch_config_kwargs  # noqa: E402
from finetune.errors import ArgumentParser, run_command  # noqa: E402
from finetune.locations import check_folder, make_folder  # noqa: E402
from finetune.models import attention_head_size  # noqa: E402
from finetune.run import choose_attention  # noqa: E402
from finetune.tools.report import format_number, markdown_table  # noqa: E402
from scratch_vit import ScratchViTConfig, ScratchViTForImageClassification  # noqa: E402


EMULATION_ENV = {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_VNNI", "ATEN_CPU_CAPABILITY": "avx2"}


def variants(config: str) -> tuple[dict, ScratchViTConfig, int]:
    """`name -> (bf16, attention)` for the config as shipped, float32 and forced bf16; its model config; batch size."""
    model_args, _, scratch_args, training_args = parse_args(["--config", config, "--output_dir", "outputs/precision"])
    model_config = ScratchViTConfig(**scratch_config_kwargs(scratch_args), num_labels=10)
    head_size = attention_head_size("scratch", model_args, scratch_args)
    device = training_args.device.type

    def attention(bf16: bool) -> str:
        return hardware.choose_attention("auto", device, bf16, head_size)[0]

    # As shipped: exactly what `finetune.run` trains with, through its own choice.
    shipped = training_args.bf16 or training_args.mixed_precision == "bf16"
    shipped_attention = choose_attention("scratch", model_args, scratch_args, training_args)[0].attn_implementation
    table = {
        "as shipped (auto)": (shipped, shipped_attention),
        "float32": (False, attention(False)),
        "bf16 forced": (True, attention(True)),
    }
    return table, model_config, training_args.per_device_train_batch_size


def run(config: str, steps: int, repeats: int, warmup: int, batch_size: int | None) -> dict:
    table, model_config, default_batch = variants(config)
    batch_size = batch_size or default_batch
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    pixels = torch.randn(batch_size, model_config.num_channels, model_config.image_size, model_config.image_size)
    labels = torch.randint(0, model_config.num_labels, (batch_size,))
    pixels, labels = pixels.to(device), labels.to(device)
    steps_by_name = {}
    for name, (bf16, attention) in table.items():
        torch.manual_seed(0)
        model = ScratchViTForImageClassification._from_config(model_config, attn_implementation=attention)
        steps_by_name[name] = make_step(model, device, compile_model=False, bf16=bf16)
        for _ in range(warmup):
            steps_by_name[name](pixels, labels)
    rates = {name: [] for name in table}
    for _ in range(repeats):
        for name, step in steps_by_name.items():
            rates[name].append(time_steps(step, pixels, labels, steps, device)[0])
    rows = []
    for name, (bf16, attention) in table.items():
        ratios = [a / b for a, b in zip(rates[name], rates["float32"])]
        rows.append(
            {
                "variant": name,
                "bf16": bf16,
                "attention": attention,
                "images_per_second": statistics.median(rates[name]),
                "ratio_to_float32": statistics.median(ratios),
                "ratio_range": [min(ratios), max(ratios)],
            }
        )
    return {
        "config": config,
        "hardware": hardware.describe(device),
        "cpu_native_bf16": hardware.cpu_has_native_bf16(),
        "emulation": {key: os.environ.get(key) for key in EMULATION_ENV},
        "batch_size": batch_size,
        "steps": steps,
        "repeats": repeats,
        "rows": rows,
    }


def markdown(result: dict) -> str:
    env = ", ".join(f"{k}={v}" for k, v in result["emulation"].items() if v) or "none"
    title = (
        f"{hardware.short_name(result['hardware'])}; native bf16: {'yes' if result['cpu_native_bf16'] else 'no'}; "
        f"emulation: {env}; batch {result['batch_size']}, {result['repeats']} x {result['steps']} steps"
    )
    rows = [
        [
            r["variant"],
            "bf16" if r["bf16"] else "float32",
            r["attention"],
            format_number(r["images_per_second"], 0),
            f"{r['ratio_to_float32']:.2f} ({r['ratio_range'][0]:.2f}-{r['ratio_range'][1]:.2f})",
        ]
        for r in result["rows"]
    ]
    headers = ["variant", "precision", "attention", "images/s", "ratio to float32 (range)"]
    return f"{title}\n\n{markdown_table(headers, rows)}\n"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/cifar10_scratch_cpu30_stem.yaml", help="A finetune.run config.")
    parser.add_argument("--steps", type=int, default=5, help="Training steps per timed repeat.")
    parser.add_argument("--repeats", type=int, default=5, help="Rounds of timing (each variant once per round).")
    parser.add_argument("--warmup", type=int, default=2, help="Untimed steps per variant.")
    parser.add_argument("--batch_size", "--batch-size", type=int, default=None, help="Default: the config's.")
    parser.add_argument("--emulate_no_bf16", "--emulate-no-bf16", action="store_true", help=EMULATION_ENV.__repr__())
    parser.add_argument("--output", help="Also write the result as JSON to this file.")
    args = parser.parse_args(argv)
    if args.output:  # made now: found in the way only after the measurement, it lost the results
        make_folder(check_folder(args.output, is_file=True).parent)
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    if args.emulate_no_bf16 and any(os.environ.get(k) != v for k, v in EMULATION_ENV.items()):
        # Both variables are read when torch starts: rerun in a child process that has them.
        child = [
            a
            for a in (argv if argv is not None else sys.argv[1:])
            if a not in ("--emulate_no_bf16", "--emulate-no-bf16")
        ]
        status = subprocess.run([sys.executable, __file__, *child], env={**os.environ, **EMULATION_ENV}).returncode
        if status:
            raise RuntimeError(
                f"The run without bf16 instructions ended with exit status {status} (its output is above)."
            )
        return {}
    result = run(args.config, args.steps, args.repeats, args.warmup, args.batch_size)
    if args.output:
        Path(args.output).write_text(json.dumps(result, indent=2) + "\n")
    print(markdown(result))
    return result


if __name__ == "__main__":
    sys.exit(run_command(main))
