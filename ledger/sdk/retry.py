"""Retries of model and tool calls: which failures, how many attempts, how long between them.

A model adapter or a tool may declare a ``Retry``. A failed attempt that the policy retries is
recorded (the step's event with ``attempt`` and ``will_retry``) before the wait, so a crash
between attempts resumes with the next attempt, live, and the record shows every attempt.
When the attempts or the deadline run out, the last failure is the step's failure; if it was of
a retryable kind, a run that ends on it is failed *retryably* (``run.failed`` ``retryable``), and
``runledger resume RUN --retry`` continues it from that step (recorded as ``run.retried``).

What is retryable: an exception that says so (a ``retryable`` attribute that is true, as
``ModelError`` sets for HTTP 429, 5xx and timeouts), or an instance of a type in ``on``.
The waits are exponential with jitter; the jitter is not recorded (it changes no value the
agent sees, only when it sees it).
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Retry:
    """``attempts`` in all (the first included), waits from ``backoff_s`` doubling to at most
    ``max_backoff_s``, each shifted by up to ``jitter`` of itself, and no attempt started after
    ``deadline_s`` from the first (None: no deadline)."""

    attempts: int = 3
    backoff_s: float = 0.5
    max_backoff_s: float = 10.0
    jitter: float = 0.25
    deadline_s: float | None = 60.0
    on: tuple[type[BaseException], ...] = ()

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("Retry.attempts counts the first attempt too: at least 1")

    def retryable(self, exc: BaseException) -> bool:
        return bool(getattr(exc, "retryable", False)) or isinstance(exc, self.on)

    def wait_s(self, attempt: int) -> float:
        """The wait after failed attempt number ``attempt`` (1-based)."""
        base = min(self.max_backoff_s, self.backoff_s * float(2 ** (attempt - 1)))
        return max(0.0, base * (1 + random.uniform(-self.jitter, self.jitter)))

    def another(self, attempt: int, exc: BaseException, elapsed_s: float, wait_s: float) -> bool:
        """Whether to try again, ``wait_s`` from now, after attempt ``attempt`` failed with ``exc``
        ``elapsed_s`` after the first attempt started."""
        if attempt >= self.attempts or not self.retryable(exc):
            return False
        return self.deadline_s is None or elapsed_s + wait_s < self.deadline_s


NO_RETRY = Retry(attempts=1)
