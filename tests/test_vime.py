"""The vime adapter against the vime test double (tests/vime_double), on both vime lines.

The double models vime with and without request-level abort (docs/vime.md, "vime lines");
every scenario of tests/vime_double/harness.py runs against each, with a vLLM-dialect server over
loopback. tests/test_vime_real.py runs the same scenarios inside a real vime tree.
"""

from __future__ import annotations

import sys
from typing import Any

import framework_harness
import numpy as np
import pytest

pytest.importorskip("torch")  # vime's Sample holds tensors; the double does too
pytest.importorskip("httpx")


harness = framework_harness.vime()


@pytest.fixture(scope="module", params=harness.LINES)
def double(request: pytest.FixtureRequest) -> Any:
    with harness.vime_env("double", harness.DOUBLE_ROOT, request.param) as env:
        yield env


@pytest.mark.parametrize(("scenario", "kwargs"), harness.scenario_params())
def test_scenario(double: Any, scenario: Any, kwargs: dict[str, Any]) -> None:
    scenario(double, **kwargs)


def test_import_is_lazy() -> None:
    """``import fastaccum.vime`` never imports vime (vime's rollout manager imports the rollout
    function at start-up; vime is not a dependency)."""
    import subprocess

    code = "import sys, fastaccum.vime; assert not any(m.split('.')[0] == 'vime' for m in sys.modules)"
    # -P: from the checkout's root, its fastaccum/ folder would hide the installed package
    subprocess.run([sys.executable, "-P", "-c", code], check=True)


def test_an_unknown_vime_line_fails_at_import_naming_what_is_missing() -> None:
    """A vime whose Sample takes tokens neither way, and with no server-wide abort fastaccum
    knows, is refused when fastaccum.vime is imported by a loaded vime: one typed error naming
    both, never an AttributeError mid-rollout."""
    import subprocess
    import textwrap

    code = textwrap.dedent(
        """
        import sys, types
        def module(name, **attrs):
            m = types.ModuleType(name); m.__dict__.update(attrs); sys.modules[name] = m; return m
        for name in ("vime", "vime.rollout", "vime.utils"):
            module(name, __path__=[])
        module("vime.rollout.vllm_rollout", GenerateState=object, generate_rollout=None, abort=None,
               _prepare_prompt_ids=None, _build_inference_sampling_params=None)
        module("vime.utils.async_utils"); module("vime.utils.misc", load_function=None)
        module("vime.utils.http_utils", get=None, get_rollout_num_engines=None)
        module("vime.utils.types", Sample=type("Sample", (), {}))
        import fastaccum.vime
        """
    )
    done = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True)
    assert "fastaccum.vime does not know this vime line" in done.stderr, done.stderr
    assert "append_response_tokens or Sample.update_from_meta_info" in done.stderr
    assert "a server-wide abort" in done.stderr


def test_a_calls_weight_versions_are_its_runs_in_order() -> None:
    """vLLM 0.32 sends the versions as spans on the finishing choice (one per version the request
    ran under), which the result reads as its tokens' runs: one entry per run; a stream that did
    not say a version for every token leaves the newest event's, if any."""
    from fastaccum._rollout import call_versions
    from fastaccum.result import StreamResult

    def result(meta: dict[str, Any], spans: Any = None) -> StreamResult:
        return StreamResult(
            mode="incremental", token_ids=np.zeros(9, dtype=np.int32), meta_info=meta, weight_version_spans=spans
        )

    assert call_versions(result({}, ((0, 5, "3"), (5, 9, "4")))) == ["3", "4"]
    assert call_versions(result({"weight_version": "w1"})) == ["w1"]
    assert call_versions(result({})) == []
