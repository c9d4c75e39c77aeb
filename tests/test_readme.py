"""README.md as a newcomer meets it: short, naming no path of this machine, and every shell command in it working
in the order written, in a fresh copy of the repository, from an activated virtual environment, offline.

The commands are the lines of the fenced ```bash blocks that are not blank or comments, with `\\` continuations
joined (usage synopses with placeholders such as `configs/NAME.yaml` belong in ```text blocks, which are not run).
Each runs with `bash -c` in a copy of the files a clone would have, with the venv running these tests activated (its
bin/ first on PATH, VIRTUAL_ENV set), a fresh HF_HOME, HF_HUB_OFFLINE=1 and a time limit, and must exit 0. A command
is skipped only when its line carries one of these marker comments:

- `# needs: hub` or `# needs: gpu`: it needs the Hugging Face Hub or a CUDA device, which tests never have;
- `# setup`: it clones the repository or makes or fills the venv (`git clone`, `python -m venv`, `pip install`,
  `source .venv/bin/activate`), which is done already: these tests run inside the installed venv. Such commands, and
  only they, must carry it.
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_LINES = 300
# Seconds one command may take on a 2-core CPU: the quickstart, the longest, takes about 90.
COMMAND_TIMEOUT = 600
NEEDS = {"hub", "gpu"}

MARKER = re.compile(r"(?:^|\s)#\s*needs:\s*(\S+)")
SETUP_MARKER = re.compile(r"(?:^|\s)#\s*setup\b")
SETUP_COMMAND = re.compile(
    r"(?:^|[\s;&|(])(?:git\s+clone|(?:\S*/)?python3?\s+-m\s+(?:venv|pip\s+install)|(?:\S*/)?pip3?\s+install"
    r"|(?:source|\.)\s+\S*bin/activate)\b"
)
# An absolute path of two or more parts (`/srv/me/data`), not part of a URL or of a relative path (`a/b/c`).
ABSOLUTE_PATH = re.compile(r"(?<![\w.~:/\-])/[\w.\-]+/[\w.\-/]*")
SYSTEM_PATHS = ("/dev/", "/usr/")


@dataclass
class Command:
    """One README command: the line it starts on, its text, and why it is skipped (`None`: it runs)."""

    line: int
    text: str
    skip: str | None = None


def readme_commands(readme: Path) -> list[Command]:
    """The commands of `readme`'s ```bash blocks in order, each with its skip reason from its marker comment."""
    commands, fence, pending, start = [], None, "", 0
    for number, line in enumerate(readme.read_text().splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            fence = stripped[3:].strip() if fence is None else None
            continue
        if fence != "bash" or not (stripped or pending) or (stripped.startswith("#") and not pending):
            continue
        start = start if pending else number
        if stripped.endswith("\\"):
            pending += stripped[:-1].rstrip() + " "
            continue
        commands.append(marked(Command(start, pending + stripped), readme.name))
        pending = ""
    return commands


def marked(command: Command, name: str) -> Command:
    """`command` with its skip reason, refusing a marker other than the three and a setup line without its marker."""
    where = f"{name}:{command.line}"
    needs = MARKER.findall(command.text)
    if any(what not in NEEDS for what in needs):
        raise ValueError(f"{where}: `# needs: {needs[0]}` is no marker; use `# needs: hub` or `# needs: gpu`.")
    is_setup = SETUP_COMMAND.search(command.text.split(" #")[0]) is not None
    if is_setup != (SETUP_MARKER.search(command.text) is not None):
        fix = "add `# setup` to it" if is_setup else "`# setup` marks only clone, venv and install commands"
        raise ValueError(f"{where}: `{command.text}`: {fix}.")
    if needs:
        command.skip = f"needs the {needs[0]}"
    elif is_setup:
        command.skip = "setup: the tests run inside the installed venv"
    return command


def copy_repository(destination: Path) -> Path:
    """The files a clone would have (git's tracked ones and new ones it does not ignore) copied into `destination`."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():  # tracked but deleted in the work tree: a clone of the next commit lacks it too
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, destination / name)
    return destination


def activated_venv(repository: Path, hf_home: Path) -> dict[str, str]:
    """The environment of a shell in which the venv running these tests is activated, offline, with a fresh HF_HOME
    and no other HF_ setting (as a newcomer's).

    PYTHONPATH points at the copy, so an entry point of the editable install (`vit-finetune`) imports the copy's
    code, as it would in a clone, and not this checkout's."""
    dropped = ("PYTHONHOME", "VIRTUAL_ENV")
    env = {key: value for key, value in os.environ.items() if key not in dropped and not key.startswith("HF_")}
    bin_dir = Path(sys.executable).parent
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        VIRTUAL_ENV=sys.prefix,
        PYTHONPATH=str(repository),
        HF_HOME=str(hf_home),
        HF_HUB_OFFLINE="1",
    )
    return env


def run_readme(readme: Path, workdir: Path, timeout: float = COMMAND_TIMEOUT) -> list[Command]:
    """Run `readme`'s commands that are not skipped, in order, in a fresh copy of the repository under `workdir`;
    fail at the first that exits non-zero, warns, trains a model that learned nothing or runs past `timeout`
    seconds, with the tail of its output. Returns the commands that ran."""
    repository = copy_repository(workdir / "repository")
    env = activated_venv(repository, workdir / "hf_home")
    ran = []
    for command in readme_commands(readme):
        if command.skip:
            continue
        where = f"{readme.name}:{command.line} `{command.text}`"
        # A session of its own, so that a command past its time is killed with every process it started.
        with subprocess.Popen(
            ["bash", "-c", command.text], cwd=repository, env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        ) as process:  # fmt: skip
            try:
                output, _ = process.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                output, _ = process.communicate()
                raise AssertionError(f"{where} ran past {timeout} s; its output ended:\n{output[-3000:]}") from None
        assert process.returncode == 0, f"{where} exited {process.returncode}; its output ended:\n{output[-3000:]}"
        # A training command whose model stays at chance teaches a reader nothing (run.warn_if_at_chance).
        assert "learned nothing" not in output, f"{where} trained a model that learned nothing:\n{output[-3000:]}"
        # A reader who follows the page should meet no warning, or learn to skip them.
        assert not re.search(r"^warning: ", output, re.MULTILINE), f"{where} warned:\n{output[-3000:]}"
        ran.append(command)
    return ran


def machine_paths(text: str) -> list[str]:
    """The absolute paths named in `text`, other than the system's own (`/dev/null`, `/usr/bin/env`)."""
    found = [path for path in ABSOLUTE_PATH.findall(text) if not path.startswith(SYSTEM_PATHS)]
    here = {str(ROOT), str(Path.home()), tempfile.gettempdir()}
    return found + [path for path in here if re.search(rf"(?<![\w.~:/\-]){re.escape(path)}(?![\w.\-])", text)]


def test_readme_is_short_and_names_no_path_of_this_machine():
    text = README.read_text()
    assert len(text.splitlines()) <= MAX_LINES, f"README.md has {len(text.splitlines())} lines; at most {MAX_LINES}."
    assert machine_paths(text) == []
    assert "../shared" not in text, "README.md points at ../shared, a folder users do not have."


@pytest.mark.slow
def test_every_quick_readme_command_works_in_order_in_a_fresh_copy(tmp_path):
    assert run_readme(README, tmp_path), "README.md has no command that runs offline on a CPU."


SAMPLE = """# Sample

```bash
python3 -m venv .venv          # setup
source .venv/bin/activate      # setup
.venv/bin/python -m pip install -e ".[dev]"   # setup
```

Usage, not run:

```text
python -m finetune.run --config configs/NAME.yaml [--key value ...]
```

```bash
# a comment line, not a command
test -f pyproject.toml && test ! -e .venv && test ! -e outputs
test "$(command -v python)" -ef "$VIRTUAL_ENV/bin/python" && test "$HF_HUB_OFFLINE" = 1
python -c "import finetune, os; assert finetune.__file__.startswith(os.getcwd())" && \\
  echo first > order.txt
false  # needs: gpu
grep -q first order.txt && echo second >> order.txt   # after the one above
```

```python
raise SystemExit(1)
```

```bash
exit 7  # needs: hub
vit-finetune --help > /dev/null
```
"""


def test_commands_are_the_bash_lines_joined_with_their_markers(tmp_path):
    (readme := tmp_path / "README.md").write_text(SAMPLE)
    commands = readme_commands(readme)
    setup = "setup: the tests run inside the installed venv"
    assert [c.line for c in commands] == [4, 5, 6, 17, 18, 19, 21, 22, 30, 31]
    assert [c.skip for c in commands] == [setup] * 3 + [None] * 3 + ["needs the gpu", None, "needs the hub", None]
    assert commands[5].text.endswith('os.getcwd())" && echo first > order.txt')


@pytest.mark.parametrize(
    "line, error",
    [
        ("pip install -e .", r"README.md:2: `pip install -e .`: add `# setup` to it\."),
        (".venv/bin/python -m pip install torch", r"add `# setup` to it"),
        ("echo hi  # setup", r"`# setup` marks only clone, venv and install commands"),
        ("echo hi  # needs: network", r"README.md:2: `# needs: network` is no marker; use `# needs: hub` or"),
    ],
)
def test_a_marker_is_one_of_three_and_setup_lines_carry_theirs(tmp_path, line, error):
    (readme := tmp_path / "README.md").write_text(f"```bash\n{line}\n```\n")
    with pytest.raises(ValueError, match=error):
        readme_commands(readme)


def test_commands_run_in_order_in_a_copy_from_the_activated_venv(tmp_path):
    (readme := tmp_path / "README.md").write_text(SAMPLE)
    ran = run_readme(readme, tmp_path / "work", timeout=120)
    assert [command.line for command in ran] == [17, 18, 19, 22, 31]
    assert (tmp_path / "work" / "repository" / "order.txt").read_text() == "first\nsecond\n"
    assert not (ROOT / "order.txt").exists()


def test_a_failing_or_hanging_command_fails_with_its_output(tmp_path):
    (readme := tmp_path / "README.md").write_text("```bash\necho fine\necho 'what went wrong'; exit 3\n```\n")
    with pytest.raises(AssertionError, match=r"(?s)README.md:3 `echo 'what went wrong'; exit 3` exited 3.*what went"):
        run_readme(readme, tmp_path / "failing")
    (readme := tmp_path / "README.md").write_text("```bash\necho started; sleep 60\n```\n")
    with pytest.raises(AssertionError, match=r"(?s)ran past 1 s.*started"):
        run_readme(readme, tmp_path / "hanging", timeout=1)
    (readme := tmp_path / "README.md").write_text("```bash\necho 'warning: unread'\n```\n")
    with pytest.raises(AssertionError, match=r"README.md:2 `echo 'warning: unread'` warned"):
        run_readme(readme, tmp_path / "warning")


def test_the_readme_check_finds_machine_paths_and_passes_urls_and_relative_paths():
    text = f"see /srv/gpu/suite and {ROOT}/configs, not https://pytorch.org/whl/cpu, benchmarks/results/x or /dev/null"
    assert machine_paths(text)[:2] == ["/srv/gpu/suite", f"{ROOT}/configs"]
    assert not machine_paths("pip install torch --index-url https://download.pytorch.org/whl/cpu > /dev/null")
    assert not machine_paths("runs/photos, 98.15% / 97.41%, train/validation/test, ~/.cache/huggingface")


def test_the_cpu_only_torch_install_pins_the_constraints_versions():
    # Another version would be replaced by the constrained CUDA build at the install that follows.
    pins = re.findall(r"^torch(?:vision)?==\S+$", (ROOT / ".ci" / "constraints.txt").read_text(), re.MULTILINE)
    assert len(pins) == 2 and all(f" {pin} " in README.read_text() for pin in pins), pins
