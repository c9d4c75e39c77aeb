"""Train variants of one config side by side and tabulate how each went (`gpu_sweep.py` and `lr_sweep.py` use it).

    python benchmarks/sweep.py --config configs/cifar10_scratch_gpu.yaml --output OUT --parallel 6 --minutes 5 \
        --variant as_shipped --variant "lr_1e-3=--learning_rate 1e-3" --variant "fp32=--bf16 false" [--key value ...]

Each variant is one `python -m finetune.run` process: the config, the `--key value` arguments shared by every variant,
the variant's own, and `--output_dir OUT/runs/NAME` (its log in `OUT/runs/NAME.log`). Up to `--parallel` run at once
(one GPU holds several small runs; their images/s then share it). With `--minutes`, each run has that wall-clock
budget (`max_train_minutes`). A run that goes non-finite stops by itself with an error (`max_nonfinite_steps`); the
sweep records it and goes on. From each run's `trainer_state.json` (and `results.json` when it finished) it writes
`OUT/sweep.json` and `OUT/sweep.md`: status, the first non-finite step, validation accuracy at each evaluation (the
table shows it at whole minutes), best and last accuracy, test accuracy, images/s and the data share of step time.
`--report_only` rewrites them from OUT's runs.
"""

import argparse
import json
import os
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from finetune.errors import ArgumentParser, run_command  # noqa: E402
from finetune.locations import make_folder  # noqa: E402
from finetune.results import Results  # noqa: E402
from finetune.tools.report import MISSING, format_number, format_percent, markdown_table  # noqa: E402


@dataclass
class Variant:
    """A named set of `--key value` arguments on top of the sweep's config."""

    name: str
    args: list[str]

    @classmethod
    def parse(cls, text: str) -> "Variant":
        """`NAME` or `NAME=--key value ...`."""
        name, _, args = text.partition("=")
        if not name or "/" in name or name.startswith("-"):
            raise ValueError(f"A variant is `NAME` or `NAME=--key value ...`, got {text!r}.")
        return cls(name, shlex.split(args))


def from_here(path: str | Path) -> str:
    """A file of the repository (`configs/x.yaml`) as named from the current folder, where the runs start: a user's
    relative paths (`--output`, `--dataset_name`, ...) then mean what they meant where the command was typed."""
    return os.path.relpath(ROOT / path)


def command_of(
    config: str | None, variant: Variant, shared: list[str], output: Path, minutes: float | None
) -> list[str]:
    run_dir = output / "runs" / variant.name
    command = [sys.executable, from_here("benchmarks/timed_run.py"), *(["--config", config] if config else [])]
    command += [*shared, *variant.args, "--output_dir", os.path.relpath(run_dir), "--overwrite_output_dir", "true"]
    return command + (["--max_train_minutes", str(minutes)] if minutes else [])


def train(command: list[str], log: Path) -> int:
    """Run one variant to its end; its output goes to `log`. Returns the exit status."""
    run_dir = log.parent / log.stem
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        status = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT).returncode
    # Recorded as typed in the folder the sweep ran in: no interpreter path.
    (run_dir / "command.txt").write_text(shlex.join(["python", *command[1:]]) + "\n")
    (run_dir / "exit_status.txt").write_text(f"{status}\n")
    return status


def run_variants(
    config: str | None,
    variants: list[Variant],
    output: Path,
    shared: list[str] = (),
    minutes: float | None = None,
    parallel: int = 1,
) -> list[dict]:
    """Train every variant (up to `parallel` at once) and return their rows (`collect`), in the variants' order."""
    names = [v.name for v in variants]
    if len(set(names)) != len(names):
        raise ValueError(f"Variant names must differ, got {names}.")
    commands = {v.name: command_of(config, v, list(shared), output, minutes) for v in variants}
    logs = {name: output / "runs" / f"{name}.log" for name in names}
    print(f"Training {len(variants)} variants, {parallel} at a time; logs in {output}/runs", flush=True)
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        list(pool.map(lambda n: train(commands[n], logs[n]), names))
    return [collect(output / "runs" / name) for name in names]


def check_finished(rows: list[dict], output: Path) -> None:
    """Once the report is written: an error naming the first run that failed (a run that diverged is a finding)."""
    failed = [r for r in rows if r["status"] == "failed"]
    if failed:
        first = failed[0]
        raise RuntimeError(
            f"{len(failed)} of {len(rows)} runs failed; {first['name']} ended with exit status {first['exit_status']}"
            f"{': ' + first['error'] if first['error'] else ''} (its log: {output / 'runs' / first['name']}.log; "
            f"every run's row: {output / 'sweep.md'})."
        )


def error_line(log: Path) -> str | None:
    """The run's `error: ...` line, if it ended with one."""
    if not log.is_file():
        return None
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.startswith("error:")]
    return lines[-1][len("error:") :].strip() if lines else None


def collect(run_dir: Path) -> dict:
    """One run's row: from `trainer_state.json` (evaluations, non-finite steps, training figures so far) and, for a
    finished run, `results.json`."""
    state_path = run_dir / "trainer_state.json"
    history = json.loads(state_path.read_text())["log_history"] if state_path.is_file() else []
    evaluations = [e for e in history if "eval_accuracy" in e]
    nonfinite = [e for e in history if "nonfinite_step" in e]
    status_path = run_dir / "exit_status.txt"
    exit_status = int(status_path.read_text()) if status_path.is_file() else None
    error = error_line(run_dir.parent / f"{run_dir.name}.log")
    finished = (run_dir / "results.json").is_file() and exit_status in (0, None)
    results = Results.load(run_dir) if finished else None
    if finished:
        status = "finished"
    elif error and error.startswith("Training diverged"):
        status = "diverged"
    else:
        status = "failed"
    steps_per_epoch = next((e["step"] / e["epoch"] for e in evaluations if e.get("epoch")), None)
    first = nonfinite[0]["nonfinite_step"] if nonfinite else None
    last = evaluations[-1] if evaluations else {}
    train = results.train if results else None
    seconds = train.seconds if train else last.get("train_seconds")
    data_seconds = train.data_seconds if train else last.get("data_seconds")
    command_path = run_dir / "command.txt"
    return {
        "name": run_dir.name,
        "status": status,
        "exit_status": exit_status,
        "error": error if status != "finished" else None,
        "first_nonfinite_step": first,
        "first_nonfinite_epoch": first / steps_per_epoch if first and steps_per_epoch else None,
        "nonfinite_steps": results.train.nonfinite_steps if results else len(nonfinite),  # the log keeps 100
        "timeline": [
            {"minutes": e.get("elapsed_seconds", 0) / 60, "epoch": e.get("epoch"), "accuracy": e["eval_accuracy"]}
            for e in evaluations
        ],
        "best_accuracy": max((e["eval_accuracy"] for e in evaluations), default=None),
        "last_accuracy": last.get("eval_accuracy"),
        "validation_accuracy": results.validation.accuracy if results and results.validation else None,
        "test_accuracy": results.test.accuracy if results and results.test else None,
        "epochs": results.epochs if results else last.get("epoch"),
        "last_train_loss": next((e["loss"] for e in reversed(history) if "loss" in e), None),
        "images_per_second": train.images_per_second if train else last.get("train_images_per_second"),
        "data_share": data_seconds / seconds if seconds and data_seconds is not None else None,
        "command": command_path.read_text().strip() if command_path.is_file() else None,
    }


def accuracy_at(timeline: list[dict], minute: float) -> float | None:
    """Validation accuracy of the last evaluation at or before `minute`."""
    before = [t["accuracy"] for t in timeline if t["minutes"] <= minute + 1e-9]
    return before[-1] if before else None


def markdown(rows: list[dict], title: str = "") -> str:
    """The sweep's table (accuracy at up to 8 evenly spaced whole minutes), then each run's error and command."""
    longest = max((t["minutes"] for r in rows for t in r["timeline"]), default=0.0)
    step = max(1, -(-int(longest) // 8))
    minutes = list(range(step, int(longest) + 1, step))
    headers = ["variant", "status", "first non-finite step (epoch)"]
    headers += [f"{m} min" for m in minutes] + ["best", "final", "test", "epochs", "images/s", "data share"]
    cells = []
    for r in rows:
        first = r["first_nonfinite_step"]
        epoch = f" ({r['first_nonfinite_epoch']:.1f})" if r["first_nonfinite_epoch"] is not None else ""
        cells.append(
            [r["name"], r["status"], f"{first}{epoch}" if first else MISSING]
            + [format_percent(accuracy_at(r["timeline"], m)) for m in minutes]
            + [
                format_percent(r["best_accuracy"]),
                format_percent(r["last_accuracy"] if r["validation_accuracy"] is None else r["validation_accuracy"]),
                format_percent(r["test_accuracy"]),
                format_number(r["epochs"], 1),
                format_number(r["images_per_second"], 0),
                format_percent(r["data_share"]),
            ]
        )
    parts = ([f"# {title}"] if title else []) + [markdown_table(headers, cells)]
    parts += [f"- **{r['name']}** ({r['status']}): {r['error']}" for r in rows if r["error"]]
    parts += [f"- `{r['command']}`" for r in rows if r["command"]]
    return "\n\n".join(parts) + "\n"


def write_report(output: Path, rows: list[dict], title: str = "") -> str:
    (output / "sweep.json").write_text(json.dumps(rows, indent=2) + "\n")
    text = markdown(rows, title)
    (output / "sweep.md").write_text(text)
    return text


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="The YAML config every variant starts from.")
    parser.add_argument("--variant", action="append", default=[], help="`NAME` or `NAME=--key value ...` (repeat).")
    parser.add_argument("--output", default=from_here("benchmarks/results/sweep"), help="Folder for runs and reports.")
    parser.add_argument("--minutes", type=float, help="Wall-clock training budget of each run.")
    parser.add_argument("--parallel", type=int, default=1, help="Runs at once.")
    parser.add_argument("--report_only", "--report-only", action="store_true", help="Only rewrite the report.")
    args, shared = parser.parse_known_args(argv)
    if not args.report_only and (not args.config or not args.variant):
        parser.error("give --config and at least one --variant (or --report_only)")
    if args.parallel < 1:
        parser.error("--parallel must be >= 1")
    return args, shared


def main(argv: list[str] | None = None) -> list[dict]:
    args, shared = parse_args(argv)
    output = Path(args.output)
    if args.report_only:
        rows = [collect(d) for d in sorted(p for p in (output / "runs").glob("*") if p.is_dir())]
        if not rows:
            raise FileNotFoundError(
                f"No runs in {output / 'runs'}. Fix: run the sweep first: `python benchmarks/sweep.py --config CONFIG "
                f"--variant NAME --output {output}`."
            )
    else:
        variants = [Variant.parse(v) for v in args.variant]
        rows = run_variants(args.config, variants, make_folder(output), shared, args.minutes, args.parallel)
    print(write_report(output, rows))
    if not args.report_only:
        check_finished(rows, output)
    return rows


if __name__ == "__main__":
    sys.exit(run_command(main))
