"""Re-run workers: pull requests from the LEDGER_CMD work queue and execute them in sandboxes.

Several workers share one durable pull consumer (``rerun-workers``, made by the admin with the
streams: runledger.log.streams), so each request goes to one worker at a time; a worker sets its
``ack_wait`` and ``max_deliver`` on it when it starts (the last worker started sets them). A
request is acknowledged only after its branch run recorded an outcome; while it runs the worker
signals progress. If the worker dies, the server redelivers the request after ``ack_wait`` and the
next worker resumes the same branch run (its id is derived from the request id), fenced on the
branch's last event: completed once. The sandboxes a dead worker leaves on the same Docker engine
and host are removed by any worker still alive there, every ``reap_interval_s`` (their owner pid
is gone).

Poison requests. Nothing one request does ends the worker. A request that fails its worker
(any unexpected error while handling it, or a worker that died on it and the server
redelivered it) is tried again, at most ``max_attempts`` deliveries in all, counted by the
server (``num_delivered`` in the message's metadata: across workers and restarts). Then it
is dead-lettered: its branch records ``run.failed`` with a ``RerunDeadLetteredError`` that
names the request, the count and the last cause (``Rerunner.dead_letter``; a branch the
request never started is started from the parent's record to hold it), and the message is
terminated, which removes it from the work queue. ``runledger runs`` and ``runledger reruns``
list it; the requests queued behind it go on. Errors no retry can cure (``PERMANENT``) drop
the request at once, as they always did. A request naming code outside the worker's allow-list
(``$RUNLEDGER_ALLOW_CODE``, ``runledger.sdk.agent.CodeAllowList``) is dead-lettered on its first
delivery, with the refusal as its cause: nothing it names was imported or called.

Rejected: a dead-letter subject in LEDGER_CMD. The worker role may not publish under
``ledger.cmd.>`` (only operators command), and the branch run is where an operator already
looks for a re-run's outcome. Rejected too: acting on the server's
``$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES`` advisory, which arrives after the last delivery,
when no worker holds the request any more, on a subject the worker role cannot subscribe to.
The consumer's ``max_deliver`` (``max_attempts`` + 3) stays as the server's backstop: a
request whose dead letter cannot even be written (the server unreachable for every try) stops
being delivered there, and stays in the stream.

Stopping. Once ``stop`` is set no new request is taken, and the re-runs in hand get
``drain_s`` to finish. Then they are cancelled: each one's container is killed and its request
nak'ed, left for redelivery (the next worker resumes the branch, fenced; the interruption
counts as a delivery). The branch is not marked failed: being stopped is not the re-run's
fault, and a re-run that is wedged for good still ends at its own time limit, wherever it
runs next.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import nats
from pydantic import ValidationError

from runledger.errors import (
    CodeNotAllowedError,
    PermissionDeniedError,
    PublishError,
    RunNotFoundError,
    VersionMismatchError,
)
from runledger.log.client import LedgerClient
from runledger.log.permissions import refused_at_once
from runledger.log.streams import rerun_consumer_config
from runledger.log.subjects import CMD_STREAM, RERUN_CONSUMER
from runledger.log.subjects import RERUN_SUBJECT as RERUN_SUBJECT
from runledger.sandbox.containers import SandboxPolicy, SandboxPool
from runledger.sandbox.errors import RerunDeadLetteredError, RerunRequestError, SandboxError
from runledger.sandbox.rerun import Rerunner, RerunRequest, RerunResult, check_names, describe
from runledger.sdk.agent import CodeAllowList

logger = logging.getLogger(__name__)

CONSUMER = RERUN_CONSUMER
PERMANENT = (RerunRequestError, VersionMismatchError, RunNotFoundError)
# The consumer's max_deliver is this many deliveries above max_attempts: room for the delivery
# that dead-letters a request whose last worker died, and for retrying that write.
BACKSTOP = 3


async def submit(client: LedgerClient, request: RerunRequest, allowed: CodeAllowList | None = None) -> None:
    """Queue a re-run request (deduplicated by its request id). Raises CodeNotAllowedError, queuing
    nothing, when it names code outside ``allowed`` (default: ``$RUNLEDGER_ALLOW_CODE`` here); a
    worker checks the request against its own list again."""
    check_names(request, CodeAllowList.from_env() if allowed is None else allowed)
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
    max_attempts: int = 3,
    retry_delay_s: float = 2.0,
    drain_s: float = 10.0,
) -> int:
    """Serve re-run requests until ``stop`` is set (or ``max_requests`` deliveries were handled).
    Returns the count.

    Each request's outcome (its branch's result, or the error that stopped it: a
    ``RerunDeadLetteredError`` when the worker gave it up) goes to ``on_result`` (``runledger
    worker`` prints it); without one, it is logged on this module's logger (INFO, errors at
    WARNING), like everything else the worker has to say. A request that fails unexpectedly is
    nak'ed for another try after ``retry_delay_s`` times its delivery count, and dead-lettered on
    its ``max_attempts``-th delivery (see the module docstring). Each re-run's time limit is
    ``policy.timeout_s`` at most, whatever the request asks for. After ``stop``, returns within
    about ``drain_s`` plus the time to remove the sandboxes."""
    if max_attempts < 1:
        raise ValueError("max_attempts must be at least 1")
    settings = WorkerSettings(
        concurrency=concurrency, pool_size=pool_size, ack_wait_s=ack_wait_s, max_requests=max_requests,
        on_result=on_result, reap_interval_s=reap_interval_s, max_attempts=max_attempts,
        retry_delay_s=retry_delay_s, drain_s=drain_s,
    )  # fmt: skip
    worker = await Worker.open(client, docker, policy, settings)
    return await worker.serve(stop or asyncio.Event())


@dataclass(frozen=True)
class WorkerSettings:
    """A worker's knobs, as ``run_worker`` takes and describes them."""

    concurrency: int
    pool_size: int
    ack_wait_s: float
    max_requests: int | None
    on_result: Callable[[RerunRequest, RerunResult | Exception], None] | None
    reap_interval_s: float
    max_attempts: int
    retry_delay_s: float
    drain_s: float


class Worker:
    """One worker serving the shared consumer: its subscription, sandbox pool and re-runner.

    ``open`` joins the consumer; ``serve`` runs ``concurrency`` fetch loops and the reaper until
    ``stop`` (or ``max_requests``), then drains, closes the pool and leaves the consumer. Each
    delivery goes through ``_handle``: run it, then ack, nak for a retry, term, or give it up as a
    dead letter (the module docstring has the rules).
    """

    def __init__(
        self, sub: Any, pool: SandboxPool, attempts: int, settings: WorkerSettings, rerunner: Rerunner
    ) -> None:
        self.sub = sub
        self.pool = pool
        self.rerunner = rerunner
        self.settings = settings
        # Deliveries before a request is dead-lettered: max_attempts, or fewer if the consumer says so.
        self.attempts = attempts
        self.handled = 0

    @classmethod
    async def open(cls, client: LedgerClient, docker: Any, policy: SandboxPolicy, settings: WorkerSettings) -> Worker:
        """Join the shared durable consumer (setting it to this worker's ``ack_wait`` and
        ``max_deliver``: a pull consumer stays one, whoever updates it) and remove the sandboxes that
        dead workers left on this engine and host."""
        config = rerun_consumer_config(settings.ack_wait_s, settings.max_attempts + BACKSTOP)
        api = f"$JS.API.CONSUMER.CREATE.{CMD_STREAM}.{CONSUMER}.{RERUN_SUBJECT}"
        try:
            await refused_at_once(client.js, api, client.js.add_consumer(CMD_STREAM, config))
        except (TimeoutError, nats.errors.Error, PermissionDeniedError) as exc:
            raise SandboxError(
                f"cannot join the re-run queue's consumer {CONSUMER} on {CMD_STREAM} ({type(exc).__name__}: {exc}): "
                "a worker connects with the worker's credentials (runledger up --secure writes them), and the "
                "admin creates the consumer with the streams (runledger up)"
            ) from exc
        sub = await client.js.pull_subscribe(RERUN_SUBJECT, durable=CONSUMER, stream=CMD_STREAM)
        attempts = await _attempts(sub, settings.max_attempts)
        pool = SandboxPool(docker, policy, size=settings.pool_size)
        await asyncio.to_thread(pool.reap_orphans)
        return cls(sub, pool, attempts, settings, Rerunner(client, pool))

    async def serve(self, stop: asyncio.Event) -> int:
        """Serve until ``stop`` is set or the loops took ``max_requests``; returns the deliveries
        handled. Always closes the pool and leaves the consumer; an error of a loop is raised."""
        reaping = asyncio.create_task(self._reap_orphans_forever())
        loops = [asyncio.create_task(self._fetch_loop(stop)) for _ in range(self.settings.concurrency)]
        stopping = asyncio.create_task(stop.wait())
        serving = asyncio.ensure_future(asyncio.wait(loops))
        try:
            await asyncio.wait([serving, stopping], return_when=asyncio.FIRST_COMPLETED)
            if not serving.done():  # stopped
                await self._drain(loops)
            await _finish(loops)
        finally:
            serving.cancel()
            stopping.cancel()
            reaping.cancel()
            await _finish(loops)
            await self.pool.close()
            with contextlib.suppress(nats.errors.Error):
                await self.sub.unsubscribe()
        return self.handled

    async def _drain(self, loops: list[asyncio.Task[None]]) -> None:
        """Give the re-runs in hand ``drain_s`` to finish; the caller cancels the rest."""
        drain_s = self.settings.drain_s
        _, wedged = await asyncio.wait(loops, timeout=drain_s) if drain_s > 0 else (set(), set(loops))
        if wedged:
            logger.warning("worker: %d re-runs still running %gs after stop: interrupting them (their "
                           "requests are left for redelivery)", len(wedged), drain_s)  # fmt: skip

    async def _fetch_loop(self, stop: asyncio.Event) -> None:
        """Fetch one request at a time and handle it, until stopped or ``max_requests`` were taken."""
        max_requests = self.settings.max_requests
        while not stop.is_set() and (max_requests is None or self.handled < max_requests):
            try:
                msgs = await self.sub.fetch(1, timeout=1)
            except (TimeoutError, nats.errors.TimeoutError):
                continue
            except nats.errors.Error as exc:  # a reconnect in progress, say: the next fetch tries again
                logger.warning("worker: fetching re-run requests failed: %s", exc)
                await asyncio.sleep(1.0)
                continue
            for msg in msgs:
                try:
                    await self._handle(msg)
                except Exception:  # a bug of ours in the handling itself: the request is redelivered
                    logger.exception("worker: handling a re-run request failed; it will be redelivered")

    async def _reap_orphans_forever(self) -> None:
        """Every ``reap_interval_s``, remove the sandboxes of workers that died on this host."""
        interval = self.settings.reap_interval_s
        while True:
            await asyncio.sleep(interval)
            try:
                reaped = await asyncio.to_thread(self.pool.reap_orphans)
            except Exception as exc:  # docker-py raises several types; the next round tries again
                logger.warning("worker: reaping orphaned sandboxes failed: %s; trying again in %gs", exc,
                               interval)  # fmt: skip
                continue
            if reaped:
                logger.info("worker: removed %d sandboxes left by a dead worker", reaped)

    async def _handle(self, msg: Any) -> None:
        """One delivery: parse it, give it up if its earlier deliveries died, else re-run it and settle."""
        self.handled += 1
        try:
            request = RerunRequest.model_validate_json(msg.data)
        except ValidationError as exc:
            logger.warning("worker: dropping a malformed re-run request: %s", exc.errors()[0]["msg"])
            await self._settle(msg.term(), "?")
            return
        delivered = msg.metadata.num_delivered
        if delivered > self.attempts:
            # Every earlier delivery ended without settling it: its worker died on it (killed,
            # out of memory), was stopped, or could not write. Not run again.
            cause = f"its {delivered - 1} deliveries ended without an outcome (its worker died or was stopped)"
            await self._give_up(msg, request, RerunDeadLetteredError(request.request_id, delivered - 1, cause), None)
            return
        beat = asyncio.create_task(self._heartbeat(msg))
        try:
            await self._rerun_and_settle(msg, request, delivered)
        finally:
            beat.cancel()

    async def _rerun_and_settle(self, msg: Any, request: RerunRequest, delivered: int) -> None:
        """Re-run the request, then ack it, term it, nak it for a retry or give it up, by outcome."""
        request_id, attempts = request.request_id, self.attempts
        try:
            result = await self.rerunner.rerun(request)
        except asyncio.CancelledError:
            await self._settle(msg.nak(), request_id)  # stopping: left for redelivery, its container killed
            raise
        except CodeNotAllowedError as exc:  # nothing was imported or called: given up at once, with the reason
            await self._give_up(msg, request, RerunDeadLetteredError(request_id, delivered, describe(exc)), None)
        except PERMANENT as exc:
            self._report(request, exc)
            await self._settle(msg.term(), request_id)  # retrying cannot help
        except PublishError as exc:
            self._report(request, exc)  # fenced or the server is gone: another delivery will settle it
        except Exception as exc:  # anything else, a bug of ours included: retried, then dead-lettered
            logger.warning("worker: re-run %s failed its worker (delivery %d of %d): %s", request_id,
                           delivered, attempts, describe(exc), exc_info=exc)  # fmt: skip
            if delivered >= attempts:
                await self._give_up(msg, request, RerunDeadLetteredError(request_id, delivered, describe(exc)), exc)
            else:
                self._report(request, exc)
                await self._settle(msg.nak(delay=self.settings.retry_delay_s * delivered), request_id)
        else:
            await self._settle(msg.ack_sync(), request_id)
            self._report(request, result)

    async def _give_up(
        self, msg: Any, request: RerunRequest, error: RerunDeadLetteredError, cause: Exception | None
    ) -> None:
        """Record the dead letter on the request's branch and term the message; if the record
        cannot be written, nak it so a later delivery tries again."""
        delivered = msg.metadata.num_delivered
        try:
            await self.rerunner.dead_letter(request, error, cause)
        except PERMANENT as exc:  # no parent to start a branch from: the request goes, with the log's word
            logger.warning("worker: dead-lettered re-run %s has no branch to record it on: %s", request.request_id,
                           describe(exc))  # fmt: skip
        except Exception as exc:
            logger.warning("worker: could not record the dead letter of re-run %s (%s): it stays queued",
                           request.request_id, describe(exc), exc_info=exc)  # fmt: skip
            self._report(request, exc)
            await self._settle(msg.nak(delay=self.settings.retry_delay_s * delivered), request.request_id)
            return
        await self._settle(msg.term(), request.request_id)
        self._report(request, error)

    async def _heartbeat(self, msg: Any) -> None:
        """Tell the server the request is still in hand, three times per ``ack_wait``, until cancelled."""
        while True:
            await asyncio.sleep(max(1.0, self.settings.ack_wait_s / 3))
            with contextlib.suppress(nats.errors.Error):
                await msg.in_progress()

    @staticmethod
    async def _settle(action: Awaitable[None], request_id: str) -> None:
        """Await an ack, nak or term; one that does not reach the server leaves the request to be redelivered."""
        try:
            await action
        except (nats.errors.Error, TimeoutError) as exc:
            logger.warning("worker: could not settle re-run %s (%s): it will be redelivered", request_id, exc)

    def _report(self, request: RerunRequest, outcome: RerunResult | Exception) -> None:
        """Hand an outcome to ``on_result``, or log it; a reporter's failure is logged, never raised."""
        on_result = self.settings.on_result
        try:
            if on_result is not None:
                on_result(request, outcome)
            elif isinstance(outcome, Exception):
                logger.warning("re-run %s: error: %s", request.request_id, describe(outcome))
            else:
                note = "; ".join(n for n in (outcome.reason or "", outcome.time_limit_note) if n)
                logger.info("re-run %s: branch %s %s%s", request.request_id, outcome.run_id, outcome.status,
                            f" ({note})" if note else "")  # fmt: skip
        except Exception as exc:  # a reporter that fails (a closed stdout, say) must not take the worker down
            logger.warning("worker: reporting re-run %s failed: %s", request.request_id, describe(exc))


async def _finish(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel what is still running and wait for it; an error of a finished loop is raised."""
    for task in tasks:
        task.cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    errors = [r for r in results if isinstance(r, Exception)]
    if errors:
        raise errors[0]


async def _attempts(sub: Any, wanted: int) -> int:
    """``wanted``, or fewer when the shared consumer (created by another worker) gives up sooner:
    the worker must dead-letter a request while the server still delivers it."""
    try:
        info = await sub.consumer_info()
    except nats.errors.Error:
        return wanted
    max_deliver = info.config.max_deliver or -1
    if 0 < max_deliver <= wanted:
        logger.warning("worker: consumer %s delivers a request at most %d times: dead-lettering after %d "
                       "deliveries instead of %d", CONSUMER, max_deliver, max(1, max_deliver - 1), wanted)  # fmt: skip
        return max(1, max_deliver - 1)
    return wanted
