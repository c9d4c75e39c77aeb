"""`vit-finetune COMMAND`: one command for the pipeline, with a subcommand per task (as `accelerate` and `hf` have).
Each subcommand is also a module (`python -m finetune.run`, `accelerate launch -m finetune.run`, ...). Flags are
snake_case as transformers' `HfArgumentParser` writes them (`--top-k` is accepted too); errors end as one line
(finetune/errors.py).
"""

import difflib
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
    return "\n".join([*lines, "", "`vit-finetune COMMAND --help` lists a command's arguments."])


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand; returns the exit status (the console script passes it to `sys.exit`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        close = difflib.get_close_matches(command, COMMANDS, n=1)
        fix = (f"did you mean `{close[0]}`? " if close else "") + f"the commands are {', '.join(COMMANDS)}"
        sys.stderr.write(f"error: unknown command {command!r}: {fix} (`vit-finetune --help`).\n")
        return 2
    if command == "train":
        answer_help(rest)  # the short help needs neither torch nor transformers: answered before importing them
    rest = ["push", *rest] if command == "push" else rest

    def command_main(args: list[str]):  # imported inside `run_command`: Ctrl-C while torch loads is one line too
        return importlib.import_module(COMMANDS[command][0]).main(args)

    return run_command(command_main, rest, keep_debug=command == "push")


if __name__ == "__main__":
    sys.exit(main())
