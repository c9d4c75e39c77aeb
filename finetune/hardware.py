"""What a run runs on: the machine recorded in `results.json`, and the settings `choose_settings` picks for it where
the arguments say `auto` (precision, TF32, compilation, CPU or GPU, pinned memory); and the attention kernel."""

import functools
import os
import platform
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import torch


AUTO = "auto"
# CPU flags of native bf16 arithmetic; without them PyTorch runs bf16 autocast through slow conversion paths.
NATIVE_BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
# oneDNN instruction-set caps (`ONEDNN_MAX_CPU_ISA`) below AVX512_CORE_BF16: with one set, oneDNN (PyTorch's CPU
# bf16 matmuls) runs as on a CPU without native bf16, which is how benchmarks/precision.py emulates such a CPU.
ONEDNN_ISAS_WITHOUT_BF16 = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI")
# bf16 against float32 on a CPU without native bf16 (benchmarks/README.md#precision-on-cpus-without-native-bf16).
CPU_BF16_SLOWDOWN = "about 13x"
# bf16 autocast must beat float32 by this much in `measure_cpu_bf16_speedup` for `bf16: auto` to take it on a CPU
# with native bf16: a 2-core Intel Xeon with AVX512-BF16 (no AMX) ran the CPU recipe's step at 0.82x float32's speed,
# where a 2-core AMD EPYC with it trains 1.5-1.7x faster in bf16 (benchmarks/README.md).
CPU_BF16_MIN_SPEEDUP = 1.2
# Largest attention head size for which SDPA's CPU kernel under bf16 is slower than the explicit path (2.5-3x at 12
# and 16: benchmarks/README.md#model-speed-scratchvit-against-transformers-vit). Head size 64 (ViT-B) keeps SDPA.
SMALL_HEAD_SIZE = 32
# Compute capability Triton (inductor's GPU code generator) needs.
TRITON_MIN_CAPABILITY = (7, 0)
# `auto` on CUDA: CUDA graphs replay a pass as one launch, removing the per-kernel launch cost of small-batch steps.
AUTO_CUDA_COMPILE = {"backend": "inductor", "mode": "reduce-overhead"}


def cpuinfo_field(key: str) -> str | None:
    """The value of the first `key` line of `/proc/cpuinfo`; `None` where there is none (e.g. macOS)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return None
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith(key)), None)


def cpu_quota(cgroup_root: str = "/sys/fs/cgroup", proc_cgroup: str = "/proc/self/cgroup") -> float | None:
    """The CPUs that a cgroup's quota lets this process use (a container's `--cpus`, a Kubernetes CPU limit): the
    lowest quota / period of its cgroup, the cgroups above it and the mount's root (a container's own cgroup), from
    cgroup v2's `cpu.max` or v1's `cpu.cfs_quota_us`; None without a quota. The affinity mask does not show it."""
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        return None
    limits = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[2].startswith("/"):  # not `id:controllers:/path`: no quota read from it
            continue
        _, controllers, path = parts
        if controllers and "cpu" not in controllers.split(","):
            continue
        # v1: the controller's mount, `cpu` (a link to `cpu,cpuacct` on most systems) or named as the line names it.
        mounts = {Path(cgroup_root) / "cpu", Path(cgroup_root) / controllers} if controllers else {Path(cgroup_root)}
        folders = {m / p.relative_to("/") for m in mounts for p in [Path(path), *Path(path).parents]}
        for folder in folders:
            try:
                if controllers:  # v1
                    quota = int((folder / "cpu.cfs_quota_us").read_text())
                    period = int((folder / "cpu.cfs_period_us").read_text())
                else:
                    quota, period = (folder / "cpu.max").read_text().split()
                    quota, period = -1 if quota == "max" else int(quota), int(period)
            except (OSError, ValueError):
                continue
            if quota != -1 and period > 0:
                limits.append(quota / period)
    return min(limits, default=None)


def usable_cpus() -> int:
    """The CPU cores this process may use: its affinity mask, capped by a cgroup's CPU quota (rounded down)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    quota = cpu_quota()
    return cores if quota is None else max(1, min(cores, int(quota)))


def describe(device: torch.device | str | None = None) -> dict[str, Any]:
    """The device, its name, the CPU, threads and library versions, for `results.json` and the benchmarks."""
    device = torch.device(device if device is not None else "cuda" if torch.cuda.is_available() else "cpu")
    info: dict[str, Any] = {
        "device": device.type,
        "cpu": cpuinfo_field("model name") or platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }
    if device.type == "cuda" and torch.cuda.is_available():
        info["accelerator"] = torch.cuda.get_device_name(device)  # no index: the current device
        info["cuda"] = torch.version.cuda
    elif device.type == "mps":
        info["accelerator"] = "Apple MPS"
    return info


def short_name(hardware: dict[str, Any] | None) -> str | None:
    """`1x NVIDIA H100 80GB HBM3` or `CPU AMD EPYC, 2 threads`, for tables."""
    if not hardware:
        return None
    if hardware.get("accelerator"):
        return f"1x {hardware['accelerator']}"
    return f"CPU {hardware.get('cpu', '?')}, {hardware.get('torch_threads', '?')} threads"


def cpu_has_native_bf16(flags: set[str] | None = None, max_isa: str | None = None) -> bool:
    """Whether the CPU computes in bf16 natively (AVX512-BF16 or AMX) and oneDNN may use it."""
    flags = set((cpuinfo_field("flags") or "").split()) if flags is None else flags
    max_isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "") if max_isa is None else max_isa
    return max_isa.upper() not in ONEDNN_ISAS_WITHOUT_BF16 and any(flag in flags for flag in NATIVE_BF16_CPU_FLAGS)


@functools.cache
def measure_cpu_bf16_speedup() -> float:
    """How many times faster a linear layer's forward and backward run under bf16 autocast than in float32 on this
    CPU (the flags say whether bf16 is native, not whether it is faster here), on one thread (about 0.1 s), so that
    processes starting side by side barely disturb each other. The fastest time of each counts: a busy machine only
    slows a sample down (on a loaded 2-core AMD EPYC the medians' ratio ran 1.2-16x, the fastest samples' 2.6-4.0x)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[]):  # the run's random numbers stay as if nothing was measured
            layer, x = torch.nn.Linear(256, 1024), torch.randn(512, 256)

        def step(bf16: bool) -> float:
            start = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                y = layer(x)
            y.float().sum().backward()
            return time.perf_counter() - start

        times = {False: [], True: []}
        for _ in range(7):  # the first two of each warm up; alternated, so that a disturbance hits both
            for bf16 in times:
                times[bf16].append(step(bf16))
        return min(times[False][2:]) / min(times[True][2:])
    finally:
        torch.set_num_threads(threads)


def accelerator_type(use_cpu: bool) -> str:
    """`cpu`, `cuda`, `mps` or another torch accelerator's name: where the Trainer will put the model."""
    if use_cpu:
        return "cpu"
    if torch.cuda.is_available():
        return "cuda"
    if torch.backends.mps.is_available():
        return "mps"
    accelerator = getattr(torch, "accelerator", None)
    current = accelerator.current_accelerator() if accelerator is not None and accelerator.is_available() else None
    return current.type if current is not None else "cpu"


def parse_switch(value: Any, name: str) -> bool | str:
    """`true`/`false` (bool or string, as YAML and the command line give them) or `auto`; `none`/`null` is off."""
    text = value if isinstance(value, bool) else str(value).strip().lower()
    if text in (True, False, AUTO):
        return text
    if text in ("true", "1", "yes", "false", "0", "no", "none", "null"):
        return text in ("true", "1", "yes")
    raise ValueError(f"`{name}` must be auto, true or false, got {value!r}.")


@dataclass
class PrecisionChoice:
    """The resolved `bf16` / `fp16` / `tf32` switches, the launcher's mixed precision (which the Trainer takes where
    neither switch is on), why they were chosen, and warnings about explicit choices."""

    bf16: bool
    fp16: bool
    tf32: bool | None
    reasons: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    launcher: str | None = None

    @property
    def mode(self) -> str:
        """`bf16`, `fp16` or `float32`: what the run trains in."""
        return "bf16" if self.bf16 else "fp16" if self.fp16 else self.launcher or "float32"

    @property
    def summary(self) -> str:
        mode = {"bf16": "bf16 autocast", "fp16": "fp16 autocast with loss scaling"}.get(self.mode, self.mode)
        return f"{mode}; " + "; ".join(self.reasons)


def choose_precision(
    bf16: Any,
    fp16: Any,
    tf32: Any,
    device: str,
    *,
    cuda_bf16: bool = False,
    cuda_capability: tuple[int, int] = (0, 0),
    cpu_native_bf16: bool = False,
    cpu_bf16_speedup: float = 1.0,
    launcher_precision: str | None = None,
) -> PrecisionChoice:
    """Resolve `auto` for mixed precision and TF32 from the device; an explicit value is kept, and so is a precision
    given to `accelerate launch --mixed_precision` (`launcher_precision`). CUDA: bf16 where the GPU supports it, else
    fp16; TF32 from compute capability 8.0. CPU: bf16 only if native and measured at least `CPU_BF16_MIN_SPEEDUP`
    times as fast; an explicit bf16 without native bf16 warns. MPS and others: float32 (`--bf16 true` tries it)."""
    bf16, fp16, tf32 = parse_switch(bf16, "bf16"), parse_switch(fp16, "fp16"), parse_switch(tf32, "tf32")
    launcher = launcher_precision if launcher_precision in ("bf16", "fp16") else None
    # A precision chosen explicitly or by the launcher turns `auto` off; a switch on wins over the launcher's.
    if launcher and {"bf16": bf16, "fp16": fp16}[launcher] is False and True not in (bf16, fp16):
        raise ValueError(
            f"`--{launcher} false` and `accelerate launch --mixed_precision {launcher}` disagree, and the launcher's "
            f"would win. Fix: drop `--{launcher} false`, or launch with `--mixed_precision no` for float32."
        )
    if launcher or AUTO not in (bf16, fp16) or True in (bf16, fp16):
        given = True in (bf16, fp16) or not launcher
        reasons = ["as given" if given else f"mixed precision {launcher} from `accelerate launch --mixed_precision`"]
        bf16, fp16 = bf16 is True, fp16 is True
    else:
        if device == "cuda" and cuda_bf16:
            auto, why = "bf16", "this GPU supports bf16"
        elif device == "cuda":
            auto, why = "fp16", "this GPU has no bf16, fp16 instead"
        elif device == "cpu" and cpu_native_bf16:
            fast = cpu_bf16_speedup >= CPU_BF16_MIN_SPEEDUP
            auto = "bf16" if fast else None
            why = f"this CPU has native bf16 (AVX512-BF16/AMX){'; ' if fast else ', but '}bf16 matmuls ran "
            why += f"{cpu_bf16_speedup:.2f}x as fast as float32{'' if fast else ' here'}"
        elif device == "cpu":
            auto = None
            why = f"this CPU has no native bf16 (AVX512-BF16/AMX), where bf16 runs {CPU_BF16_SLOWDOWN} slower"
        else:
            auto, why = None, f"float32 on {device} (mixed precision there is not tested)"
        # auto's pick switched off by hand (`--bf16 false` where auto would use bf16) leaves float32
        refused = {"bf16": bf16, "fp16": fp16}.get(auto) is False
        reasons = [f"{auto} false as given" if refused else f"auto: {why}"]
        bf16, fp16 = bf16 == AUTO and auto == "bf16", fp16 == AUTO and auto == "fp16"
    if tf32 == AUTO:
        tf32 = True if device == "cuda" and cuda_capability >= (8, 0) else None
        if tf32:
            reasons.append("TF32 matmuls (compute capability >= 8.0)")
    choice = PrecisionChoice(bf16, fp16, tf32, reasons, launcher=launcher)
    if device == "cpu" and choice.mode == "fp16":  # accelerate autocasts fp16 on accelerators only
        given = "`accelerate launch --mixed_precision fp16`" if choice.launcher == "fp16" else "`--fp16 true`"
        raise ValueError(
            f"{given} on a CPU trains in float32 (accelerate has no fp16 autocast there), and the run would record "
            "fp16. Fix: `--bf16 true` for mixed precision on a CPU (`--bf16 auto` measures whether it is faster), or "
            f"leave out {given}."
        )
    if device == "cpu" and choice.mode == "bf16" and not cpu_native_bf16:
        choice.warnings.append(
            f"bf16 autocast on a CPU without native bf16 (no AVX512-BF16/AMX) runs {CPU_BF16_SLOWDOWN} slower than "
            "float32. Fix: `--bf16 auto` (or false) unless this is what you want to measure."
        )
    return choice


def choose_attention(requested: str | None, device: str, bf16: bool, head_size: int | None) -> tuple[str, str]:
    """Resolve `attn_implementation: auto`: the explicit path on a CPU under bf16 with small heads (SDPA's CPU
    kernel has no fast bf16 path there), SDPA elsewhere. Returns `(implementation, why)`."""
    if requested not in (None, AUTO):
        return requested, "as given"
    if device == "cpu" and bf16 and head_size is not None and head_size <= SMALL_HEAD_SIZE:
        return "eager", f"auto: CPU, bf16, head size {head_size} <= {SMALL_HEAD_SIZE}"
    return "sdpa", "auto"


@dataclass
class CompileChoice:
    """The resolved `torch_compile`: whether, how (`backend`, `mode`), whether the compiled step must prove itself
    faster than eager (`verify`, for `auto`), and why."""

    enabled: bool
    backend: str | None = None
    mode: str | None = None
    verify: bool = False
    reason: str = ""
    warnings: list[str] = field(default_factory=list)

    @property
    def cuda_graphs(self) -> bool:
        return self.mode in ("reduce-overhead", "max-autotune") or self.backend == "cudagraphs"

    @property
    def summary(self) -> str:
        if not self.enabled:
            return f"eager; {self.reason}"
        return f"torch.compile ({self.backend}{f', mode {self.mode}' if self.mode else ''}); {self.reason}"


def choose_compile(
    requested: Any,
    device: str,
    mode: str | None = None,
    backend: str | None = None,
    cuda_capability: tuple[int, int] = (0, 0),
    gradient_accumulation_steps: int = 1,
) -> CompileChoice:
    """Resolve `torch_compile: auto` (with a `torch_compile_mode` or `_backend` given, `true`, as in transformers):
    on CUDA, inductor with CUDA graphs (without them under gradient accumulation), kept only if faster than eager.
    Elsewhere eager: on the CPU recipes torch.compile gained nothing (benchmarks/README.md) and takes minutes."""
    requested = parse_switch(requested, "torch_compile")
    if requested == AUTO and (mode is not None or backend is not None):
        requested = True
    if requested is False:
        return CompileChoice(False, reason="as given")
    accumulates = gradient_accumulation_steps > 1
    if requested is True:
        choice = CompileChoice(True, backend or "inductor", mode, reason="as given")
        if accumulates and choice.cuda_graphs:
            choice.warnings.append(
                f"torch_compile with CUDA graphs ({backend or mode}) and gradient_accumulation_steps "
                f"{gradient_accumulation_steps}: a graph replay overwrites the gradients accumulated between "
                "micro-batches. Fix: `torch_compile_mode: default`, or `torch_compile: auto`."
            )
        return choice
    if device == "cuda" and cuda_capability < TRITON_MIN_CAPABILITY:
        return CompileChoice(False, reason=f"auto: compute capability {cuda_capability} is below Triton's 7.0")
    if device != "cuda":
        return CompileChoice(False, reason=f"auto: eager on {device}, where torch.compile gained nothing here")
    verified = "kept only if measured faster than eager after warm-up"
    if accumulates:
        why = "inductor without CUDA graphs, which would overwrite gradients accumulated between micro-batches"
        return CompileChoice(True, "inductor", verify=True, reason=f"auto: {why}; {verified}")
    why = "CUDA graphs remove the kernel-launch cost of each step, tried where the launches set the step's pace"
    return CompileChoice(True, verify=True, reason=f"auto: {why}; {verified}", **AUTO_CUDA_COMPILE)


@dataclass
class Settings:
    """The precision and compilation chosen for this machine, the `TrainingArguments` values that replace `auto` and
    the unset machine-dependent options, and warnings to log."""

    precision: PrecisionChoice
    compile: CompileChoice
    arguments: dict[str, Any]
    warnings: list[str]
    cpu_threads: int | None = None  # torch's CPU threads where a cgroup's CPU quota caps them (`cpu_threads`), why
    cpu_threads_reason: str = ""

    @property
    def summary(self) -> str:
        threads = f"; CPU threads: {self.cpu_threads} ({self.cpu_threads_reason})" if self.cpu_threads else ""
        return f"{self.precision.summary}; compilation: {self.compile.summary}{threads}"


def cpu_threads() -> tuple[int | None, str]:
    """torch's CPU threads under a cgroup CPU quota smaller than its default (one per core of the affinity mask):
    threads spinning beyond the quota are throttled (a 1-CPU quota on a 2-core machine: 60 steps of the CPU recipe
    in 7.0 s with 2 threads, 5.6 s with 1; benchmarks/README.md#busy-cpus). `OMP_NUM_THREADS` set (by the user, or
    torchrun for several processes) is left as it is. Returns the threads (None: torch's default) and why."""
    quota = cpu_quota()
    if "OMP_NUM_THREADS" in os.environ or quota is None:
        return None, ""
    share = max(1, usable_cpus() // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    if share >= torch.get_num_threads():
        return None, ""
    return share, f"the cgroup's CPU quota of {quota:g}; torch would use {torch.get_num_threads()}"


def launched_on_cpu(use_cpu: bool | None) -> list[str]:
    """What `accelerate launch` did on a CPU run: without `--cpu` (a config with `use_cpu: false`, e.g.
    configs/accelerate/gpu_bf16.yaml) on a machine without a GPU the run goes on on the CPU; and its
    `OMP_NUM_THREADS` (1 a process unless `--num_cpu_threads_per_process`) can leave cores idle: 1 of 2 here, 1 of
    16 on a laptop."""
    warnings, launched = [], os.environ.get("ACCELERATE_USE_CPU")
    if launched is None:
        return warnings  # not `accelerate launch`
    if use_cpu is None and launched == "False":
        warnings.append(
            "`accelerate launch` without `--cpu` asks for a GPU, but torch sees none: training on the CPU. Fix: a "
            "machine with a GPU and torch's CUDA build, or `accelerate launch --cpu` to mean the CPU."
        )
    # Physical cores, as accelerate counts them for `--cpu`: a second thread a core gains little.
    processes, cores = int(os.environ.get("LOCAL_WORLD_SIZE", "1")), usable_cpus()
    cores = min(cores, psutil.cpu_count(logical=False) or cores)
    if torch.get_num_threads() * processes < cores:
        alone = ", or `python -m finetune.run` (every core)" if processes == 1 else ""
        warnings.append(
            f"`accelerate launch` set OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}: its {processes} "
            f"process(es) use {torch.get_num_threads() * processes} of the {cores} CPU cores. Fix: `accelerate launch "
            f"--num_cpu_threads_per_process {max(1, cores // processes)} ...`{alone}."
        )
    return warnings


def choose_settings(options: Mapping[str, Any]) -> Settings:
    """Answer each `auto` (and each unset machine-dependent option) of the `TrainingArguments` values `options`:
    `use_cpu` where torch sees no accelerator (else processes that `accelerate launch` starts without a GPU would each
    train alone), pinned memory with non-blocking copies where CUDA is used, precision and compilation."""
    use_cpu = options.get("use_cpu")
    use_cpu = accelerator_type(use_cpu=False) == "cpu" if use_cpu is None else use_cpu
    pin_memory = options.get("dataloader_pin_memory")
    pin_memory = torch.cuda.is_available() and not use_cpu if pin_memory is None else pin_memory
    device = accelerator_type(use_cpu)
    machine = {}
    if device == "cuda" and torch.cuda.is_available():
        machine = {"cuda_bf16": torch.cuda.is_bf16_supported(), "cuda_capability": torch.cuda.get_device_capability()}
    elif device == "cpu":
        machine = {"cpu_native_bf16": cpu_has_native_bf16()}
        if machine["cpu_native_bf16"]:
            machine["cpu_bf16_speedup"] = measure_cpu_bf16_speedup()
    compile_choice = choose_compile(
        options.get("torch_compile", AUTO),
        device,
        options.get("torch_compile_mode"),
        options.get("torch_compile_backend"),
        cuda_capability=machine.get("cuda_capability", (0, 0)),
        gradient_accumulation_steps=options.get("gradient_accumulation_steps", 1),
    )
    precision = choose_precision(
        *(options.get(name, AUTO) for name in ("bf16", "fp16", "tf32")),
        device,
        launcher_precision=os.environ.get("ACCELERATE_MIXED_PRECISION"),
        **machine,
    )
    arguments = {
        "use_cpu": use_cpu,
        "dataloader_pin_memory": pin_memory,
        "bf16": precision.bf16,
        "fp16": precision.fp16,
        "tf32": precision.tf32,
        # The pipeline compiles the training forward itself; finetune/compile.py says why the Trainer must not.
        "torch_compile": False,
        "torch_compile_mode": None,
        "torch_compile_backend": None,
    }
    if pin_memory and options.get("accelerator_config") is None:
        # Batches in pinned memory go to the GPU without the host waiting for the copy (and so for the device).
        arguments["accelerator_config"] = {"non_blocking": True}
    warnings = [*compile_choice.warnings, *precision.warnings]
    if device == "cpu":
        warnings += launched_on_cpu(options.get("use_cpu"))
    recipe, alternative = options.get("recipe_precision"), options.get("recipe_alternative")
    if recipe is not None and precision.mode != recipe:
        warnings.append(
            f"This recipe is tuned for training in {recipe}; this machine trains in {precision.mode} "
            f"({'; '.join(precision.reasons)}).{f' Use {alternative}, the recipe for it.' if alternative else ''}"
        )
    return Settings(precision, compile_choice, arguments, warnings, *cpu_threads())
