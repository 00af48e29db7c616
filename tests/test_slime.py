"""The slime adapter against the slime test double (tests/slime_double), on both slime lines.

The double models stock slime and slime with request-level abort (docs/slime.md, "Two slime
lines"); every scenario of tests/slime_double/harness.py runs against each, with the emulator over
loopback. tests/test_slime_real.py runs the same scenarios against real slime checkouts.
"""

from __future__ import annotations

import asyncio
from typing import Any

import framework_harness
import pytest
from router_helpers import ROUTER_AVAILABLE, start_router

pytest.importorskip("torch")  # slime's Sample holds tensors; the double does too


harness = framework_harness.slime()
fs = harness.fs


@pytest.fixture(scope="module", params=[(line, t) for line in harness.LINES for t in harness.TRANSPORTS], ids="-".join)
def double(request: pytest.FixtureRequest) -> Any:
    line, transport = request.param
    with harness.slime_env("double", harness.DOUBLE_ROOT, line, transport) as env:
        yield env


@pytest.mark.parametrize(("scenario", "kwargs"), harness.scenario_params())
def test_scenario(double: Any, scenario: Any, kwargs: dict[str, Any]) -> None:
    scenario(double, **kwargs)


@pytest.mark.skipif(not ROUTER_AVAILABLE, reason="sglang-router is not installed (the test extra has it)")
@pytest.mark.parametrize("line", harness.LINES)
def test_request_abort_through_the_real_router(line: str) -> None:
    """A rollout abort with fastaccum's request_abort, the streams going through sglang-router to
    two workers: every sample keeps its prefix, drained by rid on the worker that holds it (the
    router does not forward /abort_request); no server-wide abort is sent; the workers are idle
    when request_abort returns."""
    with (
        harness.emulator_thread(token_rate=400) as first,
        harness.emulator_thread(token_rate=400) as second,
        harness.slime_env("double", harness.DOUBLE_ROOT, line) as env,
    ):
        proc, url = start_router([first.url, second.url])
        try:
            host, port = url.removeprefix("http://").split(":")
            args = harness.make_args(env, first, rollout_max_response_len=100_000)
            args.sglang_router_ip, args.sglang_router_port = host, int(port)
            env.http_utils.init_http_client(args)
            samples = [harness.new_sample(env, i) for i in range(8)]

            async def main() -> None:
                tasks = [asyncio.ensure_future(harness.generate_and_rm(env, args, s)) for s in samples]
                await harness.wait_until(lambda: first.running + second.running == len(samples))
                await harness.wait_until(lambda: first.stats.tokens + second.stats.tokens >= 8 * len(samples))
                await fs.request_abort(args, 0)
                await asyncio.gather(*tasks)
                assert first.running == second.running == 0

            env.run(main())
        finally:
            proc.terminate()
            proc.wait(10)
    assert all(s.status == env.Sample.Status.ABORTED and s.response_length > 0 for s in samples)
    assert first.server_wide_aborts == second.server_wide_aborts == 0
    # Each sample's rid to both workers (a stream with no event yet at the abort is named again at
    # its first event: the server may not have held it when the first abort arrived).
    assert set(first.aborted_rids) == set(second.aborted_rids) and len(set(first.aborted_rids)) == len(samples)


@pytest.mark.parametrize("unrelated", [False, True], ids=["absent", "pypi-namesake"])
def test_without_slime_the_error_says_where_slime_comes_from(tmp_path: Any, unrelated: bool) -> None:
    """slime installs from its checkout; a package of that name from PyPI is another project."""
    import subprocess
    import sys

    if unrelated:
        (tmp_path / "slime").mkdir()
        (tmp_path / "slime" / "__init__.py").write_text("")
    code = "import fastaccum.slime._modules as m\ntry:\n    m.modules()\nexcept ImportError as e:\n    print(e)\n"
    done = subprocess.run(
        [sys.executable, "-P", "-c", code],
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "fastaccum.slime runs inside THUDM/slime, which is not importable here" in done.stdout
    assert ("is not it" in done.stdout) == unrelated and "another project" in done.stdout
