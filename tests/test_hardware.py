"""Precision and attention chosen from the machine (`auto`), with the detection mocked; explicit choices are kept."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from finetune import hardware
from finetune.arguments import parse_options
from finetune.training_args import ImageClassificationTrainingArguments, build_training_args


choose = hardware.choose_precision
ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    "device, probe, expected",
    [
        ("cpu", {"cpu_native_bf16": False}, (False, False, None)),
        ("cpu", {"cpu_native_bf16": True, "cpu_bf16_speedup": 1.8}, (True, False, None)),
        ("cpu", {"cpu_native_bf16": True, "cpu_bf16_speedup": 0.6}, (False, False, None)),  # a 2-core Intel Xeon's
        ("cuda", {"cuda_bf16": True, "cuda_capability": (9, 0)}, (True, False, True)),
        ("cuda", {"cuda_bf16": True, "cuda_capability": (8, 0)}, (True, False, True)),
        ("cuda", {"cuda_bf16": False, "cuda_capability": (7, 0)}, (False, True, None)),
        ("mps", {}, (False, False, None)),
    ],
)
def test_auto_follows_the_device(device, probe, expected):
    choice = choose("auto", "auto", "auto", device, **probe)
    assert (choice.bf16, choice.fp16, choice.tf32) == expected
    assert not choice.warnings and choice.reasons[0].startswith("auto")


def test_explicit_choices_are_kept_and_a_slow_one_warns():
    choice = choose(True, "auto", "auto", "cpu", cpu_native_bf16=False)
    assert (choice.bf16, choice.fp16) == (True, False)
    (warning,) = choice.warnings
    assert f"{hardware.CPU_BF16_SLOWDOWN} slower" in warning and "--bf16 auto" in warning
    assert not choose("true", "auto", "auto", "cpu", cpu_native_bf16=True).warnings
    choice = choose(False, "false", "false", "cuda", cuda_bf16=True, cuda_capability=(9, 0))
    assert (choice.bf16, choice.fp16, choice.tf32) == (False, False, False)
    assert choose("auto", True, "auto", "cuda", cuda_bf16=True, cuda_capability=(9, 0)).fp16


def test_the_launchers_precision_counts_as_explicit():
    choice = choose("auto", "auto", "auto", "cuda", cuda_bf16=True, launcher_precision="fp16")
    assert (choice.bf16, choice.fp16) == (False, False)  # the Trainer then takes fp16 from ACCELERATE_MIXED_PRECISION
    assert "accelerate launch" in choice.reasons[0] and choice.mode == "fp16"
    assert choose("auto", "auto", "auto", "cpu", cpu_native_bf16=False, launcher_precision="bf16").warnings
    assert choose(
        "auto", "auto", "auto", "cpu", cpu_native_bf16=True, cpu_bf16_speedup=1.8, launcher_precision="no"
    ).bf16


def test_a_switch_turned_off_against_the_launchers_precision_is_refused():
    """`--bf16 false` under `accelerate launch --mixed_precision bf16` trained in bf16 and recorded it, exit 0."""
    message = r"^`--bf16 false` and `accelerate launch --mixed_precision bf16` disagree.* Fix: drop `--bf16 false`"
    with pytest.raises(ValueError, match=message):
        choose(False, "auto", "auto", "cpu", cpu_native_bf16=True, cpu_bf16_speedup=1.8, launcher_precision="bf16")
    with pytest.raises(ValueError, match=r"^`--fp16 false` and `accelerate launch --mixed_precision fp16`"):
        choose("auto", "false", "auto", "cuda", cuda_bf16=True, launcher_precision="fp16")
    # Another precision's switch off agrees with it, and a switch on wins over the launcher's.
    assert choose(False, "auto", "auto", "cuda", cuda_bf16=True, launcher_precision="fp16").mode == "fp16"
    assert choose(False, True, "auto", "cuda", cuda_bf16=True, launcher_precision="bf16").mode == "fp16"


def test_fp16_on_a_cpu_is_refused():
    """accelerate autocasts fp16 on accelerators only: on a CPU the run trained in float32, bit for bit, and recorded
    fp16 in its log, results.json and card."""
    with pytest.raises(ValueError, match=r"^`--fp16 true` on a CPU trains in float32 .* Fix: `--bf16 true`"):
        choose("auto", True, "auto", "cpu", cpu_native_bf16=True, cpu_bf16_speedup=1.8)
    with pytest.raises(ValueError, match=r"^`accelerate launch --mixed_precision fp16` on a CPU trains in float32"):
        choose("auto", "auto", "auto", "cpu", cpu_native_bf16=False, launcher_precision="fp16")


def test_native_bf16_that_measures_slower_than_float32_is_not_chosen(monkeypatch):
    """A 2-core Intel Xeon with AVX512-BF16 ran bf16 matmuls at 0.56-0.69x float32's speed and the CPU recipe's step at
    0.82x: the flags alone had chosen bf16 there. The reason names the measured figure."""
    choice = choose("auto", "auto", "auto", "cpu", cpu_native_bf16=True, cpu_bf16_speedup=0.62)
    assert choice.mode == "float32" and not choice.warnings
    assert choice.reasons == [
        "auto: this CPU has native bf16 (AVX512-BF16/AMX), but bf16 matmuls ran 0.62x as fast as float32 here"
    ]
    assert (
        "ran 1.80x as fast"
        in choose("auto", "auto", "auto", "cpu", cpu_native_bf16=True, cpu_bf16_speedup=1.8).reasons[0]
    )
    # The measurement is real: a ratio of two timings on this CPU, on one thread, the thread count restored.
    threads, random_state = torch.get_num_threads(), torch.random.get_rng_state()
    hardware.measure_cpu_bf16_speedup.cache_clear()
    speedup = hardware.measure_cpu_bf16_speedup()
    assert 0.01 < speedup < 100 and torch.get_num_threads() == threads
    assert torch.equal(torch.random.get_rng_state(), random_state), "the run's random numbers are left as they were"
    assert hardware.measure_cpu_bf16_speedup() == speedup  # measured once per process
    # The settings step measures only where bf16 is native, and follows the measurement.
    measured = []
    monkeypatch.setattr(hardware, "measure_cpu_bf16_speedup", lambda: measured.append(1) or 0.62)
    for native in (False, True):
        monkeypatch.setattr(hardware, "cpu_has_native_bf16", lambda flags=None, native=native: native)
        assert hardware.choose_settings({"use_cpu": True}).arguments["bf16"] is False
    assert measured == [1]


def test_the_bf16_measurement_is_not_swayed_by_a_busy_machine(monkeypatch):
    """A busy machine only slows samples down: here bf16 runs 3x as fast (2 ms against 6 ms), and another job delays
    three of the five counted bf16 steps by 10 ms. Medians had read 0.5x (float32 chosen on a bf16 CPU); the fastest
    samples read 3x."""
    f32, bf16 = [0.006] * 7, [0.002, 0.002, 0.012, 0.002, 0.012, 0.012, 0.002]
    durations = iter(d for pair in zip(f32, bf16) for d in pair)  # the steps alternate, float32 first
    now = [0.0]

    def clock():  # called at each step's start and end: the end adds the step's duration
        now[0] += next(durations) if clock.started else 0.0
        clock.started = not clock.started
        return now[0]

    clock.started = False
    monkeypatch.setattr(hardware.time, "perf_counter", clock)
    hardware.measure_cpu_bf16_speedup.cache_clear()
    try:
        assert hardware.measure_cpu_bf16_speedup() == pytest.approx(3.0)
    finally:
        hardware.measure_cpu_bf16_speedup.cache_clear()


def test_bad_switch_value():
    with pytest.raises(ValueError, match="`bf16` must be auto, true or false, got 'maybe'"):
        choose("maybe", "auto", "auto", "cpu")


@pytest.mark.parametrize("off", ["none", "null", "None", None, "false", "0", "no"])
def test_a_switch_cleared_is_off(off):
    """`none` and `null` alike (the README: `none` or `null` clears an option; a switch cleared is off), as a YAML
    `bf16: null` reaches it as None; `--bf16 null` was refused."""
    assert hardware.parse_switch(off, "bf16") is False


@pytest.mark.parametrize(
    "requested, device, bf16, head_size, expected",
    [
        ("auto", "cpu", True, 16, "eager"),
        ("auto", "cpu", True, 32, "eager"),
        ("auto", "cpu", True, 64, "sdpa"),
        ("auto", "cpu", False, 16, "sdpa"),
        ("auto", "cuda", True, 16, "sdpa"),
        ("auto", "cpu", True, None, "sdpa"),
        ("sdpa", "cpu", True, 16, "sdpa"),
        ("eager", "cuda", False, 64, "eager"),
    ],
)
def test_attention_choice(requested, device, bf16, head_size, expected):
    assert hardware.choose_attention(requested, device, bf16, head_size)[0] == expected


def test_cpu_flags_name_native_bf16():
    assert hardware.cpu_has_native_bf16({"avx2", "avx512f", "avx512_bf16"})
    assert hardware.cpu_has_native_bf16({"amx_bf16", "amx_tile"})
    assert not hardware.cpu_has_native_bf16({"avx2", "fma", "avx512f"})
    # oneDNN capped below AVX512_CORE_BF16 (how benchmarks/precision.py emulates a CPU without native bf16)
    assert not hardware.cpu_has_native_bf16({"avx512_bf16"}, max_isa="avx2")
    assert hardware.cpu_has_native_bf16({"avx512_bf16"}, max_isa="AVX512_CORE_BF16")


@pytest.mark.parametrize("native", [False, True])
def test_the_settings_step_resolves_auto_and_the_arguments_take_its_values(tmp_path, monkeypatch, native):
    monkeypatch.setattr(hardware, "cpu_has_native_bf16", lambda flags=None: native)
    monkeypatch.setattr(hardware, "measure_cpu_bf16_speedup", lambda: 1.8)  # bf16 as fast as AMD EPYC's
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    options = {"output_dir": str(tmp_path), "use_cpu": True, "bf16": "auto", "fp16": "auto", "tf32": "auto"}
    settings = hardware.choose_settings(options)
    assert options["bf16"] == "auto", "choosing reads the options, it does not rewrite them"
    assert settings.arguments["bf16"] is native and settings.arguments["torch_compile"] is False
    assert ("has native bf16" if native else "no native bf16") in settings.precision.summary
    assert not settings.compile.enabled and "eager on cpu" in settings.compile.summary
    args = build_training_args(options, settings)
    assert args.bf16 is native and args.fp16 is False and args.use_cpu and not args.dataloader_pin_memory
    assert args.mixed_precision == ("bf16" if native else "no")


def test_building_the_arguments_probes_nothing(tmp_path):
    """`auto` left unresolved is refused: only the settings step chooses."""
    with pytest.raises(ValueError, match=r"`bf16: auto` is not chosen yet: .*hardware.choose_settings"):
        ImageClassificationTrainingArguments(output_dir=str(tmp_path), use_cpu=True)
    args = ImageClassificationTrainingArguments(
        output_dir=str(tmp_path), bf16=False, fp16=False, tf32=None, torch_compile=False
    )
    assert args.use_cpu is None and args.dataloader_pin_memory is None, "unset stays unset"


def test_explicit_bf16_on_a_cpu_without_it_warns(monkeypatch):
    monkeypatch.setattr(hardware, "cpu_has_native_bf16", lambda flags=None: False)
    settings = hardware.choose_settings({"use_cpu": True, "bf16": "true"})
    assert settings.arguments["bf16"] is True
    assert any(f"{hardware.CPU_BF16_SLOWDOWN} slower" in warning for warning in settings.warnings)


@pytest.mark.parametrize("native", [False, True])
def test_a_recipe_for_the_other_precision_names_the_one_to_use(tmp_path, monkeypatch, native):
    """The two 30-minute CPU recipes each name the other: the one tuned for bf16 warns on a CPU that trains in
    float32, and the float32 one on a CPU with native bf16; the recipe that fits says nothing."""
    monkeypatch.setattr(hardware, "cpu_has_native_bf16", lambda flags=None: native)
    monkeypatch.setattr(hardware, "measure_cpu_bf16_speedup", lambda: 1.8)  # bf16 as fast as AMD EPYC's
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    configs = {}
    for name in ("cifar10_scratch_cpu30_stem.yaml", "cifar10_scratch_cpu30_stem_h48l4.yaml"):
        *_, options = parse_options(["--config", str(ROOT / "configs" / name), "--use_cpu", "true"])
        configs[options["recipe_precision"]] = (f"configs/{name}", options)
    assert configs["bf16"][1]["recipe_alternative"] == configs["float32"][0]
    assert configs["float32"][1]["recipe_alternative"] == configs["bf16"][0]
    for precision, (_, options) in configs.items():
        warned = [w for w in hardware.choose_settings(options).warnings if "This recipe is tuned for" in w]
        if precision == ("bf16" if native else "float32"):
            assert warned == []
        else:
            assert len(warned) == 1 and f"Use {options['recipe_alternative']}, the recipe for it." in warned[0]
    with pytest.raises(ValueError, match=r"`recipe_precision` must be one of \['bf16', 'float32'\], got 'fp8'"):
        build_training_args({"output_dir": str(tmp_path), "recipe_precision": "fp8"}, hardware.choose_settings({}))


WORLD_SIZE_AND_TIMEOUT = """
import sys, time
import torch.distributed as dist
from finetune.arguments import parse_args

*_, args = parse_args(["--output_dir", sys.argv[1], "--ddp_timeout", "3", "--report_to", "none"])
print(f"process {args.process_index} of {args.world_size}, cpu {args.use_cpu}", flush=True)
if args.process_index == 1:
    time.sleep(15)  # a frozen peer
else:
    start = time.monotonic()
    try:
        dist.barrier()
    except RuntimeError:
        print(f"barrier gave up after {time.monotonic() - start:.1f} s", flush=True)
"""


@pytest.mark.slow
def test_two_cpu_processes_join_one_group_with_the_ddp_timeout(tmp_path):
    """transformers passes no timeout to accelerate on the CPU; the settings step starts the group with it."""
    script = tmp_path / "script.py"
    script.write_text(WORLD_SIZE_AND_TIMEOUT)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
               str(ROOT / "configs" / "accelerate" / "cpu_2proc.yaml"), "--main_process_port", "0",
               str(script), str(tmp_path / "out")]  # fmt: skip
    result = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    output = result.stdout + result.stderr
    assert "process 0 of 2, cpu True" in output and "process 1 of 2, cpu True" in output, output[-3000:]
    waited = float(re.search(r"barrier gave up after ([\d.]+) s", output).group(1))
    assert 2 < waited < 10, f"the 3 s ddp_timeout must reach the process group (waited {waited} s)"


PRECISION_BY_PROCESS = """
import os, sys
from finetune import hardware

hardware.cpu_has_native_bf16 = lambda flags=None: True
# A CPU near the threshold: the two processes measure bf16 on either side of it.
hardware.measure_cpu_bf16_speedup = lambda: float(sys.argv[2].split(",")[int(os.environ["RANK"])])
from finetune.arguments import parse_args

*_, args = parse_args(["--output_dir", sys.argv[1], "--report_to", "none"])
print(f"process {args.process_index} of {args.world_size}: bf16 {args.bf16}", flush=True)
import torch
torch.distributed.destroy_process_group()  # as finetune.run.main does: exiting with it up may abort (SIGABRT)
"""


@pytest.mark.slow
@pytest.mark.parametrize("speedups, bf16", [("1.5,1.0", True), ("1.0,1.5", False)])
def test_two_cpu_processes_train_in_process_0s_precision(tmp_path, speedups, bf16):
    """`bf16: auto` measures in each process; where the measurements fall on either side of the threshold, both
    processes take process 0's choice (they trained in different precisions)."""
    script = tmp_path / "script.py"
    script.write_text(PRECISION_BY_PROCESS)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    env.pop("ACCELERATE_MIXED_PRECISION", None)
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
               str(ROOT / "configs" / "accelerate" / "cpu_2proc.yaml"), "--main_process_port", "0",
               str(script), str(tmp_path / "out"), speedups]  # fmt: skip
    result = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    for rank in (0, 1):
        assert f"process {rank} of 2: bf16 {bf16}" in output, output[-3000:]


@pytest.mark.parametrize("native", [False, True])
def test_the_recorded_choice_is_what_the_run_trains_in_and_why(tmp_path, monkeypatch, native):
    """Under `accelerate launch --mixed_precision bf16` the run trains in bf16; `--bf16 false` is float32 as given."""
    monkeypatch.setattr(hardware, "cpu_has_native_bf16", lambda flags=None: native)
    monkeypatch.setattr(hardware, "measure_cpu_bf16_speedup", lambda: 1.8)  # bf16 as fast as AMD EPYC's
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")  # what the launcher sets
    options = {"output_dir": str(tmp_path), "use_cpu": True, "recipe_precision": "bf16"}
    settings = hardware.choose_settings(options)
    assert build_training_args(options, settings).mixed_precision == "bf16"
    assert (
        settings.precision.summary == "bf16 autocast; mixed precision bf16 from `accelerate launch --mixed_precision`"
    )
    assert not [w for w in settings.warnings if "This recipe is tuned for" in w]
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION")
    settings = hardware.choose_settings({**options, "bf16": "false"})
    assert build_training_args({**options, "bf16": "false"}, settings).mixed_precision == "no"
    summary = settings.precision.summary
    assert (
        (summary == "float32; bf16 false as given") if native else summary.startswith("float32; auto: this CPU has no")
    )


def cgroup_files(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


@pytest.mark.parametrize(
    "proc_cgroup, files, expected",
    [
        ("0::/", {"cpu.max": "150000 100000\n"}, 1.5),  # v2, a container's own cgroup (`docker --cpus 1.5`)
        ("0::/", {"cpu.max": "max 100000\n"}, None),
        (
            "0::/job/step",
            {"cpu.max": "max 100000", "job/cpu.max": "400000 100000", "job/step/cpu.max": "max 100000"},
            4,
        ),
        # v1: the quota of the process's cgroup; a host path not mounted in the container (the mount's root counts).
        (
            "4:cpu,cpuacct:/q1\n3:memory:/",
            {"cpu/q1/cpu.cfs_quota_us": "100000", "cpu/q1/cpu.cfs_period_us": "100000"},
            1,
        ),
        ("4:cpu,cpuacct:/docker/ab12", {"cpu/cpu.cfs_quota_us": "50000", "cpu/cpu.cfs_period_us": "100000"}, 0.5),
        ("4:cpu,cpuacct:/", {"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"}, None),
        ("3:memory:/", {}, None),
        # v1 with the controllers mounted together under the name the line gives (no `cpu` link), in either order.
        ("4:cpuacct,cpu:/", {"cpuacct,cpu/cpu.cfs_quota_us": "200000", "cpuacct,cpu/cpu.cfs_period_us": "100000"}, 2),
        # Lines that are not `id:controllers:/path`, and a period of 0, are passed over instead of failing the run.
        ("\nnot a cgroup line\n0::relative\n0::/", {"cpu.max": "100000 100000"}, 1),
        ("0::/", {"cpu.max": "100000 0"}, None),
    ],
)
def test_cpu_quota_of_cgroup_v1_and_v2(tmp_path, proc_cgroup, files, expected):
    root = cgroup_files(tmp_path / "cgroup", files)
    (tmp_path / "self_cgroup").write_text(proc_cgroup + "\n")
    assert hardware.cpu_quota(str(root), str(tmp_path / "self_cgroup")) == expected


def cpu_limited_cgroup(name: str) -> Path | None:
    """A real cgroup (v1 `cpu` or v2) with a quota of one CPU, or None where this machine does not let us make one."""
    for folder, files in (
        (Path("/sys/fs/cgroup/cpu") / name, {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "100000"}),
        (Path("/sys/fs/cgroup") / name, {"cpu.max": "100000 100000"}),
    ):
        try:
            folder.mkdir()
        except OSError:
            continue
        try:
            for file, value in files.items():
                (folder / file).write_text(value)
            return folder
        except OSError:
            folder.rmdir()
    return None


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2+ cores")
def test_a_run_in_a_container_with_a_cpu_quota_uses_that_many_threads(tmp_path):
    """torch starts a thread per core of the affinity mask, which a container's CPU quota does not narrow: the
    threads beyond the quota are throttled while they spin (60 steps of the CPU recipe: 7.0 s with 2 threads under a
    1-CPU quota, 5.6 s with 1). A run in a real cgroup with a one-CPU quota trains on one thread and says why."""
    from test_run import TINY_SCRATCH

    group = cpu_limited_cgroup(f"vit-finetune-test-{os.getpid()}")
    if group is None:
        pytest.skip("cannot make a cgroup with a CPU quota here")
    try:
        out = tmp_path / "run"
        command = [
            sys.executable,
            "-m",
            "finetune.run",
            *TINY_SCRATCH,
            "--output_dir",
            str(out),
            "--report_to",
            "none",
        ]
        script = f'echo $$ > {group / "cgroup.procs"} && exec "$@"'
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
        env.pop("OMP_NUM_THREADS", None)  # set by the test workers (conftest.py); a user's would be left alone
        done = subprocess.run(
            ["sh", "-c", script, "sh", *command], env=env, capture_output=True, text=True, timeout=300
        )
    finally:
        group.rmdir()
    assert done.returncode == 0, done.stderr[-2000:]
    assert re.search(
        r"CPU threads: 1 \(the cgroup's CPU quota of 1; torch would use [2-9]\d*\)", done.stdout + done.stderr
    )
    assert json.loads((out / "results.json").read_text())["hardware"]["torch_threads"] == 1


def test_a_gpu_launch_on_a_machine_without_one_says_it_trains_on_the_cpu(tmp_path, monkeypatch):
    """`accelerate launch --config_file configs/accelerate/gpu_bf16.yaml` without a GPU trained on the CPU, in one
    thread, with no word beside the device in the first line."""
    monkeypatch.setattr(hardware, "accelerator_type", lambda use_cpu: "cpu")  # a machine without a GPU
    monkeypatch.setattr(hardware, "cpu_has_native_bf16", lambda flags=None: False)
    monkeypatch.setattr(hardware, "usable_cpus", lambda: 32)
    monkeypatch.setattr(hardware.psutil, "cpu_count", lambda logical=True: 32 if logical else 16)  # 2 threads a core
    options = {"output_dir": str(tmp_path)}

    def warned(env: str | None, threads: int = 16, processes: int = 1, **given) -> list[str]:
        if env is None:
            monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)
        else:
            monkeypatch.setenv("ACCELERATE_USE_CPU", env)  # what `accelerate launch` sets: its `--cpu` / `use_cpu`
        monkeypatch.setenv("LOCAL_WORLD_SIZE", str(processes))
        monkeypatch.setattr(torch, "get_num_threads", lambda: threads)  # what its OMP_NUM_THREADS gave
        said = hardware.choose_settings({**options, **given}).warnings
        return [w.split(":")[0] for w in said if w.startswith("`accelerate launch`")]

    gpu, threads = (
        "`accelerate launch` without `--cpu` asks for a GPU, but torch sees none",
        "`accelerate launch` set OMP_NUM_THREADS=1",
    )
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert warned("False") == [gpu]
    assert warned("True") == []  # `accelerate launch --cpu`
    assert warned(None, threads=1) == []  # `python -m finetune.run` with the user's OMP_NUM_THREADS
    assert warned("False", use_cpu=True) == []  # the CPU asked for
    # accelerate's one thread a process (without `--num_cpu_threads_per_process`): 1 of 16 cores, or 2 of 16.
    assert warned("False", threads=1) == [gpu, threads]
    assert warned("True", threads=1, processes=2) == [threads]
    assert warned("True", threads=8, processes=2) == []
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    said = hardware.launched_on_cpu(True)
    assert said == [
        "`accelerate launch` set OMP_NUM_THREADS=1: its 2 process(es) use 2 of the 16 CPU cores. Fix: `accelerate "
        "launch --num_cpu_threads_per_process 8 ...`."
    ]
