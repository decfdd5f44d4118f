"""The classes of failure on the page: failed recorded runs grouped by their signature, each opening the
counterfactual matrix of its runs (docs/ui.md).

Read from the page's projection through ``runledger.projections.failures`` (the ``failure_classes`` view the
projector fills with ``runledger.record.failures.failure_signature``): the classes ``runledger failures``
prints, never computed again here. The projection keeps messages sealed, so each class's latest message is
opened as the run page opens content (the viewer's own connection: ``runview.read_run``) and shown masked
(``mask_message``); where the viewer may not open it, the page says it is sealed. An agent's credentials
see their own agent's classes only.
"""

from __future__ import annotations

import dataclasses

from runledger.errors import LedgerError
from runledger.projections.failures import FailureClass, classes_of, classes_query
from runledger.protect.capture import is_placeholder
from runledger.record.failures import mask_message
from runledger.ui.projection import ProjectionFollower
from runledger.ui.runview import read_run
from runledger.ui.viewers import Viewer


async def failures_view(follower: ProjectionFollower, viewer: Viewer, agent: str = "") -> list[FailureClass]:
    """The classes of failure the viewer may see, the most frequent first (one agent's when given)."""
    if viewer.agent is not None:
        if agent and agent != viewer.agent:
            return []
        agent = viewer.agent
    sql, params = classes_query(agent=agent or None)
    classes = classes_of((await follower.query(sql, params)).rows)
    return [c if c.message is not None else await _opened(viewer, c) for c in classes]


async def _opened(viewer: Viewer, c: FailureClass) -> FailureClass:
    """``c`` with its latest run's message, opened with the viewer's credentials and masked, if they may."""
    if not c.example_runs:
        return c
    try:
        _, cp = await read_run(viewer, c.example_runs[0])
    except LedgerError:  # gone, erased, or a key these credentials cannot read: it stays sealed
        return c
    message = (cp.error or {}).get("message")
    if not isinstance(message, str) or is_placeholder(message):
        return c
    return dataclasses.replace(c, message=mask_message(message))
