"""What a run runs on: the machine recorded in `results.json` (so that every figure names its machine), and the
settings chosen from it where the arguments say `auto`: precision, TF32, compilation, CPU or GPU, pinned memory
(`choose_settings`, a step of its own in `finetune.run`), and the attention kernel."""

import os
import platform
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch


def cpuinfo_field(key: str) -> str | None:
    """The value of the first `key` line of `/proc/cpuinfo`; `None` where there is none (e.g. macOS)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(key):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_name() -> str:
    """The CPU's model name (`/proc/cpuinfo` on Linux, else what `platform` knows)."""
    return cpuinfo_field("model name") or platform.processor() or platform.machine()


def describe(device: torch.device | str | None = None) -> dict[str, Any]:
    """The device, its name, the CPU, threads and library versions, for `results.json` and the benchmarks."""
    device = torch.device(device) if device is not None else None
    info: dict[str, Any] = {
        "device": device.type if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"),
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }
    if info["device"] == "cuda" and torch.cuda.is_available():
        index = device.index if device is not None and device.index is not None else torch.cuda.current_device()
        info["accelerator"] = torch.cuda.get_device_name(index)
        info["cuda"] = torch.version.cuda
    elif info["device"] == "mps":
        info["accelerator"] = "Apple MPS"
    return info


def short_name(hardware: dict[str, Any] | None) -> str | None:
    """`1x NVIDIA H100 80GB HBM3` or `CPU AMD EPYC, 2 threads`, for tables."""
    if not hardware:
        return None
    if hardware.get("accelerator"):
        return f"1x {hardware['accelerator']}"
    return f"CPU {hardware.get('cpu', '?')}, {hardware.get('torch_threads', '?')} threads"


# ---------------------------------------------------------------------------------------------------------------------
# Precision and attention kernels chosen from the machine (`auto`, the default of `bf16`, `fp16`, `tf32` and
# `attn_implementation`).

# CPU flags of native bf16 arithmetic; without them PyTorch runs bf16 autocast through slow conversion paths.
NATIVE_BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
# bf16 autocast against float32 on a CPU without native bf16, training step of the CPU recipe's model
# (benchmarks/README.md, "Precision on CPUs without native bf16").
CPU_BF16_SLOWDOWN = "about 13x"
# Largest attention head size for which SDPA's CPU kernel under bf16 is slower than the explicit path (measured at
# head sizes 12 and 16: 2.5-3x slower; benchmarks/README.md, "model_speed"). Head size 64 (ViT-B) keeps SDPA.
SMALL_HEAD_SIZE = 32
AUTO = "auto"


def cpu_flags() -> set[str]:
    """The CPU's feature flags (`/proc/cpuinfo`; empty where there is none, e.g. macOS)."""
    return set((cpuinfo_field("flags") or "").split())


# oneDNN instruction-set caps (`ONEDNN_MAX_CPU_ISA`) below AVX512_CORE_BF16: with one set, oneDNN (PyTorch's CPU
# bf16 matmuls) runs as on a CPU without native bf16, which is how benchmarks/precision.py emulates such a CPU.
ONEDNN_ISAS_WITHOUT_BF16 = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI")


def cpu_has_native_bf16(flags: set[str] | None = None, max_isa: str | None = None) -> bool:
    """Whether the CPU computes in bf16 natively (AVX512-BF16 or AMX) and oneDNN may use it."""
    flags = cpu_flags() if flags is None else flags
    max_isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "") if max_isa is None else max_isa
    if max_isa.upper() in ONEDNN_ISAS_WITHOUT_BF16:
        return False
    return any(flag in flags for flag in NATIVE_BF16_CPU_FLAGS)


def accelerator_type(use_cpu: bool) -> str:
    """`cpu`, `cuda`, `mps` or another torch accelerator's name: where the Trainer will put the model."""
    if use_cpu:
        return "cpu"
    if torch.cuda.is_available():
        return "cuda"
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return "mps"
    accelerator = getattr(torch, "accelerator", None)
    current = accelerator.current_accelerator() if accelerator is not None and accelerator.is_available() else None
    return current.type if current is not None else "cpu"


def parse_switch(value: Any, name: str) -> bool | str:
    """`true`/`false` (bool or string, as YAML and the command line give them) or `auto`."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text == AUTO:
        return AUTO
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no", "none"):
        return False
    raise ValueError(f"`{name}` must be auto, true or false, got {value!r}.")


@dataclass
class PrecisionChoice:
    """The resolved `bf16` / `fp16` / `tf32` switches, why they were chosen, and warnings about explicit choices."""

    bf16: bool
    fp16: bool
    tf32: bool | None
    reasons: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def summary(self) -> str:
        mode = "bf16 autocast" if self.bf16 else "fp16 autocast with loss scaling" if self.fp16 else "float32"
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
    launcher_precision: str | None = None,
) -> PrecisionChoice:
    """Resolve `auto` for mixed precision and TF32 from the device; an explicit value is kept.

    - CUDA: bf16 where the GPU supports it, else fp16 (the Trainer scales the loss); TF32 matmuls on compute
      capability 8.0 (Ampere) or newer.
    - CPU: bf16 only with native bf16 (AVX512-BF16 or AMX), float32 otherwise. An explicit bf16 on a CPU without it
      is kept, with a warning naming the expected slowdown.
    - Apple MPS and other accelerators: float32. torch's MPS autocast exists, but the Trainer's mixed-precision path
      on MPS could not be tested here; choose `--fp16 true` or `--bf16 true` there to try it.
    - A precision given to `accelerate launch --mixed_precision` counts as explicit: `auto` then leaves it alone.
    """
    bf16, fp16, tf32 = parse_switch(bf16, "bf16"), parse_switch(fp16, "fp16"), parse_switch(tf32, "tf32")
    reasons, warnings = [], []
    launcher = launcher_precision if launcher_precision in ("bf16", "fp16") else None
    if launcher and AUTO in (bf16, fp16):
        reasons.append(f"mixed precision {launcher} from `accelerate launch --mixed_precision`")
        bf16 = False if bf16 == AUTO else bf16
        fp16 = False if fp16 == AUTO else fp16
    if bf16 is True and fp16 == AUTO:
        fp16 = False
    if fp16 is True and bf16 == AUTO:
        bf16 = False
    if bf16 == AUTO or fp16 == AUTO:
        if device == "cuda":
            auto_bf16, auto_fp16 = cuda_bf16, not cuda_bf16
            reasons.append("auto: this GPU supports bf16" if cuda_bf16 else "auto: this GPU has no bf16, fp16 instead")
        elif device == "cpu":
            auto_bf16, auto_fp16 = cpu_native_bf16, False
            reasons.append(
                "auto: this CPU has native bf16 (AVX512-BF16/AMX)"
                if cpu_native_bf16
                else f"auto: this CPU has no native bf16 (AVX512-BF16/AMX), where bf16 runs {CPU_BF16_SLOWDOWN} slower"
            )
        else:
            auto_bf16 = auto_fp16 = False
            reasons.append(f"auto: float32 on {device} (mixed precision there is not tested)")
        bf16 = auto_bf16 if bf16 == AUTO else bf16
        fp16 = (auto_fp16 and not bf16) if fp16 == AUTO else fp16
    else:
        reasons.append("as given")
    uses_bf16 = bf16 or launcher == "bf16"
    if device == "cpu" and uses_bf16 and not cpu_native_bf16:
        warnings.append(
            f"bf16 autocast on a CPU without native bf16 (no AVX512-BF16/AMX) runs {CPU_BF16_SLOWDOWN} slower than "
            "float32. Fix: `--bf16 auto` (or false) unless this is what you want to measure."
        )
    if tf32 == AUTO:
        tf32 = True if device == "cuda" and cuda_capability >= (8, 0) else None
        if tf32:
            reasons.append("TF32 matmuls (compute capability >= 8.0)")
    return PrecisionChoice(bool(bf16), bool(fp16), tf32, reasons, warnings)


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
    """The resolved `torch_compile` switch: whether, how (`backend`, `mode`), whether the compiled training step must
    prove itself faster than eager (`verify`, for `auto`), and why."""

    enabled: bool
    backend: str | None = None
    mode: str | None = None
    verify: bool = False
    reason: str = ""
    warnings: list[str] = field(default_factory=list)

    @property
    def summary(self) -> str:
        if not self.enabled:
            return f"eager; {self.reason}"
        how = f"{self.backend}" + (f", mode {self.mode}" if self.mode else "")
        return f"torch.compile ({how}); {self.reason}"


# Compute capability Triton (inductor's GPU code generator) needs.
TRITON_MIN_CAPABILITY = (7, 0)
# What `auto` compiles with on a CUDA GPU: CUDA graphs replay a whole forward or backward pass as one launch, which
# removes the per-kernel launch cost that bounds small-batch steps (a ViT-B/16 step launches several hundred kernels).
AUTO_CUDA_COMPILE = {"backend": "inductor", "mode": "reduce-overhead"}


def choose_compile(
    requested: Any,
    device: str,
    mode: str | None = None,
    backend: str | None = None,
    cuda_capability: tuple[int, int] = (0, 0),
    gradient_accumulation_steps: int = 1,
) -> CompileChoice:
    """Resolve `torch_compile: auto`; `true` and `false` are kept, and a `torch_compile_mode` or
    `torch_compile_backend` given with `auto` means `true` (as in transformers).

    - CUDA (compute capability >= 7.0): inductor with CUDA graphs (`reduce-overhead`), verified: after warm-up the
      compiled step is timed against the eager one and kept only if it is not slower. With gradient accumulation,
      inductor without CUDA graphs: a graph replay would overwrite the gradients accumulated between micro-batches.
    - CPU, MPS and others: eager. On the CPU recipes torch.compile gained nothing (benchmarks/README.md), and its first
      step takes minutes of C++ compilation.
    """
    requested = parse_switch(requested, "torch_compile")
    if requested == AUTO and (mode is not None or backend is not None):
        requested = True
    if requested is False:
        return CompileChoice(False, reason="as given")
    if requested is True:
        choice = CompileChoice(True, backend or "inductor", mode, verify=False, reason="as given")
        if gradient_accumulation_steps > 1 and (
            mode in ("reduce-overhead", "max-autotune") or backend == "cudagraphs"
        ):
            choice.warnings.append(
                f"torch_compile with CUDA graphs ({backend or mode}) and gradient_accumulation_steps "
                f"{gradient_accumulation_steps}: a graph replay overwrites the gradients accumulated between "
                "micro-batches. Fix: `torch_compile_mode: default`, or `torch_compile: auto`."
            )
        return choice
    if device == "cuda" and cuda_capability >= TRITON_MIN_CAPABILITY and gradient_accumulation_steps > 1:
        return CompileChoice(
            True,
            backend="inductor",
            verify=True,
            reason="auto: inductor without CUDA graphs, which would overwrite gradients accumulated between "
            "micro-batches; kept only if measured faster than eager after warm-up",
        )
    if device == "cuda" and cuda_capability >= TRITON_MIN_CAPABILITY:
        return CompileChoice(
            True,
            verify=True,
            reason="auto: CUDA graphs remove the kernel-launch cost of each step; kept only if measured faster than "
            "eager after warm-up",
            **AUTO_CUDA_COMPILE,
        )
    if device == "cuda":
        return CompileChoice(False, reason=f"auto: compute capability {cuda_capability} is below Triton's 7.0")
    return CompileChoice(False, reason=f"auto: eager on {device}, where torch.compile gained nothing here")


def probe(device: str) -> dict[str, Any]:
    """What `choose_precision` needs to know about this machine's `device`."""
    if device == "cuda" and torch.cuda.is_available():
        return {"cuda_bf16": torch.cuda.is_bf16_supported(), "cuda_capability": torch.cuda.get_device_capability()}
    return {"cpu_native_bf16": cpu_has_native_bf16()} if device == "cpu" else {}


@dataclass
class Settings:
    """What a run uses on this machine: the precision and compilation chosen (each with its reasons), the
    `TrainingArguments` values that replace `auto` and the unset machine-dependent options, and warnings to log."""

    precision: PrecisionChoice
    compile: CompileChoice
    arguments: dict[str, Any]
    warnings: list[str]

    @property
    def summary(self) -> str:
        return f"{self.precision.summary}; compilation: {self.compile.summary}"


def choose_settings(options: Mapping[str, Any]) -> Settings:
    """Answer each `auto` (and each unset machine-dependent option) of `options`, the `TrainingArguments` values as
    given: `use_cpu` where torch sees no accelerator (without it, processes started by `accelerate launch` or
    `torchrun` on a machine with no GPU each train alone instead of joining one gloo process group), pinned memory
    with non-blocking copies where CUDA is used, precision (`choose_precision`) and compilation (`choose_compile`)."""
    use_cpu = options.get("use_cpu")
    use_cpu = accelerator_type(use_cpu=False) == "cpu" if use_cpu is None else use_cpu
    pin_memory = options.get("dataloader_pin_memory")
    pin_memory = torch.cuda.is_available() and not use_cpu if pin_memory is None else pin_memory
    device = accelerator_type(use_cpu)
    machine = probe(device)
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
        # The pipeline compiles the training forward itself (`finetune/compile.py`); the Trainer and accelerate, which
        # would also compile evaluation and stop the run on a compiler error, are told not to.
        "torch_compile": False,
        "torch_compile_mode": None,
        "torch_compile_backend": None,
    }
    if pin_memory and options.get("accelerator_config") is None:
        # Batches in pinned memory go to the GPU without the host waiting for the copy (and so for the device).
        arguments["accelerator_config"] = {"non_blocking": True}
    warnings = [*compile_choice.warnings, *precision.warnings]
    chosen = "bf16" if precision.bf16 else "fp16" if precision.fp16 else "float32"
    recipe = options.get("recipe_precision")
    if recipe is not None and chosen != recipe:
        alternative = options.get("recipe_alternative")
        warnings.append(
            f"This recipe is tuned for training in {recipe}; this machine trains in {chosen} "
            f"({'; '.join(precision.reasons)}).{f' Use {alternative}, the recipe for it.' if alternative else ''}"
        )
    return Settings(precision, compile_choice, arguments, warnings)


def start_cpu_process_group(timeout_seconds: float, backend: str = "gloo") -> None:
    """Start the process group of a multi-process CPU run (`WORLD_SIZE`, `RANK`, `MASTER_ADDR` from the launcher)
    with this timeout, which transformers does not pass on for the CPU; accelerate then joins this group."""
    import torch.distributed

    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group(backend, timeout=timedelta(seconds=timeout_seconds))
