"""Push a run's output directory to the Hugging Face Hub as a model repo.

    python -m finetune.tools.hub push OUTPUT_DIR --repo_id you/vit-cifar10 [--private] [--revision R] [--timeout S]
    python -m finetune.tools.hub files OUTPUT_DIR      # write the model card and list what a push would upload

Only what someone needs to use the model goes up: weights, config, image processor, the ScratchViT code files, the
model card (README.md, written here first), results.json and the comparison report when there is one. Checkpoints,
optimizer states, training_args.bin and TensorBoard logs stay local; the push changes no local file but README.md,
and keeps (and uploads as it is) a README.md edited since it was written.
The token (argument, `HF_TOKEN`, or `hf auth login`) is sent only in the Authorization header, never logged.

Every request waits at most `--timeout` seconds (else `FINETUNE_HUB_TIMEOUT`, else 60) and one that times out, loses
its connection or gets a 408, 429 or 5xx answer is sent again after 2, 4, ... seconds, `--retries` times (default 2).
A push that still fails raises `HubPushError` naming the cause, with the command that retries it.
"""

import contextlib
import fnmatch
import json
import logging
import os
import shlex
import sys
import time
import urllib.parse
import urllib.request
from os.path import expanduser
from pathlib import Path

import httpx2
from huggingface_hub import CommitOperationAdd, HfApi, get_session, get_token, set_client_factory
from huggingface_hub.errors import HfHubHTTPError, HFValidationError, OfflineModeIsEnabled
from huggingface_hub.utils import validate_repo_id

from finetune.errors import ArgumentParser, one_line, run_command
from finetune.locations import upload_switch
from finetune.results import RESULTS_NAME
from finetune.tools.model_card import (
    CARD_NAME,
    LEGACY_WEIGHT_PATTERNS,
    check_trained_run,
    edited_card,
    find_comparison_dir,
    run_dir_of,
    write_model_card,
)
from finetune.tools.predict import add_flag


logger = logging.getLogger(__name__)

# Top-level files of a run directory that make up the model repo; everything else stays local.
MODEL_FILE_PATTERNS = (
    "config.json",
    "adapter_config.json",  # a LoRA run: the peft adapter (adapter_model.safetensors) with its base model's name
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
COMPARISON_FILE_PATTERNS = ("*.md", "*.png", "*.json")

TIMEOUT_ENV = "FINETUNE_HUB_TIMEOUT"
DEFAULT_TIMEOUT = 60.0  # seconds: long enough for the Hub to answer a large commit, short enough to notice a hang
DEFAULT_RETRIES = 2
RETRY_WAIT_SECONDS = 2.0  # before the first retry; doubles for each further one
MAX_RETRY_WAIT_SECONDS = 30.0
# Answers that say "try again later": request timeout, rate limit, server errors.
RETRY_STATUS_CODES = (408, 429, 500, 502, 503, 504)
# Network failures worth another attempt; anything else (a bad URL, a local file error) fails at once.
RETRY_EXCEPTIONS = (httpx2.TimeoutException, httpx2.NetworkError, httpx2.RemoteProtocolError)
HTTP_HINTS = {
    401: "the token was rejected: set HF_TOKEN or run `hf auth login` with a token that has write access",
    403: "the token may not write to this repo or namespace: check the repo id and the token's permissions",
    404: "the repo or revision was not found: check the repo id and that the token can see it",
}


class HubPushError(RuntimeError):
    """A push that failed; the message says why, that the local files are intact, and how to retry."""


class HubRequestError(RuntimeError):
    """A Hub request that failed on every attempt. Not an `httpx2` exception, so that the retry loops inside
    huggingface_hub do not repeat what `BoundedRetryTransport` has retried."""


def _describe_status(status: int, where: str, detail: str, attempts: int = 1) -> str:
    text = f"HTTP {status}" + (f" on {where}" if where else "") + (f": {detail}" if detail else "")
    text += f" ({attempts} attempts)" if attempts > 1 else ""
    hint = HTTP_HINTS.get(status, "the Hub had a server error: retry later" if status >= 500 else "")
    return f"{text}; {hint}" if hint else text


def _describe_network_error(error: BaseException, endpoint: str, where: str, tries: str, timeout: float) -> str:
    cause = one_line(error)
    if isinstance(error, httpx2.TimeoutException):
        return (
            f"no answer from {endpoint} within {timeout:g} s on {where} ({tries}; {cause}); the Hub or the network is "
            f"slow or down: retry later, or allow more time (--timeout or {TIMEOUT_ENV})"
        )
    if isinstance(error, httpx2.ConnectError):
        return f"Could not reach {endpoint} ({tries}; {cause}): check the network connection (or HF_ENDPOINT)"
    return (
        f"the connection to {endpoint} broke on {where} ({tries}; {cause}); the Hub or a proxy dropped it: retry later"
    )


class BoundedRetryTransport(httpx2.BaseTransport):
    """Retries a request on a network error or a retryable status, with backoff: only requests with the client's
    timeout and a body that can be sent again (every Hub API call of a push). A streamed upload is passed through once
    (huggingface_hub's own retry rewinds the file), as is a request with a timeout of its own (best-effort lookups)."""

    def __init__(self, inner: httpx2.BaseTransport, retries: int, timeout: float):
        self.inner, self.retries, self.timeout = inner, retries, timeout
        self.timeouts = httpx2.Timeout(timeout).as_dict()

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        if request.extensions.get("timeout") != self.timeouts or not isinstance(request.stream, httpx2.ByteStream):
            return self.inner.handle_request(request)
        where, url, attempts = f"{request.method} {request.url.path}", request.url, self.retries + 1
        endpoint = f"{url.scheme}://{url.host}" + (f":{url.port}" if url.port else "")
        for attempt in range(1, attempts + 1):
            start = time.perf_counter()
            tries = "1 attempt" if attempt == 1 else f"{attempt} attempts"
            try:
                response = self.inner.handle_request(request)
            except RETRY_EXCEPTIONS as error:
                reason = one_line(error)
                failure = _describe_network_error(error, endpoint, where, tries, self.timeout)
            else:
                logger.debug(f"{where}: {response.status_code} in {time.perf_counter() - start:.1f} s")
                if response.status_code not in RETRY_STATUS_CODES:
                    return response
                response.read()
                response.close()
                reason = f"HTTP {response.status_code}"
                failure = _describe_status(response.status_code, where, _server_message(response.content), attempt)
            if attempt == attempts:
                raise HubRequestError(failure)
            wait = min(RETRY_WAIT_SECONDS * 2 ** (attempt - 1), MAX_RETRY_WAIT_SECONDS)
            logger.warning(f"{where}: {reason} (attempt {attempt}/{attempts}); retrying in {wait:g} s")
            time.sleep(wait)

    def close(self) -> None:
        self.inner.close()


def _server_message(body: bytes) -> str:
    """The `error` field of the Hub's JSON error answers, else the start of the body."""
    with contextlib.suppress(ValueError):
        payload = json.loads(body)
        if isinstance(payload, dict) and payload.get("error"):
            return str(payload["error"])
    return body[:200].decode(errors="replace").strip()


@contextlib.contextmanager
def bounded_hub_requests(endpoint: str, timeout: float, retries: int):
    """Within the block, every Hub request waits at most `timeout` seconds and is retried up to `retries` times."""
    # huggingface_hub sends its requests through one shared client, made by the factory of its public
    # `set_client_factory`, with no timeout. Ours keep the library client's event hooks (offline mode, request ids)
    # and the proxy the environment names for the Hub's host. There is no getter for the factory, so on exit a factory
    # of clients made as the library's own takes its place. Xet uploads run in hf_xet's own client, with its own
    # timeouts and retries (`HF_XET_CLIENT_READ_TIMEOUT`, `HF_XET_CLIENT_RETRY_MAX_DURATION`).
    library = get_session()
    hooks, redirects, default_timeout = library.event_hooks, library.follow_redirects, library.timeout
    host = urllib.parse.urlsplit(endpoint)
    proxy = None if urllib.request.proxy_bypass(host.hostname or "") else urllib.request.getproxies().get(host.scheme)

    def bounded() -> httpx2.Client:
        transport = BoundedRetryTransport(httpx2.HTTPTransport(proxy=proxy), retries, timeout)
        return httpx2.Client(event_hooks=hooks, follow_redirects=redirects, timeout=timeout, transport=transport)

    set_client_factory(bounded)
    try:
        yield
    finally:
        set_client_factory(
            lambda: httpx2.Client(event_hooks=hooks, follow_redirects=redirects, timeout=default_timeout)
        )


def resolve_timeout(timeout: float | str | None) -> float:
    """`timeout`, else `FINETUNE_HUB_TIMEOUT`, else `DEFAULT_TIMEOUT`: a positive number of seconds."""
    source = "timeout" if timeout is not None else TIMEOUT_ENV
    timeout = (os.environ.get(TIMEOUT_ENV) or DEFAULT_TIMEOUT) if timeout is None else timeout
    with contextlib.suppress(TypeError, ValueError):
        if 0 < float(timeout) < float("inf"):
            return float(timeout)
    raise ValueError(f"{source} must be a positive number of seconds (e.g. 60), got {timeout!r}.")


def _size(num_bytes: float) -> str:
    for unit in ("B", "kB", "MB"):
        if num_bytes < 1000:
            return f"{num_bytes:.0f} {unit}" if unit == "B" else f"{num_bytes:.1f} {unit}"
        num_bytes /= 1000
    return f"{num_bytes:.2f} GB"


def upload_plan(output_dir: str | os.PathLike) -> list[tuple[str, Path]]:
    """The files a push uploads, as sorted `(path_in_repo, local_path)` pairs."""

    def matching(folder: Path, patterns) -> list[Path]:
        files = sorted(p for p in folder.iterdir() if p.is_file())  # links too: DVC and git-annex keep files so
        return [p for p in files if any(fnmatch.fnmatch(p.name, pattern) for pattern in patterns)]

    output_dir = Path(output_dir)
    chosen = matching(output_dir, MODEL_FILE_PATTERNS)
    if not any(p.suffix == ".safetensors" for p in chosen):
        chosen += matching(output_dir, LEGACY_WEIGHT_PATTERNS)
    plan = [(p.name, p) for p in chosen]
    run_dir = run_dir_of(output_dir)
    if run_dir != output_dir:  # a LoRA run's merged model: the results (and thresholds) of its run go with it
        plan.append((RESULTS_NAME, run_dir / RESULTS_NAME))
    comparison_dir = find_comparison_dir(run_dir)
    if comparison_dir is not None:
        plan += [(f"comparison/{p.name}", p) for p in matching(comparison_dir, COMPARISON_FILE_PATTERNS)]
    return sorted(plan)


def _upload(path_in_repo: str, local: Path) -> str | bytes:
    """What goes up for a file: the file itself, but a card (edited by hand, so kept as it is) with its link to a
    comparison report beside the run (`../comparison/`) pointing where the push puts the report (`comparison/`)."""
    if path_in_repo != CARD_NAME:
        return str(local)
    return local.read_bytes().replace(b"../comparison/", b"comparison/")


def retry_command(output_dir, repo_id, private=None, revision=None, commit_message=None, timeout=None, retries=None):
    """The shell command that repeats a push with the same options."""
    parts = ["python", "-m", "finetune.tools.hub", "push", str(output_dir), "--repo_id", repo_id]
    parts += ["--private"] if private else []
    for flag, value in (("revision", revision), ("commit_message", commit_message)):
        parts += [f"--{flag}", value] if value else []
    parts += ["--timeout", f"{timeout:g}"] if timeout is not None else []
    parts += ["--retries", str(retries)] if retries is not None else []
    return shlex.join(parts)


def _describe_failure(error: BaseException, endpoint: str) -> str:
    """Why a Hub call failed (the HTTP status and the server's message, or the network error) and what to do."""
    if isinstance(error, HubRequestError):
        return str(error)
    if isinstance(error, HfHubHTTPError) and error.response is not None:
        request = error.response.request
        where = f"{request.method} {request.url.path}" if request is not None else ""
        return _describe_status(error.response.status_code, where, error.server_message or str(error).splitlines()[0])
    if isinstance(error, OfflineModeIsEnabled):  # a ConnectionError, but its message names its own fix
        return one_line(error).rstrip(".")
    if isinstance(error, (ConnectionError, TimeoutError)) or "connect" in type(error).__name__.lower():
        return f"{one_line(error)}; Could not reach {endpoint}: check the network connection (or HF_ENDPOINT)"
    return one_line(error)


def push_output_dir(
    output_dir: str | os.PathLike,
    repo_id: str,
    private: bool | None = None,
    revision: str | None = None,
    commit_message: str | None = None,
    token: str | None = None,
    endpoint: str | None = None,
    timeout: float | None = None,
    retries: int | None = None,
) -> str:
    """Write the model card, then upload a run's output directory to `repo_id` in one commit (creating the repo and
    the branch `revision` when missing); returns the commit's URL. A failed push raises `HubPushError`."""
    output_dir = Path(output_dir)
    check_trained_run(output_dir, "push")
    try:  # before the card, which names the repo, is written, and without a retry command that cannot succeed
        validate_repo_id(repo_id)
    except HFValidationError:
        raise ValueError(
            f"{repo_id!r} is not a Hub repo id: pass `--repo_id namespace/name` (letters, digits, '-', '_' and '.'), "
            "e.g. you/vit-cifar10."
        ) from None
    seconds = resolve_timeout(timeout)
    if retries is not None and (isinstance(retries, bool) or not isinstance(retries, int) or retries < 0):
        raise ValueError(f"retries must be a whole number >= 0 (e.g. 2), got {retries!r}.")
    retry = retry_command(output_dir, repo_id, private, revision, commit_message, timeout, retries)
    retries = DEFAULT_RETRIES if retries is None else retries
    token = token or get_token()
    api = HfApi(endpoint=endpoint, token=token)
    changed = ""  # the local file the push changed: none before the card is written (without a token, none at all)

    def failure(cause: str) -> HubPushError:
        message = (
            f"Pushing {output_dir} to the Hub repo {repo_id!r} failed: {cause}. Every local file in {output_dir} "
            f"is still in place{changed}.\nRetry with: {retry}"
        )
        return HubPushError(message.replace(token, "***") if token else message)

    switch = upload_switch()
    if switch:  # said before the card is written, and before the token is asked for
        raise failure(f"{switch}=1 is set, which switches the Hub off; unset it (`unset {switch}`) to push")
    if not token:
        raise failure("no Hub token; set HF_TOKEN or log in with `hf auth login` (a token with write access)")
    if edited_card(output_dir) is None:  # an edited card is kept and uploaded as it is
        changed = f" (only the model card {CARD_NAME} was written)"
    write_model_card(output_dir, repo_id, keep_edited=True)
    plan = upload_plan(output_dir)
    sizes = {path: local.stat().st_size for path, local in plan}
    total = _size(sum(sizes.values()))
    logger.info(
        f"Uploading {len(plan)} files ({total}) from {output_dir} to {repo_id}{f'@{revision}' * bool(revision)}:"
    )
    for path, size in sizes.items():
        logger.info(f"  {path} ({_size(size)})")
    logger.info(
        f"Each Hub request waits at most {seconds:g} s, with up to {retries} {'retry' if retries == 1 else 'retries'}."
    )
    start = time.perf_counter()
    try:
        with bounded_hub_requests(api.endpoint, seconds, retries):
            logger.info(f"Creating {repo_id} on {api.endpoint} if it does not exist")
            api.create_repo(repo_id, private=private, repo_type="model", exist_ok=True)
            if revision and revision != "main":
                logger.info(f"Creating branch {revision} if it does not exist")
                api.create_branch(repo_id, branch=revision, repo_type="model", exist_ok=True)
            logger.info(f"Committing {len(plan)} files ({total})")
            operations = [
                CommitOperationAdd(path_in_repo=path, path_or_fileobj=_upload(path, local)) for path, local in plan
            ]
            info = api.create_commit(
                repo_id,
                operations=operations,
                commit_message=commit_message or f"Upload {output_dir.resolve().name}",
                revision=revision,
                repo_type="model",
            )
    except Exception as error:  # any failure (HTTP, network, file) gets the same clear message and retry command
        raise failure(_describe_failure(error, api.endpoint)) from error
    logger.info(f"Pushed {output_dir} to {repo_id} in {time.perf_counter() - start:.1f} s: {info.commit_url}")
    return info.commit_url


def main(argv: list[str] | None = None) -> str | list[str]:
    """`push` uploads a run, `files` writes the card and lists what would be uploaded. A failed push ends with one
    line naming the problem and the fix, then the retry command, and exit status 1; `--debug` shows the traceback."""
    parser = ArgumentParser(prog="python -m finetune.tools.hub", description="Push a run to the Hugging Face Hub.")
    commands = parser.add_subparsers(dest="command", required=True)
    push = commands.add_parser(
        "push",
        help="Upload a run's model, card, results and comparison report.",
        description="Upload a run's model, card, results and comparison report. The token comes from HF_TOKEN or "
        "`hf auth login`.",
    )
    push.add_argument("output_dir", metavar="OUTPUT_DIR", type=expanduser, help="A run's output directory.")
    add_flag(push, "repo_id", required=True, help="Target model repo, e.g. your-name/vit-cifar10.")
    add_flag(push, "private", action="store_true", default=None, help="Create the repo as private.")
    add_flag(push, "revision", help="Branch to push to (created if missing); default main.")
    add_flag(push, "commit_message", help="Commit message (default: Upload <run>).")
    timeout_help = f"Seconds each Hub request may wait (default: ${TIMEOUT_ENV}, else {DEFAULT_TIMEOUT:g})."
    add_flag(push, "timeout", type=float, metavar="SECONDS", help=timeout_help)
    retries_help = f"Retries of a request that timed out or got a server error (default {DEFAULT_RETRIES})."
    add_flag(push, "retries", type=int, metavar="N", help=retries_help)
    add_flag(push, "debug", action="store_true", help="Log every request and show the traceback of a failure.")
    files = commands.add_parser("files", help="Write the model card and list the files a push would upload.")
    files.add_argument("output_dir", metavar="OUTPUT_DIR", type=expanduser, help="A run's output directory.")
    add_flag(files, "repo_id", help="Repo id the card is written for.")
    args = parser.parse_args(argv)

    try:
        if args.command == "files":
            check_trained_run(Path(args.output_dir), "push")
            write_model_card(args.output_dir, args.repo_id, keep_edited=True)
            paths = [path for path, _ in upload_plan(args.output_dir)]
            print("\n".join(paths))
            return paths
        logging.basicConfig(format="%(levelname)s - %(name)s - %(message)s", handlers=[logging.StreamHandler()])
        for name in ("finetune", logger.name):  # `python -m finetune.tools.hub` names this module's logger __main__
            logging.getLogger(name).setLevel(logging.DEBUG if args.debug else logging.INFO)
        url = push_output_dir(
            args.output_dir, args.repo_id, args.private, args.revision, args.commit_message,
            timeout=args.timeout, retries=args.retries,
        )  # fmt: skip
    except (HubPushError, FileNotFoundError, NotADirectoryError, ValueError) as error:
        if args.command == "push" and args.debug:
            raise
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(1) from None
    print(url)
    return url


if __name__ == "__main__":
    sys.exit(run_command(main, keep_debug=True))
