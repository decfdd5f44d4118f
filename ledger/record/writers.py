"""Who wrote an event: the writer token that ends every run and key subject.

``a`` the agent, ``w`` a worker (re-run branches), ``o`` an operator (decisions). NATS permissions
give each role its own token, so the token says who wrote an event and the fold can refuse a
decision anywhere but on the operator's subject. Subjects are built in ``runledger.log.subjects``;
the tokens live here, below both the log and the fold, so that there is one definition.
"""

from __future__ import annotations

from typing import Literal

Writer = Literal["a", "w", "o"]
AGENT_WRITER: Writer = "a"
WORKER_WRITER: Writer = "w"
OPERATOR_WRITER: Writer = "o"
WRITERS: frozenset[str] = frozenset({AGENT_WRITER, WORKER_WRITER, OPERATOR_WRITER})
