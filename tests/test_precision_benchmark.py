"""benchmarks/precision.py: the config's choices as shipped against float32 and forced bf16, and the emulation of a
CPU without native bf16 (in which `auto` must choose float32)."""

import subprocess
import sys
from pathlib import Path

import pytest

from finetune import hardware


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import precision  # noqa: E402


TINY = ["--steps", "1", "--repeats", "1", "--warmup", "0", "--batch_size", "4"]


@pytest.mark.parametrize("native", [False, True])
def test_as_shipped_follows_the_cpu(monkeypatch, capsys, native, tmp_path):
    monkeypatch.setattr(hardware, "cpu_has_native_bf16", lambda flags=None, max_isa=None: native)
    monkeypatch.setattr(hardware, "measure_cpu_bf16_speedup", lambda: 1.8)  # bf16 as fast as AMD EPYC's
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    result = precision.main([*TINY, "--output", str(tmp_path / "new" / "p.json")])  # its folder made
    rows = {r["variant"]: r for r in result["rows"]}
    assert (rows["as shipped (auto)"]["bf16"], rows["as shipped (auto)"]["attention"]) == (
        (True, "eager") if native else (False, "sdpa")
    )
    assert (rows["bf16 forced"]["bf16"], rows["float32"]["bf16"]) == (True, False)
    assert rows["float32"]["ratio_to_float32"] == 1.0 and all(r["images_per_second"] > 0 for r in result["rows"])
    assert "| as shipped (auto) |" in capsys.readouterr().out and (tmp_path / "new" / "p.json").is_file()


@pytest.mark.slow
def test_emulated_cpu_without_native_bf16_trains_in_float32():
    result = subprocess.run(
        [sys.executable, "benchmarks/precision.py", *TINY, "--emulate_no_bf16"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert "native bf16: no" in result.stdout and "ONEDNN_MAX_CPU_ISA=AVX512_CORE_VNNI" in result.stdout
    assert "| as shipped (auto) | float32 | sdpa |" in result.stdout
