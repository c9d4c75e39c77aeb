"""Start-up time of the command-line tools: every `--help`, predicting one image from a run folder and from its ONNX
export, and the floor under the first: a bare script that imports torch and loads the same model with its
transformers class.

CPU timings swing several-fold when other processes run, so each sample starts only after `--settle` seconds in
which other processes used under 10% of a core, and is kept only if they used under 0.5 CPU-seconds during it
(read from /proc/stat, Linux only). Run it after the quickstart and `vit-finetune export outputs/quickstart/pretrained
--format onnx`, from the repository root in the activated environment:

    python benchmarks/startup.py                # median and range of 5 kept samples per command
"""

import os
import resource
import shutil
import statistics
import subprocess
import sys
import time

from finetune.errors import ArgumentParser, run_command


RUN, IMAGE = "outputs/quickstart/pretrained", "outputs/quickstart/digits/3/00.png"
FLOOR = (
    "import json, torch, transformers\n"
    f"architecture = json.load(open('{RUN}/config.json'))['architectures'][0]\n"
    f"getattr(transformers, architecture).from_pretrained('{RUN}')\n"
)
COMMANDS = {
    **{
        f"vit-finetune {c} --help".replace("  ", " "): ["vit-finetune", *c.split(), "--help"]
        for c in ("", "train", "predict", "attention", "compare", "push", "card", "export", "quickstart")
    },  # fmt: skip
    "python -m finetune.run --help": [sys.executable, "-m", "finetune.run", "--help"],
    f"vit-finetune predict {RUN} {IMAGE}": ["vit-finetune", "predict", RUN, IMAGE],
    f"vit-finetune predict {RUN}/onnx {IMAGE}": ["vit-finetune", "predict", f"{RUN}/onnx", IMAGE],
    'python -c "import torch"': [sys.executable, "-c", "import torch"],
    "bare script: torch, transformers, the model class, from_pretrained": [sys.executable, "-c", FLOOR],
}


def busy_seconds() -> float:
    """CPU-seconds all processes have used since boot (user, nice, system, irq, softirq, steal)."""
    values = list(map(int, open("/proc/stat").readline().split()[1:]))
    return (sum(values) - values[3] - values[4]) / os.sysconf("SC_CLK_TCK")


def quiet_sample(command: list[str], settle: float, deadline: float) -> float | None:
    """The wall time of one run of `command` while nothing else ran, or None past `deadline`."""
    while time.time() < deadline:
        before = busy_seconds()
        time.sleep(settle)
        if busy_seconds() - before > 0.1 * settle:
            continue
        usage, before, start = resource.getrusage(resource.RUSAGE_CHILDREN), busy_seconds(), time.perf_counter()
        done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode:
            last = (done.stderr.strip().splitlines() or [""])[-1].removeprefix("error: ")
            raise RuntimeError(f"`{' '.join(command)}` ended with exit status {done.returncode}: {last}")
        own = after.ru_utime - usage.ru_utime + after.ru_stime - usage.ru_stime
        if busy_seconds() - before - own < 0.5:
            return wall
    return None


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=5, help="Kept samples per command (default 5).")
    parser.add_argument("--settle", type=float, default=3.0, help="Quiet seconds before each sample (default 3).")
    parser.add_argument("--timeout", type=float, default=600, help="Seconds to wait for quiet per command.")
    args = parser.parse_args(argv)
    missing = [path for path in (IMAGE, f"{RUN}/onnx/model.onnx") if not os.path.isfile(path)]
    if missing or not shutil.which("vit-finetune"):  # found only after minutes of timing the other commands
        raise FileNotFoundError(
            f"{', '.join(missing) or 'vit-finetune'} not found. Fix: from the repository root, in the activated "
            f"environment, run `python -m finetune.tools.quickstart` and `vit-finetune export {RUN} --format onnx`."
        )
    print("| command | median (s) | range (s) |\n| --- | ---: | ---: |")
    for name, command in COMMANDS.items():
        deadline = time.time() + args.timeout
        times = [t for t in (quiet_sample(command, args.settle, deadline) for _ in range(args.samples)) if t]
        if not times:
            print(f"| `{name}` | no quiet moment in {args.timeout:.0f} s | |", flush=True)
            continue
        print(f"| `{name}` | {statistics.median(times):.2f} | {min(times):.2f}-{max(times):.2f} |", flush=True)


if __name__ == "__main__":
    sys.exit(run_command(main))
