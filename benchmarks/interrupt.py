"""How fast a run stops on SIGTERM with a ViT-B/16-sized checkpoint: `python benchmarks/interrupt.py [--output DIR]`.

Fine-tunes a ViT-B/16 in google/vit-base-patch16-224-in21k's layout (random weights, 86M parameters) on
scikit-learn's digits at 224 px, batch 2, in float32, as `python -m finetune.run` in its own process. Once the
progress bar shows `--after` optimizer steps, the benchmark sends SIGTERM and measures the seconds until the process
has exited: the rest of the running step plus writing a complete checkpoint (weights, AdamW state, RNG states,
trainer state). Writes `interrupt.json` with those seconds, the step time, the checkpoint's size and the exit status.
Time it alone on the machine: other busy processes stretch the step.
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from gpu_suite import notebook_checkpoint  # noqa: E402
from sweep import from_here  # noqa: E402

from finetune.errors import ArgumentParser, run_command  # noqa: E402
from finetune.locations import make_folder  # noqa: E402


VIT_B16 = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072}


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--output", default=from_here("benchmarks/results/interrupt"), help="Folder of interrupt.json."
    )
    parser.add_argument("--after", type=int, default=3, help="Optimizer steps done before the signal.")
    args = parser.parse_args(argv)
    output = make_folder(args.output)
    with tempfile.TemporaryDirectory(prefix="interrupt-") as tmp:
        checkpoint = notebook_checkpoint(Path(tmp) / "vit-b16", VIT_B16)
        run_dir = Path(tmp) / "run"
        command = [
            sys.executable, "-m", "finetune.run", "--model_type", "pretrained", "--model_name_or_path",
            str(checkpoint), "--dataset_name", "sklearn:digits", "--per_device_train_batch_size", "2",
            "--max_steps", "1000", "--bf16", "false", "--output_dir", str(run_dir), "--report_to", "none",
            "--decoded_cache_dir", "none", "--eval_strategy", "no", "--save_strategy", "no",
            "--load_best_model_at_end", "false",
        ]  # fmt: skip
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        seen, steps, stamps = b"", 0, []
        while steps < args.after:
            chunk = proc.stderr.read1(4096)
            if not chunk:
                last = (seen.decode(errors="replace").strip().splitlines() or ["no output"])[-1].removeprefix(
                    "error: "
                )
                raise RuntimeError(f"The run ended with exit status {proc.wait()} before step {args.after}: {last}")
            seen = (seen + chunk)[-20000:]
            found = [int(n) for n in re.findall(rb"\| *(\d+)/1000 \[", seen)]
            if found and max(found) > steps:
                steps = max(found)
                stamps.append((steps, time.perf_counter()))
        proc.send_signal(signal.SIGTERM)
        signalled = time.perf_counter()
        rest = proc.stderr.read()
        status = proc.wait()
        stopped = time.perf_counter() - signalled
        saved = sorted(run_dir.glob("checkpoint-*"))
        size = sum(f.stat().st_size for f in saved[-1].rglob("*") if f.is_file()) if saved else 0
        line = next((x for x in rest.decode(errors="replace").splitlines() if "error:" in x), "")
    step_seconds = (stamps[-1][1] - stamps[0][1]) / (stamps[-1][0] - stamps[0][0]) if len(stamps) > 1 else None
    result = {
        "model": "ViT-B/16 (86M parameters), float32, batch 2, 224 px, CPU",
        "cpu_count": os.cpu_count(),
        "exit_status": status,
        "seconds_from_signal_to_exit": round(stopped, 2),
        "seconds_per_step": round(step_seconds, 2) if step_seconds else None,
        "checkpoint": saved[-1].name if saved else None,
        "checkpoint_megabytes": round(size / 2**20, 1),
        "message": line.strip().replace(str(run_dir), "RUN_DIR"),  # no path of this machine in the results
    }
    (output / "interrupt.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    sys.exit(run_command(main))
