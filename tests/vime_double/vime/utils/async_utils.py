"""Double of vime.utils.async_utils: one background event-loop thread; AsyncPacer (no pacing)."""

import asyncio
import threading


class AsyncPacer:
    async def wait(self):
        await asyncio.sleep(0)


class _LoopThread:
    def __init__(self):
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

    def run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()


async_loop = None


def run(coro):
    global async_loop
    if async_loop is None:
        async_loop = _LoopThread()
    return async_loop.run(coro)
