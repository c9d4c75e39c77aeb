"""`vit-finetune`: one command for the pipeline, with a subcommand per task (as `accelerate` and `hf` have).

    vit-finetune train --config configs/quickstart.yaml [--key value ...]    finetune/run.py
    vit-finetune quickstart                                                   the offline quickstart
    vit-finetune compare RUN_DIR [RUN_DIR ...] --output DIR                   the comparison report
    vit-finetune predict MODEL_DIR PATH [PATH ...] [--top_k 3]                classify image files
    vit-finetune attention MODEL_DIR IMAGE [IMAGE ...] --output DIR           attention maps
    vit-finetune push OUTPUT_DIR --repo_id you/name                           push a run to the Hub
    vit-finetune card OUTPUT_DIR [--repo_id ID]                               write the model card
    vit-finetune export RUN_DIR --format onnx [--output DIR]                  ONNX for serving, checked

Each subcommand is also a module (`python -m finetune.run`, `python -m finetune.tools.compare`, ...;
`accelerate launch -m finetune.run` for several processes). Flags are snake_case, as
transformers' `HfArgumentParser` writes them;
kebab-case spellings (`--top-k`) are accepted too. An error ends as one line `error: ...` with exit status 1 (2
for a malformed command line); `--debug` (or `LOG_LEVEL=debug`) shows its traceback.
"""

import importlib
import sys

from finetune.arguments import answer_help
from finetune.errors import run_command


# subcommand -> (module, what it does); each module has `main(argv)`.
COMMANDS = {
    "train": ("finetune.run", "train and evaluate (python -m finetune.run)"),
    "quickstart": ("finetune.tools.quickstart", "the offline quickstart (python -m finetune.tools.quickstart)"),
    "compare": ("finetune.tools.compare", "comparison report of finished runs (python -m finetune.tools.compare)"),
    "predict": ("finetune.tools.predict", "classify image files (python -m finetune.tools.predict)"),
    "attention": ("finetune.tools.attention", "attention maps (python -m finetune.tools.attention)"),
    "push": ("finetune.tools.hub", "push a run to the Hub (python -m finetune.tools.hub push)"),
    "card": ("finetune.tools.model_card", "write a run's model card (python -m finetune.tools.model_card)"),
    "export": ("finetune.tools.export", "ONNX for serving, checked against PyTorch (python -m finetune.tools.export)"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: vit-finetune COMMAND [ARGS ...]", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_text}" for name, (_, help_text) in COMMANDS.items()]
    lines += ["", "`vit-finetune COMMAND --help` lists a command's arguments."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand; returns the exit status (the console script passes it to `sys.exit`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"vit-finetune: unknown command {command!r}.\n\n{usage()}", file=sys.stderr)
        return 2
    if command == "train":
        answer_help(rest)  # the short help needs neither torch nor transformers: answered before importing them
    module = importlib.import_module(COMMANDS[command][0])
    if command == "push":
        rest = ["push", *rest]
    # Each `main` returns what it made (results, paths) and raises on errors: one line `error: ...` and status 1.
    return run_command(module.main, rest, keep_debug=command == "push")


if __name__ == "__main__":
    sys.exit(main())
