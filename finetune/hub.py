"""Push a run's output directory to the Hugging Face Hub as a model repo.

    python -m finetune.hub push OUTPUT_DIR --repo-id your-name/vit-cifar10 [--private] [--revision R]
    python -m finetune.hub files OUTPUT_DIR      # write the model card and list what a push would upload

Only what someone needs to use the model goes up: weights, config, image processor, the ScratchViT code files,
the model card (README.md, written here first), results.json and the comparison report when there is one. Checkpoints,
optimizer and scheduler states, training_args.bin and TensorBoard logs stay local. The push never deletes or changes
a local file, except that it (re)writes README.md.

The token comes from the `token` argument, else `HF_TOKEN`, else the stored login (`hf auth login`); it is sent only
in the Authorization header and never logged or written.
"""

import argparse
import fnmatch
import os
import shlex
import sys
from pathlib import Path

from huggingface_hub import CommitOperationAdd, HfApi, get_token
from huggingface_hub.errors import HfHubHTTPError
from transformers.utils import logging

from finetune.model_card import CARD_NAME, find_comparison_dir, write_model_card


logger = logging.get_logger(__name__)

# Top-level files of a run directory that make up the model repo; everything else stays local.
MODEL_FILE_PATTERNS = (
    "config.json",
    "generation_config.json",
    "*.safetensors",
    "model.safetensors.index.json",
    "preprocessor_config.json",
    "image_processor_config.json",
    "processor_config.json",
    "*.py",  # the ScratchViT code files `save_pretrained` writes next to the weights (auto_map)
    CARD_NAME,
    "results.json",
)
LEGACY_WEIGHT_PATTERNS = ("pytorch_model.bin", "pytorch_model-*.bin", "pytorch_model.bin.index.json")
COMPARISON_FILE_PATTERNS = ("*.md", "*.png", "*.json")


class HubPushError(RuntimeError):
    """A push that failed; the message says why, that the local files are intact, and how to retry."""


def upload_plan(output_dir: str | os.PathLike) -> list[tuple[str, Path]]:
    """The files a push uploads, as `(path_in_repo, local_path)` pairs sorted by path in the repo.

    Top-level model files of `output_dir` (weights, config, image processor, code files, README.md, results.json;
    `pytorch_model*.bin` only when there are no safetensors) and, when a comparison report covers this run, its files
    under `comparison/`. Subfolders (checkpoint-*/, runs/) and other files (training_args.bin, optimizer states,
    trainer_state.json) are never included.
    """
    output_dir = Path(output_dir)
    files = sorted(p for p in output_dir.iterdir() if p.is_file() and not p.is_symlink())

    def matching(patterns):
        return [p for p in files if any(fnmatch.fnmatch(p.name, pattern) for pattern in patterns)]

    chosen = matching(MODEL_FILE_PATTERNS)
    if not any(p.suffix == ".safetensors" for p in chosen):
        chosen += matching(LEGACY_WEIGHT_PATTERNS)
    plan = [(p.name, p) for p in chosen]
    comparison_dir = find_comparison_dir(output_dir)
    if comparison_dir is not None:
        for p in sorted(comparison_dir.iterdir()):
            if (
                p.is_file()
                and not p.is_symlink()
                and any(fnmatch.fnmatch(p.name, c) for c in COMPARISON_FILE_PATTERNS)
            ):
                plan.append((f"comparison/{p.name}", p))
    return sorted(plan)


def retry_command(
    output_dir: str | os.PathLike,
    repo_id: str,
    private: bool | None = None,
    revision: str | None = None,
    commit_message: str | None = None,
) -> str:
    """The shell command that repeats a push."""
    parts = ["python", "-m", "finetune.hub", "push", str(output_dir), "--repo-id", repo_id]
    if private:
        parts.append("--private")
    if revision:
        parts += ["--revision", revision]
    if commit_message:
        parts += ["--commit-message", commit_message]
    return shlex.join(parts)


def _describe_failure(error: BaseException, endpoint: str) -> str:
    """Why a Hub call failed: the HTTP status and the server's message, or the network error, plus what to do."""
    if isinstance(error, HfHubHTTPError) and error.response is not None:
        status = error.response.status_code
        request = error.response.request
        where = f" on {request.method} {request.url.path}" if request is not None else ""
        detail = error.server_message or str(error).splitlines()[0]
        hints = {
            401: "The token was rejected: set HF_TOKEN or run `hf auth login` with a token that has write access.",
            403: "The token may not write to this repo or namespace: check the repo id and the token's permissions.",
            404: "The repo or revision was not found: check the repo id and that the token can see it.",
        }
        hint = hints.get(status, "The Hub had a server error; retry later." if status >= 500 else "")
        return f"HTTP {status}{where}: {detail}" + (f"\n{hint}" if hint else "")
    cause = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    if isinstance(error, (ConnectionError, TimeoutError)) or "connect" in type(error).__name__.lower():
        return f"{cause}\nCould not reach {endpoint}: check the network connection (or HF_ENDPOINT)."
    return cause


def push_output_dir(
    output_dir: str | os.PathLike,
    repo_id: str,
    private: bool | None = None,
    revision: str | None = None,
    commit_message: str | None = None,
    token: str | None = None,
    endpoint: str | None = None,
) -> str:
    """Write the model card, then upload a run's output directory to the Hub repo `repo_id` in one commit.

    Args:
        output_dir: a run's output directory (`config.json`, weights, `results.json`).
        repo_id: `namespace/name`; created if missing (`private` applies only then).
        private: make a newly created repo private (`None`: the namespace's default).
        revision: branch to commit to; created from the default branch if missing.
        commit_message: defaults to "Upload <run name>".
        token: Hub token; defaults to `HF_TOKEN` or the stored login. Never logged or written.
        endpoint: Hub URL (defaults to `HF_ENDPOINT` or huggingface.co); tests point it at a local server.

    Returns:
        The URL of the commit.

    Raises:
        FileNotFoundError: `output_dir` is not a finished run's output directory.
        HubPushError: the push failed; the message names the cause, says that every local file is still in place,
            and gives the command to retry.
    """
    output_dir = Path(output_dir)
    missing = [name for name in ("config.json", "results.json") if not (output_dir / name).is_file()]
    if missing:
        children = (
            [p.name for p in output_dir.iterdir() if (p / "config.json").is_file()] if output_dir.is_dir() else []
        )
        hint = f" It holds run directories: push {', '.join(children)} separately." if children else ""
        raise FileNotFoundError(
            f"{output_dir} is not the output directory of a finished run: missing {', '.join(missing)}.{hint}"
        )
    retry = retry_command(output_dir, repo_id, private, revision, commit_message)
    write_model_card(output_dir, repo_id)
    plan = upload_plan(output_dir)
    token = token or get_token()
    api = HfApi(endpoint=endpoint, token=token)

    def failure(cause: str) -> HubPushError:
        message = (
            f"Pushing {output_dir} to the Hub repo {repo_id!r} failed: {cause}\n"
            f"Every local file in {output_dir} is still in place (only the model card {CARD_NAME} was written).\n"
            f"Retry with:\n  {retry}"
        )
        return HubPushError(message.replace(token, "***") if token else message)

    if not token:
        raise failure("no Hub token. Set HF_TOKEN or log in with `hf auth login` (a token with write access).")
    if commit_message is None:
        commit_message = f"Upload {output_dir.resolve().name}"
    logger.info(f"Uploading {len(plan)} files from {output_dir} to {repo_id}: {', '.join(p for p, _ in plan)}")
    try:
        api.create_repo(repo_id, private=private, repo_type="model", exist_ok=True)
        if revision and revision != "main":
            api.create_branch(repo_id, branch=revision, repo_type="model", exist_ok=True)
        operations = [CommitOperationAdd(path_in_repo=path, path_or_fileobj=str(local)) for path, local in plan]
        info = api.create_commit(
            repo_id, operations=operations, commit_message=commit_message, revision=revision, repo_type="model"
        )
    except Exception as error:  # any failure (HTTP, network, file) gets the same clear message and retry command
        raise failure(_describe_failure(error, api.endpoint)) from error
    logger.info(f"Pushed {output_dir} to {repo_id}: {info.commit_url}")
    return info.commit_url


def main(argv: list[str] | None = None) -> str | list[str]:
    """Command-line entry: `push` uploads a run, `files` writes the card and lists what would be uploaded."""
    parser = argparse.ArgumentParser(prog="python -m finetune.hub", description="Push a run to the Hugging Face Hub.")
    commands = parser.add_subparsers(dest="command", required=True)
    push = commands.add_parser(
        "push",
        help="Upload a run's model, card, results and comparison report.",
        description="Upload a run's model, card, results and comparison report. The token comes from HF_TOKEN or "
        "`hf auth login`.",
    )
    push.add_argument("output_dir", metavar="OUTPUT_DIR", help="A run's output directory.")
    push.add_argument("--repo-id", required=True, help="Target model repo, e.g. your-name/vit-cifar10.")
    push.add_argument("--private", action="store_true", default=None, help="Create the repo as private.")
    push.add_argument("--revision", help="Branch to push to (created if missing); default main.")
    push.add_argument("--commit-message", help="Commit message (default: Upload <run>).")
    files = commands.add_parser("files", help="Write the model card and list the files a push would upload.")
    files.add_argument("output_dir", metavar="OUTPUT_DIR", help="A run's output directory.")
    files.add_argument("--repo-id", help="Repo id the card is written for.")
    args = parser.parse_args(argv)

    if args.command == "files":
        write_model_card(args.output_dir, args.repo_id)
        paths = [path for path, _ in upload_plan(args.output_dir)]
        print("\n".join(paths))
        return paths
    try:
        url = push_output_dir(args.output_dir, args.repo_id, args.private, args.revision, args.commit_message)
    except (HubPushError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(1) from None
    print(url)
    return url


if __name__ == "__main__":
    main()
