"""Stopping the tasks a component started: each cancelled and waited for, and whatever error one
ended with as it was cancelled taken (nothing to log), so asyncio never reports it unretrieved."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable


async def stop(tasks: Iterable[asyncio.Task]) -> None:
    tasks = list(tasks)
    for task in tasks:
        task.cancel()
    if tasks:  # a cancellation of stop() itself goes on out, never taken for one of theirs
        await asyncio.wait(tasks)
    for task in tasks:
        if not task.cancelled():
            task.exception()
