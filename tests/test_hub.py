"""Pushing a run to the Hub: what is uploaded, that it loads anywhere, the model card, the token, and failures.

The Hub is a local stdlib HTTP server implementing just what `HfApi.create_repo`, `create_branch` and
`create_commit` call (repo creation, README metadata validation, preupload, commit with inline base64 files). A silent
server (accepts connections, never answers) and routes that hang or fail a few times test timeouts and retries.
"""

import base64
import hashlib
import json
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers_runs import make_run_dir, tiny_scratch_model
from huggingface_hub import HfApi, ModelCard, constants, get_session
from huggingface_hub.errors import HfHubHTTPError
from PIL import Image
from transformers import (
    AutoImageProcessor,
    AutoModelForImageClassification,
    ViTConfig,
    ViTForImageClassification,
    ViTImageProcessor,
)

from finetune.errors import run_command
from finetune.results import Results
from finetune.tools import hub, model_card
from finetune.tools.compare import write_comparison


TOKEN = "hf_secret123"


class FakeHub:
    """A threaded local HTTP server standing in for the Hub API; records every request.

    `fail` maps a route (`create`, `branch`, `preupload`, `commit`) to an HTTP status to answer with, to `"close"` to
    drop the connection without answering, or to `"hang"` to read the request and never answer; each route fails its
    first `failures` requests (all of them by default) and `attempts` counts the requests of each route.
    """

    def __init__(self, fail: dict | None = None, failures: int = 10**6):
        self.fail, self.failures = fail or {}, failures
        self.attempts: Counter = Counter()
        self.failed: Counter = Counter()
        self.release = threading.Event()  # set on exit: ends the handlers that hang
        self.requests: list[dict] = []
        self.created: list[dict] = []
        self.branches: list[tuple[str, str]] = []
        self.commits: list[dict] = []
        hub_ = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # keep the test output quiet
                pass

            def do_GET(self):
                hub_.requests.append(
                    {"method": "GET", "path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}}
                )
                self.reply(404, {"error": "Not found"})

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                path = self.path.split("?")[0]
                hub_.requests.append(
                    {
                        "method": "POST",
                        "path": path,
                        "headers": {k.lower(): v for k, v in self.headers.items()},
                        "body": body,
                    }
                )
                routes = [
                    ("create", r"/api/repos/create"),
                    ("validate", r"/api/validate-yaml"),
                    ("branch", r"/api/models/(?P<repo>[^/]+/[^/]+)/branch/(?P<rev>[^/]+)"),
                    ("preupload", r"/api/models/(?P<repo>[^/]+/[^/]+)/preupload/(?P<rev>[^/]+)"),
                    ("commit", r"/api/models/(?P<repo>[^/]+/[^/]+)/commit/(?P<rev>[^/]+)"),
                ]
                matches = [(route, re.fullmatch(pattern, path)) for route, pattern in routes]
                route, match = next(((r, m) for r, m in matches if m), (None, None))
                if match is None:
                    return self.reply(404, {"error": f"no route {path}"})
                hub_.attempts[route] += 1
                failure = hub_.fail.get(route) if hub_.failed[route] < hub_.failures else None
                if failure is not None:
                    hub_.failed[route] += 1
                if failure == "hang":
                    hub_.release.wait(30)
                    self.close_connection = True
                    return
                if failure == "close":
                    self.close_connection = True
                    return
                if failure is not None:
                    return self.reply(failure, {"error": f"Simulated failure of {route}"})
                getattr(self, f"handle_{route}")(body, **match.groupdict())

            def handle_create(self, body):
                payload = json.loads(body)
                hub_.created.append(payload)
                self.reply(200, {"url": f"{hub_.url}/{payload['organization']}/{payload['name']}"})

            def handle_validate(self, body):
                self.reply(200, {"errors": [], "warnings": []})

            def handle_branch(self, body, repo, rev):
                hub_.branches.append((repo, rev))
                self.reply(200, {})

            def handle_preupload(self, body, repo, rev):
                files = json.loads(body)["files"]
                answer = [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]
                self.reply(200, {"files": answer, "commitOid": "0" * 40})

            def handle_commit(self, body, repo, rev):
                lines = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
                files = {
                    line["value"]["path"]: base64.b64decode(line["value"]["content"])
                    for line in lines
                    if line["key"] == "file"
                }
                header = next(line["value"] for line in lines if line["key"] == "header")
                others = [line["key"] for line in lines if line["key"] not in ("file", "header")]
                oid = hashlib.sha1(body).hexdigest()
                hub_.commits.append(
                    {"repo": repo, "revision": rev, "summary": header["summary"], "files": files, "others": others}
                )
                self.reply(200, {"commitUrl": f"{hub_.url}/{repo}/commit/{oid}", "commitOid": oid})

            def reply(self, status, payload):
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


class SilentServer:
    """A server on 127.0.0.1 that accepts every connection and never sends a byte (a hung Hub or proxy)."""

    def __init__(self):
        self.socket = socket.create_server(("127.0.0.1", 0))
        self.socket.settimeout(0.1)
        self.url = f"http://127.0.0.1:{self.socket.getsockname()[1]}"
        self.connections: list[socket.socket] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.serve, daemon=True)

    def serve(self):
        while not self.stop.is_set():
            try:
                self.connections.append(self.socket.accept()[0])
            except TimeoutError:
                pass

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(5)
        for connection in self.connections:
            connection.close()
        self.socket.close()


@pytest.fixture(autouse=True)
def online(monkeypatch):
    """The suite runs with HF_HUB_OFFLINE=1, which blocks every request; these tests only talk to localhost."""
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv(hub.TIMEOUT_ENV, raising=False)
    monkeypatch.setattr(hub, "RETRY_WAIT_SECONDS", 0.01)  # retries keep their count, not their 2 s, 4 s waits


@pytest.fixture(scope="module")
def both_output_template(tmp_path_factory):
    root = tmp_path_factory.mktemp("template") / "out"
    make_run_dir(root / "pretrained", "pretrained", validation_accuracy=0.9134, test_accuracy=0.9021)
    make_run_dir(root / "scratch", "scratch", validation_accuracy=0.6245, test_accuracy=None, seed=1)
    write_comparison([root], root / "comparison")
    return root


@pytest.fixture
def both_output(both_output_template, tmp_path):
    """A fresh copy of a `model_type: both` output with its comparison, and the files a push must leave behind."""
    return Path(shutil.copytree(both_output_template, tmp_path / "out"))


def tree_hashes(folder: Path, skip: str | None = "README.md") -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != skip
    }


def test_the_cards_link_to_the_comparison_report_works_where_the_card_is_read(both_output):
    """Beside `model_type: both`'s comparison/ folder, a card read where it was written linked comparison/report.md,
    which is there only once pushed (the push uploads the report under comparison/)."""
    scratch = both_output / "scratch"
    local = model_card.build_model_card(scratch).text
    assert (
        "is [../comparison/report.md](../comparison/report.md)." in local
        and (scratch / "../comparison/report.md").is_file()
    )
    assert "is [comparison/report.md](comparison/report.md)." in model_card.build_model_card(scratch, "me/vit").text


def test_a_teacher_is_named_as_a_hub_id_or_as_a_local_model(tmp_path):
    """A local teacher `runs/teacher` was named as `runs/teacher`, which reads as a Hub id on the Hub; and where the
    folder had been moved before the card was written, a local teacher was named as a Hub id."""
    hyperparameters = {"teacher_model_name_or_path": "google/vit-base", "distillation_type": "hard"}
    hyperparameters["distillation_alpha"] = 0.5
    results = Results(run_name="student", model_type="scratch", hyperparameters=hyperparameters)
    taught = model_card._teaching(results, tmp_path / "runs" / "student")
    assert taught == " It was taught by `google/vit-base` (hard distillation, alpha 0.5)."
    (tmp_path / "runs" / "teacher").mkdir(parents=True)
    hyperparameters["teacher_model_name_or_path"] = "runs/teacher"
    taught = model_card._teaching(results, tmp_path / "runs" / "student")  # an earlier results.json: no record
    assert taught == " It was taught by a local model, `runs/teacher` (hard distillation, alpha 0.5)."
    (tmp_path / "runs" / "teacher").rmdir()
    results.teacher_is_local = True  # recorded by the run, where the folder was
    taught = model_card._teaching(results, tmp_path / "runs" / "student")
    assert taught == " It was taught by a local model, `runs/teacher` (hard distillation, alpha 0.5)."


def test_a_card_cut_short_is_not_kept_as_one_edited_by_hand(tmp_path):
    """Written in place, a card cut short (a full disk, a stop) read as one edited by hand: every later `card` refused
    it, and `push` uploaded it."""
    import resource
    import signal

    run_dir = make_run_dir(tmp_path / "run")

    def small_files():  # a write past 1,000 bytes fails (EFBIG), as one on a full disk does
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))

    command = [sys.executable, "-m", "finetune.tools.model_card", str(run_dir)]
    proc = subprocess.run(command, capture_output=True, text=True, preexec_fn=small_files)
    assert proc.returncode == 1 and "File too large" in proc.stderr, proc.stderr[-2000:]
    assert sorted(p.name for p in run_dir.iterdir() if "README" in p.name) == []  # no cut card, no temporary file
    card = model_card.main([str(run_dir)])  # room again
    assert card.read_text().startswith("---") and model_card.edited_file(card) is None


def test_upload_plan_has_the_model_and_nothing_big_or_private(both_output):
    scratch = both_output / "scratch"
    hub.write_model_card(scratch)
    plan = dict(hub.upload_plan(scratch))
    comparison = {f"comparison/{p.name}" for p in (both_output / "comparison").iterdir()}
    model_files = {
        "README.md",
        "config.json",
        "configuration_scratch_vit.py",
        "model.safetensors",
        "modeling_scratch_vit.py",
        "preprocessor_config.json",
        "results.json",
    }
    assert set(plan) == model_files | comparison
    assert "comparison/report.md" in plan and "comparison/learning_curves.png" in plan
    assert not any(path.startswith(("checkpoint-", "runs/")) for path in plan)
    for left_out in ("training_args.bin", "trainer_state.json", "optimizer.pt"):
        assert left_out not in plan
    assert plan["config.json"] == scratch / "config.json"

    pretrained = dict(hub.upload_plan(both_output / "pretrained"))
    assert not any(path.endswith(".py") for path in pretrained)  # transformers' ViT ships no code


def test_uploaded_folder_loads_in_a_clean_process(both_output, tmp_path):
    """The files exactly as pushed load with trust_remote_code=True where neither scratch_vit nor finetune can be
    imported, and give the logits of the model loaded here."""
    image_path = tmp_path / "image.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (23, 31, 3), dtype=np.uint8)).save(image_path)
    uploaded, expected = {}, {}
    for name in ("scratch", "pretrained"):
        run = both_output / name
        hub.write_model_card(run, f"me/{name}")
        target = tmp_path / "uploaded" / name
        for path_in_repo, local in hub.upload_plan(run):
            (target / path_in_repo).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(local, target / path_in_repo)
        uploaded[name] = str(target)
        model = AutoModelForImageClassification.from_pretrained(run).eval()
        processor = AutoImageProcessor.from_pretrained(run)
        with torch.no_grad():
            expected[name] = model(**processor(Image.open(image_path).convert("RGB"), return_tensors="pt")).logits

    child = tmp_path / "child.py"
    child.write_text(
        textwrap.dedent(
            """
            import importlib.abc, json, sys

            class Block(importlib.abc.MetaPathFinder):
                def find_spec(self, name, path=None, target=None):
                    if name.split(".")[0] in ("scratch_vit", "finetune"):
                        raise ImportError(f"{name} is blocked in this process")

            sys.meta_path.insert(0, Block())
            try:
                import scratch_vit  # noqa
            except ImportError:
                pass
            else:
                raise SystemExit("scratch_vit is importable")

            import torch
            from PIL import Image
            from transformers import AutoImageProcessor, AutoModelForImageClassification

            dirs, image_path, out_path = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
            logits, modules = {}, {}
            for name, folder in dirs.items():
                model = AutoModelForImageClassification.from_pretrained(folder, trust_remote_code=True).eval()
                processor = AutoImageProcessor.from_pretrained(folder, trust_remote_code=True)
                with torch.no_grad():
                    inputs = processor(Image.open(image_path).convert("RGB"), return_tensors="pt")
                    logits[name] = model(**inputs).logits
                modules[name] = type(model).__module__
            torch.save({"logits": logits, "modules": modules}, out_path)
            """
        )
    )
    workdir = tmp_path / "empty"
    workdir.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HF_TOKEN")}
    env.update(HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(tmp_path / "modules"), HF_HOME=str(tmp_path / "hf_home"))
    out = tmp_path / "child_out.pt"
    result = subprocess.run(
        [sys.executable, str(child), json.dumps(uploaded), str(image_path), str(out)],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    child_out = torch.load(out)
    assert child_out["modules"]["scratch"].startswith("transformers_modules.")  # the uploaded code, not ours
    for name in ("scratch", "pretrained"):
        torch.testing.assert_close(child_out["logits"][name], expected[name], rtol=0, atol=0)


def test_push_to_a_local_hub(both_output, caplog):
    caplog.set_level(logging.DEBUG)
    scratch = both_output / "scratch"
    before = tree_hashes(both_output)
    with FakeHub() as server:
        url = hub.push_output_dir(
            scratch, "me/vit-scratch", private=True, revision="dev", token=TOKEN, endpoint=server.url
        )
    assert url.startswith(f"{server.url}/me/vit-scratch/commit/")
    assert server.created == [{"name": "vit-scratch", "organization": "me", "visibility": "private", "type": "model"}]
    assert server.branches == [("me/vit-scratch", "dev")]
    [commit] = server.commits
    assert commit["revision"] == "dev" and commit["others"] == []
    plan = dict(hub.upload_plan(scratch))
    assert set(commit["files"]) == set(plan)
    for path, content in commit["files"].items():
        assert content == plan[path].read_bytes()
    # the token went in the Authorization header of every request, and nowhere else
    assert server.requests and all(r["headers"].get("authorization") == f"Bearer {TOKEN}" for r in server.requests)
    assert not any(TOKEN.encode() in r.get("body", b"") for r in server.requests)
    for path in both_output.rglob("*"):
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes(), path
    assert caplog.records and not any(TOKEN in r.getMessage() for r in caplog.records)
    # nothing local changed but the card
    assert tree_hashes(both_output) == before

    card = commit["files"]["README.md"].decode()
    assert "trust_remote_code=True" in card
    assert "## Comparison" in card and "comparison/report.md" in card


def test_a_run_whose_files_are_links_pushes_the_files(both_output, tmp_path):
    """A run folder kept as links to its files (DVC's or git-annex's cache, `cp -rs`): the push uploads the files
    they point to. It uploaded only the card it had written, with exit 0."""
    scratch, linked = both_output / "scratch", tmp_path / "linked"
    linked.mkdir()
    for path in scratch.iterdir():
        (linked / path.name).symlink_to(path)
    with FakeHub() as server:
        hub.push_output_dir(linked, "me/vit-scratch", token=TOKEN, endpoint=server.url)
    [commit] = server.commits
    assert {"config.json", "model.safetensors", "modeling_scratch_vit.py", "results.json"} < set(commit["files"])
    assert commit["files"]["model.safetensors"] == (scratch / "model.safetensors").read_bytes()


def test_model_card_metadata_parses_back(both_output):
    for name in ("pretrained", "scratch"):
        run = both_output / name
        hub.write_model_card(run, f"me/vit-{name}")
        results = json.loads((run / "results.json").read_text())
        card = ModelCard.load(run / "README.md")
        data = card.data
        assert data.library_name == "transformers" and data.pipeline_tag == "image-classification"
        assert data.datasets == [results["dataset"]]
        assert {"image-classification", "vision", "vit"} <= set(data.tags)
        values = {r.metric_name: r.metric_value for r in data.eval_results}
        expected = {"Validation accuracy": results["validation"]["accuracy"]}
        if results["test"] is not None:
            expected["Test accuracy"] = results["test"]["accuracy"]
        assert values == expected
        assert all(r.task_type == "image-classification" and r.metric_type == "accuracy" for r in data.eval_results)
        assert data.model_name == f"vit-{name}"
        assert f'repo = "me/vit-{name}"' in card.text
        assert "`python -m finetune.tools.predict MODEL_DIR image.jpg` prints the top-3 classes" in card.text
        if name == "pretrained":
            assert data.base_model == results["model_name_or_path"] and data.license == "apache-2.0"
            assert "trust_remote_code" not in card.text and "custom_code" not in data.tags
        else:
            assert data.base_model is None
            assert {"scratch-vit", "custom_code"} <= set(data.tags)
            assert "from_pretrained(repo, trust_remote_code=True)" in card.text
        assert "| `learning_rate` |" in card.text and "Per-class accuracy" in card.text
        # results.train.loss is the Trainer's mean over the run's steps, not its last loss
        assert f"| mean training loss (whole run) | {results['train']['loss']:.4f} |" in card.text


def test_the_cards_comparison_names_its_datasets(both_output):
    """Any runs can be compared: the card says they share a dataset only when the report's rows do."""
    summary_path = both_output / "comparison" / "comparison.json"
    summary = json.loads(summary_path.read_text())
    dataset = summary["runs"][0]["dataset"]
    assert {row["dataset"] for row in summary["runs"]} == {dataset}
    card = hub.write_model_card(both_output / "scratch")
    assert f"compared below with the others of its comparison report, all on `{dataset}`;" in card
    summary["runs"][0]["dataset"] = "my_photos"
    summary_path.write_text(json.dumps(summary))
    card = hub.write_model_card(both_output / "scratch")
    assert "compared below with the others of its comparison report, on different datasets (see the table);" in card
    assert "same data" not in card and "| `my_photos` |" in card


def test_the_card_shows_the_one_line_pipeline_only_for_a_3_channel_model(both_output, tmp_path):
    """transformers' pipeline converts every image to RGB: a 1-channel model (digits) cannot run it."""
    from finetune.tools.model_card import write_model_card

    gray = make_run_dir(tmp_path / "gray", "scratch", model=tiny_scratch_model(num_channels=1), extras=False)
    card = write_model_card(gray)
    assert 'convert("L")' in card and "pipeline(" not in card
    assert 'pipeline("image-classification"' in write_model_card(both_output / "scratch")


def test_local_base_model_is_not_a_hub_id(both_output):
    run = both_output / "pretrained"
    results = json.loads((run / "results.json").read_text())
    results.update(model_name_or_path=str(both_output / "scratch"), dataset="/data/my_images")
    (run / "results.json").write_text(json.dumps(results))
    data = ModelCard(hub.write_model_card(run)).data
    assert data.base_model is None and data.datasets is None
    assert str(both_output) not in hub.write_model_card(run)  # no local paths in a public card
    assert data.eval_results[0].dataset_name == "my_images"
    # A path relative to the folder the run was launched from, not the current one, is local too: named, not linked.
    results["model_name_or_path"] = "out/scratch"  # from tmp_path, around the run: `--output_dir out/pretrained`
    (run / "results.json").write_text(json.dumps(results))
    card = ModelCard(hub.write_model_card(run))
    assert card.data.base_model is None and "huggingface.co/out" not in card.text
    assert "is the local checkpoint `scratch` (" in card.text
    # A run records that its base was a local folder (tests/test_run.py): still named, not linked, once it is gone.
    results.update(model_name_or_path="bases/vit", model_is_local=True)  # exists nowhere now: moved or deleted
    (run / "results.json").write_text(json.dumps(results))
    card = ModelCard(hub.write_model_card(run))
    assert card.data.base_model is None and "huggingface.co/bases" not in card.text
    assert "is the local checkpoint `vit` (" in card.text
    results["model_is_local"] = False  # read from the Hub: linked
    (run / "results.json").write_text(json.dumps(results))
    assert ModelCard(hub.write_model_card(run)).data.base_model == "bases/vit"


@pytest.mark.parametrize(
    "fail, cause",
    [
        ({"create": 500}, "HTTP 500 on POST /api/repos/create: Simulated failure of create"),
        ({"commit": 500}, "HTTP 500 on POST /api/models/me/vit/commit/main"),
        ({"create": 401}, "HTTP 401"),
        ({"create": "close"}, "RemoteProtocolError"),
    ],
)
def test_failed_push_says_why_and_how_to_retry(both_output, caplog, fail, cause):
    caplog.set_level(logging.DEBUG)
    run = both_output / "pretrained"
    before = tree_hashes(both_output)
    with FakeHub(fail=fail) as server:
        with pytest.raises(hub.HubPushError) as error:
            hub.push_output_dir(run, "me/vit", commit_message="first try", token=TOKEN, endpoint=server.url)
    message = str(error.value)
    assert cause in message
    assert "Every local file" in message and "still in place" in message
    assert f"python -m finetune.tools.hub push {run} --repo_id me/vit --commit_message 'first try'" in message
    if fail.get("create") == 401:
        assert "token was rejected" in message
    assert TOKEN not in message and not any(TOKEN in r.getMessage() for r in caplog.records)
    assert tree_hashes(both_output) == before
    assert (run / "README.md").is_file()  # the card is written even when the push fails


def test_unreachable_hub(both_output):
    with FakeHub() as server:
        url = server.url  # a port that nothing listens on once the server is closed
    with pytest.raises(hub.HubPushError, match=r"Could not reach http://127\.0\.0\.1"):
        hub.push_output_dir(both_output / "scratch", "me/vit", token=TOKEN, endpoint=url)


@pytest.mark.parametrize("token", [TOKEN, None])
def test_offline_mode_names_only_its_own_fix(both_output, monkeypatch, token):
    """Said before anything is written: the card was rewritten, and without a token the error asked for one."""
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    files = {p: p.read_bytes() for p in (both_output / "scratch").iterdir() if p.is_file()}
    with FakeHub() as server, pytest.raises(hub.HubPushError) as error:
        hub.push_output_dir(both_output / "scratch", "me/vit", token=token, endpoint=server.url)
    assert "HF_HUB_OFFLINE=1 is set, which switches the Hub off; unset it (`unset HF_HUB_OFFLINE`)" in str(error.value)
    assert "Could not reach" not in str(error.value) and "token" not in str(error.value) and not server.commits
    assert {p: p.read_bytes() for p in (both_output / "scratch").iterdir() if p.is_file()} == files


@pytest.mark.parametrize("repo_id", ["me/vit/scratch", "me/my vit", ""])
def test_a_repo_id_the_hub_refuses_is_said_before_any_file_or_request(both_output, repo_id):
    """It was said after the card had been written for that id, with a retry command of the same id."""
    before = tree_hashes(both_output, skip=None)
    with FakeHub() as server:
        with pytest.raises(ValueError, match=f"^{re.escape(repr(repo_id))} is not a Hub repo id: pass `--repo_id"):
            hub.push_output_dir(both_output / "scratch", repo_id, token=TOKEN, endpoint=server.url)
    assert server.requests == [] and tree_hashes(both_output, skip=None) == before


def test_no_token(both_output, monkeypatch):
    monkeypatch.setattr(hub, "get_token", lambda: None)
    before = tree_hashes(both_output, skip=None)
    with pytest.raises(hub.HubPushError, match="no Hub token") as error:
        hub.push_output_dir(both_output / "scratch", "me/vit", private=True, revision="v1")
    assert (
        f"python -m finetune.tools.hub push {both_output / 'scratch'} --repo_id me/vit --private --revision v1"
        in str(error.value)
    )
    # A push that cannot start changes no file, the card included (a card edited by hand was lost this way).
    assert tree_hashes(both_output, skip=None) == before and "still in place.\n" in str(error.value)


def test_a_card_edited_by_hand_is_kept_and_pushed_as_it_is(both_output, monkeypatch, capsys, caplog):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    run = both_output / "scratch"
    card = run / "README.md"
    hub.main(["files", str(run)])  # the card as written: rewritten by each push, for its repo id
    assert model_card.edited_card(run) is None and 'repo = "me/vit"' not in card.read_text()
    with FakeHub() as server:
        hub.push_output_dir(run, "me/vit", token=TOKEN, endpoint=server.url)
    assert 'repo = "me/vit"' in card.read_text() and model_card.edited_card(run) is None
    assert server.commits[0]["files"]["README.md"] == card.read_bytes()

    edited = card.read_text().replace("## How to use", "Trained on my photos, see notes.md.\n\n## How to use")
    card.write_text(edited)
    assert "[comparison/report.md](comparison/report.md)" in edited
    edited = edited.replace("comparison/report.md", "../comparison/report.md")  # as `card` writes it, there
    card.write_text(edited)
    someone_elses = both_output / "pretrained" / "README.md"  # no mark at all: not written here
    someone_elses.write_text("# My model\n")
    for folder, text in ((run, edited), (both_output / "pretrained", "# My model\n")):
        assert model_card.edited_card(folder) == folder / "README.md"
        hub.main(["files", str(folder)])
        with FakeHub() as server:
            hub.push_output_dir(folder, "me/other", token=TOKEN, endpoint=server.url)
        assert (folder / "README.md").read_text() == text
        # The user's card went up, its link to the comparison report where the push put the report.
        assert server.commits[0]["files"]["README.md"].decode() == text.replace("../comparison/", "comparison/")
        assert f"Keeping {folder / 'README.md'} as it is" in caplog.text
        # `card` says why it writes nothing and how to write a new card, in one line, exit status 1
        assert run_command(model_card.main, [str(folder)]) == 1
        [line] = capsys.readouterr().err.strip().splitlines()
        assert line == (
            f"error: {folder / 'README.md'} was edited after the card was written (or not written here), and is "
            f"kept. To write a new card, move it away first: mv {folder / 'README.md'} {folder / 'README.edited.md'}"
        )
        assert (folder / "README.md").read_text() == text
    # A failed push says it changed no file when the card it kept was the user's.
    with FakeHub(fail={"commit": 500}) as server, pytest.raises(hub.HubPushError) as error:
        hub.push_output_dir(run, "me/vit", token=TOKEN, endpoint=server.url)
    assert "is still in place.\n" in str(error.value) and card.read_text() == edited


def test_not_a_run_directory(both_output):
    with pytest.raises(FileNotFoundError, match="push pretrained, scratch separately|push scratch, pretrained"):
        hub.push_output_dir(both_output, "me/vit", token=TOKEN)


@pytest.mark.parametrize("command", ["files", "push", "card"])
def test_a_folder_without_weights_is_refused_before_the_card_is_written(both_output, monkeypatch, capsys, command):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    run = both_output / "scratch"
    evaluation = both_output / "evaluation"  # an evaluation-only run writes results.json and no model
    evaluation.mkdir()
    shutil.copy(run / "results.json", evaluation)
    onnx = run / "onnx"  # what `vit-finetune export` writes
    onnx.mkdir()
    for name in ("config.json", "preprocessor_config.json", "results.json"):
        shutil.copy(run / name, onnx)
    (onnx / "model.onnx").write_bytes(b"onnx")
    interrupted = both_output / "interrupted"  # a run stopped before its end: checkpoints only
    for step in (3, 6):
        shutil.copytree(run / "checkpoint-3", interrupted / f"checkpoint-{step}")
    checkpoint = run / "checkpoint-3"  # exported into checkpoint-3/onnx: not a run of its own
    untrained = both_output / "source_init"  # a model no run wrote (the quickstart's): no results.json
    shutil.copytree(run, untrained, ignore=shutil.ignore_patterns("results.json", "checkpoint-*", "onnx"))
    shutil.copytree(onnx, checkpoint / "onnx")
    verb = "card" if command == "card" else "push"
    for folder, problem in (
        (
            evaluation,
            f"{evaluation} holds no trained model: missing config.json, weights (model.safetensors). It is an "
            f"evaluation-only run's output: {verb} the run that trained the model.",
        ),
        (onnx, f"{onnx} is an ONNX export, which the model card does not describe: {verb} the run folder {run} (its"),
        (
            interrupted,
            f"{interrupted} holds no trained model: missing config.json, results.json, weights (model.safetensors). "
            "Its run has not finished (checkpoint-* folders, no results.json): resume it with the same command and "
            f"`--resume_from_checkpoint true`, then {verb} it.",
        ),
        (checkpoint, f"{checkpoint} holds no trained model: missing "),
        (both_output, f"{both_output} holds no trained model: missing config.json, results.json, weights "),
    ):
        if command == "card":
            assert run_command(model_card.main, [str(folder)]) == 1
        else:
            argv = [command, str(folder)] + (["--repo_id", "me/vit"] if command == "push" else [])
            with pytest.raises(SystemExit):
                hub.main(argv)
        [line] = capsys.readouterr().err.strip().splitlines()
        assert line.startswith(f"error: {problem}")
        assert not (folder / "README.md").exists()
        if folder == checkpoint:
            assert line.endswith(f"It is a checkpoint of the run {run}: {verb} that run's folder (its kept model).")
    assert line.endswith(f"It holds run directories: {verb} pretrained, scratch separately.")
    # Still training (a live process holds its folder): it said to resume it, which is refused while it runs.
    holder = {"pid": os.getppid(), "host": socket.gethostname(), "started": "2026-11-29T10:00:00+0000"}
    (interrupted / ".run.lock").write_text(json.dumps(holder))
    if command == "card":
        assert run_command(model_card.main, [str(interrupted)]) == 1
    else:
        with pytest.raises(SystemExit):
            hub.main([command, str(interrupted)] + (["--repo_id", "me/vit"] if command == "push" else []))
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.endswith(
        f"Its run is still training (process {os.getppid()} on {socket.gethostname()}, started "
        f"2026-11-29T10:00:00+0000): {verb} it once it has finished."
    ), line
    # A `model_type: both` run locks the folder above its models'.
    (interrupted / ".run.lock").rename(both_output / ".run.lock")
    nested = interrupted.rename(both_output / "pretrained_in_progress")
    if command == "card":
        assert run_command(model_card.main, [str(nested)]) == 1
    else:
        with pytest.raises(SystemExit):
            hub.main([command, str(nested)] + (["--repo_id", "me/vit"] if command == "push" else []))
    assert "Its run is still training (process" in capsys.readouterr().err


def test_cli(both_output, monkeypatch, capsys):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    run = both_output / "scratch"
    assert "model.safetensors" in hub.main(["files", str(run)])
    capsys.readouterr()
    with FakeHub() as server:
        monkeypatch.setattr(constants, "ENDPOINT", server.url)
        url = hub.main(["push", str(run), "--repo-id", "me/cli", "--commit-message", "hello"])
    assert capsys.readouterr().out.strip() == url
    assert server.commits[0]["summary"] == "hello"
    assert server.requests[0]["headers"]["authorization"] == f"Bearer {TOKEN}"
    with FakeHub(fail={"commit": 503}) as server:
        monkeypatch.setattr(constants, "ENDPOINT", server.url)
        with pytest.raises(SystemExit) as exit_info:
            hub.main(["push", str(run), "--repo-id", "me/cli"])
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert "HTTP 503" in err and f"python -m finetune.tools.hub push {run} --repo_id me/cli" in err


def test_silent_hub_times_out_with_bounded_retries(both_output):
    """A Hub that accepts the connection and never answers fails the push within timeout x attempts, not never."""
    run = both_output / "scratch"
    hub.write_model_card(run, "me/vit")  # the push rewrites the card to the same bytes: the tree stays identical
    before = tree_hashes(both_output, skip=None)
    hooks = get_session().event_hooks
    with SilentServer() as server:
        start = time.perf_counter()
        with pytest.raises(hub.HubPushError) as error:
            hub.push_output_dir(run, "me/vit", token=TOKEN, endpoint=server.url, timeout=1, retries=1)
        elapsed = time.perf_counter() - start
    message = str(error.value)
    assert f"no answer from {server.url} within 1 s on POST /api/repos/create (2 attempts; ReadTimeout" in message
    assert "--timeout" in message and hub.TIMEOUT_ENV in message
    assert f"Retry with: python -m finetune.tools.hub push {run} --repo_id me/vit --timeout 1 --retries 1" in message
    # two 1 s attempts (plus huggingface_hub's own 3 s agent-registry lookup when it is the process's first request)
    assert 2 <= elapsed < 15
    assert tree_hashes(both_output, skip=None) == before
    # the timeout and retries were the push's own: the library's client is back, without a timeout or retries
    assert get_session().timeout.read is None and get_session().event_hooks == hooks
    with FakeHub(fail={"create": 503}) as server:
        with pytest.raises(HfHubHTTPError):
            HfApi(endpoint=server.url, token=TOKEN).create_repo("me/after", exist_ok=True)
    assert server.attempts["create"] == 1


def test_upload_that_hangs_is_sent_again(both_output, caplog):
    """A commit request that gets no answer times out and is retried; the second attempt lands the whole upload."""
    caplog.set_level(logging.INFO)
    run = both_output / "scratch"
    with FakeHub(fail={"commit": "hang"}, failures=1) as server:
        url = hub.push_output_dir(run, "me/vit", token=TOKEN, endpoint=server.url, timeout=1, retries=1)
    assert url.startswith(f"{server.url}/me/vit/commit/")
    assert server.attempts["commit"] == 2
    [commit] = server.commits
    plan = dict(hub.upload_plan(run))
    assert commit["files"] == {path: local.read_bytes() for path, local in plan.items()}
    messages = [r.getMessage() for r in caplog.records]
    total = sum(local.stat().st_size for local in plan.values())
    assert any(m.startswith(f"Uploading {len(plan)} files ({hub._size(total)})") for m in messages)
    assert any("model.safetensors (" in m for m in messages)  # each file is named with its size
    assert any("POST /api/models/me/vit/commit/main: ReadTimeout" in m and "(attempt 1/2)" in m for m in messages)


def test_server_errors_then_success(both_output):
    """A Hub that answers 503 and 500 twice before working is retried with backoff, and the push succeeds."""
    with FakeHub(fail={"create": 503, "preupload": 500, "commit": 502}, failures=2) as server:
        url = hub.push_output_dir(both_output / "pretrained", "me/vit", token=TOKEN, endpoint=server.url, retries=2)
    assert url.startswith(f"{server.url}/me/vit/commit/") and len(server.commits) == 1
    assert (server.attempts["create"], server.attempts["preupload"], server.attempts["commit"]) == (3, 3, 3)


def test_retries_are_bounded_and_client_errors_are_not_retried(both_output):
    with FakeHub(fail={"commit": 503}) as server:
        with pytest.raises(hub.HubPushError, match=r"HTTP 503 on POST /api/models/me/vit/commit/main.*\(4 attempts\)"):
            hub.push_output_dir(both_output / "pretrained", "me/vit", token=TOKEN, endpoint=server.url, retries=3)
    assert server.attempts["commit"] == 4
    with FakeHub(fail={"create": 401}) as server:
        with pytest.raises(hub.HubPushError, match="token was rejected"):
            hub.push_output_dir(both_output / "pretrained", "me/vit", token=TOKEN, endpoint=server.url)
    assert server.attempts["create"] == 1


def test_cli_against_a_silent_hub(both_output, monkeypatch, capsys):
    """The CLI ends a hung push with one line naming the problem and the fix, then the retry command; exit 1."""
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    run = both_output / "scratch"
    hub.write_model_card(run, "me/cli")
    before = tree_hashes(both_output, skip=None)
    with SilentServer() as server:
        monkeypatch.setattr(constants, "ENDPOINT", server.url)
        with pytest.raises(SystemExit) as exit_info:
            hub.main(["push", str(run), "--repo_id", "me/cli", "--commit_message", "try", "--timeout", "1",
                      "--retries", "0"])  # fmt: skip
    assert exit_info.value.code == 1
    first, retry = capsys.readouterr().err.strip().splitlines()
    assert first.startswith(f"error: Pushing {run} to the Hub repo 'me/cli' failed: no answer from {server.url}")
    assert "Every local file" in first and "still in place" in first
    assert retry == (
        f"Retry with: python -m finetune.tools.hub push {run} --repo_id me/cli "
        "--commit_message try --timeout 1 --retries 0"
    )
    assert tree_hashes(both_output, skip=None) == before


def test_cli_debug_shows_the_traceback(both_output, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    with FakeHub(fail={"create": 404}) as server:
        monkeypatch.setattr(constants, "ENDPOINT", server.url)
        with pytest.raises(hub.HubPushError, match="HTTP 404.*repo or revision was not found"):
            hub.main(["push", str(both_output / "scratch"), "--repo-id", "me/cli", "--debug"])


@pytest.mark.parametrize(
    "argv, env, problem",
    [
        (["--timeout", "0"], None, "timeout must be a positive number of seconds (e.g. 60), got 0.0."),
        (["--retries", "-1"], None, "retries must be a whole number >= 0 (e.g. 2), got -1."),
        ([], "soon", "FINETUNE_HUB_TIMEOUT must be a positive number of seconds (e.g. 60), got 'soon'."),
    ],
)
def test_cli_refuses_bad_timeouts_before_any_request(both_output, monkeypatch, capsys, argv, env, problem):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    if env is not None:
        monkeypatch.setenv(hub.TIMEOUT_ENV, env)
    with FakeHub() as server:
        monkeypatch.setattr(constants, "ENDPOINT", server.url)
        with pytest.raises(SystemExit) as exit_info:
            hub.main(["push", str(both_output / "scratch"), "--repo_id", "me/cli", *argv])
    assert exit_info.value.code == 1
    assert capsys.readouterr().err.strip() == f"error: {problem}"
    assert server.requests == []


def test_timeout_from_the_environment(both_output, monkeypatch):
    monkeypatch.setenv(hub.TIMEOUT_ENV, "1.5")
    with SilentServer() as server:
        with pytest.raises(hub.HubPushError, match=r"within 1\.5 s .*\(1 attempt;"):
            hub.push_output_dir(both_output / "scratch", "me/vit", token=TOKEN, endpoint=server.url, retries=0)


def both_run_args(tmp_path: Path) -> list[str]:
    """A tiny `model_type: both` run on scikit-learn's digits into tmp_path/out, pushed to me/digits-*."""
    checkpoint = tmp_path / "base"
    config = ViTConfig(
        image_size=8, patch_size=2, num_channels=1, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=32, num_labels=3,
    )  # fmt: skip
    ViTForImageClassification(config).save_pretrained(checkpoint)
    ViTImageProcessor(size={"height": 8, "width": 8}, image_mean=[0.5], image_std=[0.5]).save_pretrained(checkpoint)
    return [
        "--model_type", "both", "--model_name_or_path", str(checkpoint), "--dataset_name", "sklearn:digits",
        "--max_train_samples", "64", "--max_eval_samples", "20", "--validation_size", "0.2", "--image_size", "8",
        "--patch_size", "2", "--hidden_size", "16", "--num_hidden_layers", "2", "--num_attention_heads", "2",
        "--intermediate_size", "32", "--per_device_train_batch_size", "32", "--num_train_epochs", "1",
        "--logging_steps", "2", "--horizontal_flip", "false", "--seed", "0", "--decoded_cache_dir", "none",
        "--report_to", "none", "--output_dir", str(tmp_path / "out"),
        "--push_to_hub", "true", "--hub_model_id", "me/digits", "--hub_token", TOKEN,
    ]  # fmt: skip


def test_real_tiny_run_is_compared_and_pushed(tmp_path, monkeypatch, caplog):
    """`finetune/run.py` with `model_type: both` on scikit-learn's digits writes the comparison through
    `write_comparison` and pushes both runs through `push_output_dir`; the token stays out of every file."""
    from finetune import run

    args, out = both_run_args(tmp_path), tmp_path / "out"
    caplog.set_level(logging.INFO)
    with FakeHub() as server:
        monkeypatch.setattr(constants, "ENDPOINT", server.url)
        run.main(args)
    assert (out / "comparison" / "report.md").is_file()
    assert sorted(c["repo"] for c in server.commits) == ["me/digits-pretrained", "me/digits-scratch"]
    for commit in server.commits:
        name = commit["repo"].split("-")[-1]
        assert set(commit["files"]) == {path for path, _ in hub.upload_plan(out / name)}
        assert "comparison/report.md" in commit["files"] and "results.json" in commit["files"]
        assert not any(p.startswith("checkpoint-") or p == "training_args.bin" for p in commit["files"])
        card = ModelCard(commit["files"]["README.md"].decode())
        results = json.loads((out / name / "results.json").read_text())
        assert card.data.eval_results[0].metric_value == results["validation"]["accuracy"]
    for path in out.rglob("*"):
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes(), path
    assert not any(TOKEN in r.getMessage() for r in caplog.records)


def test_a_failed_push_of_both_models_tries_each_after_the_summary(tmp_path, monkeypatch, capsys):
    """The first model's failed push stops neither the second's nor the closing summary; the run then fails with the
    command that retries each."""
    from finetune import run
    from finetune.errors import run_command

    out = tmp_path / "out"
    with FakeHub(fail={"create": 401}) as server:
        monkeypatch.setattr(constants, "ENDPOINT", server.url)
        assert run_command(run.main, both_run_args(tmp_path)) == 1
    created = [r["body"] for r in server.requests if r["path"] == "/api/repos/create"]
    assert any(b"digits-pretrained" in body for body in created) and any(b"digits-scratch" in body for body in created)
    captured = capsys.readouterr()
    assert "Summary" in captured.out and f"files: {out / 'scratch'}/" in captured.out
    [error] = [line for line in captured.err.splitlines() if line.startswith("error:")]
    assert "Pushing pretrained and scratch to the Hub failed" in error and "still in place" in error
    for name in ("pretrained", "scratch"):
        assert f"python -m finetune.tools.hub push {out / name} --repo_id me/digits-{name}" in error


def test_the_card_says_where_the_processor_cannot_frame_a_photo_as_training_did(both_output, tmp_path):
    """Images stored smaller than the model's input (CIFAR-10's 32 px, a 224 px ViT): predict shrinks a larger photo
    to 32 px first, the processor straight to 224; the card said nothing of it (4 of 12 top-1 differed)."""
    run = Path(shutil.copytree(both_output / "scratch", tmp_path / "scratch"))
    results = json.loads((run / "results.json").read_text())
    assert "stored at" not in model_card.build_model_card(run).text
    (run / "results.json").write_text(json.dumps({**results, "stored_image_size": [8, 8], "image_size": 24}))
    assert "stored at 8 px and enlarged to 24 px: for a photo larger" in model_card.build_model_card(run).text


@pytest.mark.parametrize("flip_tta", [False, True])
def test_the_cards_snippet_computes_the_logits_its_scores_are_of(both_output, tmp_path, monkeypatch, flip_tta):
    """A `flip_tta` run's scores (and multi-label thresholds) are of the mean of each image's logits and its mirror
    image's: the card's snippet, run as written, computed one view's."""
    run = both_output / "scratch"
    results = json.loads((run / "results.json").read_text())
    results["hyperparameters"]["flip_tta"] = flip_tta
    (run / "results.json").write_text(json.dumps(results))
    card = model_card.write_model_card(run, repo_id=str(run))  # the snippet loads the local folder
    snippet = re.search(r"```python\n(.*?)```", card, re.S).group(1).replace("print(", "str(")
    monkeypatch.chdir(tmp_path)
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 30, 3), dtype=np.uint8)).save("image.jpg")
    namespace = {}
    exec(snippet, namespace)
    model, pixels = namespace["model"], namespace["inputs"]["pixel_values"]
    with torch.no_grad():
        one_view = model(pixel_values=pixels).logits
        expected = (one_view + model(pixel_values=pixels.flip(-1)).logits) / 2 if flip_tta else one_view
    assert torch.allclose(namespace["logits"], expected, atol=1e-6)
    assert not torch.allclose(
        expected, model(pixel_values=pixels.flip(-1)).logits.detach(), atol=1e-6
    )  # not symmetric
    assert ("without the mirror image" in card) == flip_tta
    # The snippet opens images as training decoded them: a phone photo upright by its EXIF tag, a 16-bit PNG scaled
    # to 8 bits, transparency on white (`Image.open(...).convert(...)` got 10, 7 and 12 of 12 top-1 otherwise).
    from finetune.data.decode import decode_image

    rng = np.random.default_rng(1)
    rotated = Image.fromarray(rng.integers(0, 255, (20, 30, 3), dtype=np.uint8))
    exif = rotated.getexif()
    exif[0x0112] = 6  # orientation: rotate 90 degrees clockwise to view
    rotated.save("rotated.jpg", exif=exif)
    Image.fromarray(rng.integers(0, 65535, (12, 10), dtype=np.uint16)).save("deep.png")
    Image.fromarray(rng.integers(0, 255, (9, 11, 4), dtype=np.uint8), "RGBA").save("clear.png")
    for name in ("rotated.jpg", "deep.png", "clear.png"):
        opened, decoded = namespace["open_image"](name), decode_image(name, "RGB")
        assert opened.size == decoded.size and np.abs(np.asarray(opened, np.int16) - np.asarray(decoded)).max() <= 1
