"""Re-run workers: pull requests from the LEDGER_CMD work queue and execute them in sandboxes.

Several workers share one durable pull consumer, so each request goes to one worker at
a time. A request is acknowledged only after its branch run recorded an outcome; while
it runs the worker signals progress. If the worker dies, the server redelivers the
request after ``ack_wait`` and the next worker resumes the same branch run (its id is
derived from the request id), fenced on the branch's last event: completed once. The
sandboxes a dead worker leaves on the same Docker engine and host are removed by any
worker still alive there, every ``reap_interval_s`` (their owner pid is gone).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import nats
from nats.js.api import AckPolicy, ConsumerConfig
from pydantic import ValidationError

from runledger.errors import LedgerError, PublishError, RunNotFoundError, VersionMismatchError
from runledger.log.client import LedgerClient
from runledger.log.subjects import CMD_PREFIX, CMD_STREAM
from runledger.sandbox.containers import SandboxPolicy, SandboxPool
from runledger.sandbox.errors import RerunRequestError
from runledger.sandbox.rerun import Rerunner, RerunRequest, RerunResult

logger = logging.getLogger(__name__)

RERUN_SUBJECT = f"{CMD_PREFIX}.rerun"
CONSUMER = "rerun-workers"
PERMANENT = (RerunRequestError, VersionMismatchError, RunNotFoundError)


async def submit(client: LedgerClient, request: RerunRequest) -> None:
    """Queue a re-run request (deduplicated by its request id)."""
    await client.js.publish(
        RERUN_SUBJECT, request.model_dump_json().encode(), headers={"Nats-Msg-Id": f"rerun:{request.request_id}"}
    )


async def run_worker(
    client: LedgerClient,
    docker: Any,
    *,
    policy: SandboxPolicy,
    concurrency: int = 1,
    pool_size: int = 2,
    ack_wait_s: float = 30.0,
    stop: asyncio.Event | None = None,
    max_requests: int | None = None,
    on_result: Callable[[RerunRequest, RerunResult | Exception], None] | None = None,
    reap_interval_s: float = 10.0,
) -> int:
    """Serve re-run requests until ``stop`` is set (or ``max_requests`` were handled). Returns the count.

    Each request's outcome (its branch's result, or the error that stopped it) goes to
    ``on_result`` (``runledger worker`` prints it); without one, it is logged on this module's
    logger (INFO, errors at WARNING), like everything else the worker has to say."""
    stop = stop or asyncio.Event()
    config = ConsumerConfig(
        durable_name=CONSUMER, ack_policy=AckPolicy.EXPLICIT, ack_wait=ack_wait_s, max_deliver=10,
        filter_subject=RERUN_SUBJECT,
    )  # fmt: skip
    sub = await client.js.pull_subscribe(RERUN_SUBJECT, durable=CONSUMER, stream=CMD_STREAM, config=config)
    pool = SandboxPool(docker, policy, size=pool_size)
    await asyncio.to_thread(pool.reap_orphans)
    rerunner = Rerunner(client, pool)
    handled = 0

    def report(request: RerunRequest, outcome: RerunResult | Exception) -> None:
        if on_result is not None:
            on_result(request, outcome)
        elif isinstance(outcome, Exception):
            logger.warning("re-run %s: error: %s", request.request_id, outcome)
        else:
            logger.info("re-run %s: branch %s %s%s", request.request_id, outcome.run_id, outcome.status,
                        f" ({outcome.reason})" if outcome.reason else "")  # fmt: skip

    async def heartbeat(msg: Any) -> None:
        while True:
            await asyncio.sleep(max(1.0, ack_wait_s / 3))
            with contextlib.suppress(nats.errors.Error):
                await msg.in_progress()

    async def handle(msg: Any) -> None:
        nonlocal handled
        try:
            request = RerunRequest.model_validate_json(msg.data)
        except ValidationError as exc:
            logger.warning("worker: dropping a malformed re-run request: %s", exc.errors()[0]["msg"])
            await msg.term()
            return
        beat = asyncio.create_task(heartbeat(msg))
        try:
            result = await rerunner.rerun(request)
        except PERMANENT as exc:
            report(request, exc)
            await msg.term()  # retrying cannot help
        except PublishError as exc:
            report(request, exc)  # fenced or the server is gone: another delivery will settle it
        except (LedgerError, OSError) as exc:
            report(request, exc)
            await msg.nak(delay=2)
        else:
            await msg.ack_sync()
            report(request, result)
        finally:
            beat.cancel()
            handled += 1

    async def reaper() -> None:
        while True:
            await asyncio.sleep(reap_interval_s)
            try:
                reaped = await asyncio.to_thread(pool.reap_orphans)
            except Exception as exc:  # docker-py raises several types; the next round tries again
                logger.warning("worker: reaping orphaned sandboxes failed: %s; trying again in %gs", exc,
                               reap_interval_s)  # fmt: skip
                continue
            if reaped:
                logger.info("worker: removed %d sandboxes left by a dead worker", reaped)

    async def loop() -> None:
        while not stop.is_set() and (max_requests is None or handled < max_requests):
            try:
                msgs = await sub.fetch(1, timeout=1)
            except (TimeoutError, nats.errors.TimeoutError):
                continue
            for msg in msgs:
                await handle(msg)

    reaping = asyncio.create_task(reaper())
    try:
        await asyncio.gather(*(loop() for _ in range(concurrency)))
    finally:
        reaping.cancel()
        await pool.close()
        with contextlib.suppress(nats.errors.Error):
            await sub.unsubscribe()
    return handled
