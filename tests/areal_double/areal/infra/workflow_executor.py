"""What the generate loop and a rollout batch use of AReaL's WorkflowExecutor: the pause gate,
and workflows run on their own thread's event loop, handed the inner engine."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from areal.infra import workflow_context
from areal.infra.utils.concurrent import run_until_closed


class WorkflowExecutor:
    def __init__(self, config: Any, inference_engine: Any) -> None:
        self.config = config
        self.inference_engine = inference_engine  # the RemoteInfEngine, not its wrapper
        self._paused = threading.Event()

    def initialize(self, logger: Any = None, train_data_parallel_size: int | None = None) -> None:
        pass

    def destroy(self) -> None:
        pass

    def pause(self) -> None:
        self._paused.set()

    def resume(self) -> None:
        self._paused.clear()

    def is_paused(self) -> bool:
        return self._paused.is_set()

    def rollout_batch(self, data: list[dict[str, Any]], workflow: Any) -> list[Any]:
        """Every episode on one task-runner thread's loop, as AReaL's AsyncTaskRunner runs them."""
        results: list[Any] = []

        async def episodes() -> None:
            try:
                results.extend(
                    await asyncio.gather(*(workflow.arun_episode(self.inference_engine, item) for item in data))
                )
            finally:
                await workflow_context.close_aiohttp_session()

        runner = threading.Thread(target=lambda: run_until_closed(episodes))
        runner.start()
        runner.join()
        return results
