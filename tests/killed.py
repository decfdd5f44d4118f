"""A process killed between two steps, in this process: what the drive left in flight dies with it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable


async def killed(drive: Awaitable[object], death: type[BaseException]) -> None:
    """Await ``drive`` (a run that raises ``death`` at a chosen call), then cancel every task it left
    running (the other call of a ``gather``, an effect outcome's copy to the run): a dead process's
    tasks never run again, so none may write after the kill, where the resume would find a second
    writer. Raises AssertionError when the drive was not killed."""
    alive = asyncio.all_tasks()
    try:
        await drive
    except death:
        pass
    else:
        raise AssertionError("the first drive was not killed")
    left = [t for t in asyncio.all_tasks() - alive if t is not asyncio.current_task()]
    for task in left:
        task.cancel()
    await asyncio.gather(*left, return_exceptions=True)
