"""Schema changes of the DuckDB projection: an ordered list whose index + 1 is the version.

Each migration runs in its own transaction together with its row in ``schema_migrations``,
so a file is always at exactly one version. Never edit a shipped migration: append a new
one. A file whose version is above ``LATEST`` was written by a newer runledger and is
refused (``SchemaTooNewError``) rather than guessed at.

Only plain SQL and DuckDB's built-in JSON functions are used, so the file opens in any
DuckDB client with no runledger code. Column meanings are documented in docs/tables.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runledger.projections.errors import SchemaTooNewError


@dataclass(frozen=True)
class Migration:
    name: str
    sql: str


_TABLES = """
CREATE TABLE schema_migrations (
    version     INTEGER PRIMARY KEY,
    name        VARCHAR NOT NULL,
    applied_at  TIMESTAMPTZ NOT NULL DEFAULT current_timestamp
);

CREATE TABLE projector_state (
    stream            VARCHAR NOT NULL,
    stream_created    VARCHAR NOT NULL,
    server_name       VARCHAR,
    server_id         VARCHAR,
    cluster           VARCHAR,
    nats_url          VARCHAR,
    first_seq         BIGINT NOT NULL,
    last_seq          BIGINT NOT NULL,
    events            BIGINT NOT NULL,
    quarantined       BIGINT NOT NULL,
    batches           BIGINT NOT NULL,
    fold_fingerprint  VARCHAR NOT NULL,
    updated_at        TIMESTAMPTZ NOT NULL DEFAULT current_timestamp
);

CREATE TABLE events (
    stream_seq      BIGINT NOT NULL,
    subject         VARCHAR NOT NULL,
    id              VARCHAR NOT NULL,
    run_id          VARCHAR NOT NULL,
    agent           VARCHAR NOT NULL,
    seq             BIGINT,
    type            VARCHAR NOT NULL,
    schema_version  BIGINT,
    ts              TIMESTAMPTZ,
    ts_text         VARCHAR NOT NULL,
    step            BIGINT,
    payload         JSON NOT NULL,
    prev_hash       VARCHAR NOT NULL,
    hash            VARCHAR NOT NULL,
    size            BIGINT NOT NULL
);

CREATE TABLE quarantine (
    stream_seq  BIGINT NOT NULL,
    subject     VARCHAR NOT NULL,
    reason      VARCHAR NOT NULL,
    error       VARCHAR NOT NULL,
    size        BIGINT NOT NULL,
    preview     VARCHAR NOT NULL,
    raw         BLOB NOT NULL
);

CREATE TABLE runs (
    run_id              VARCHAR PRIMARY KEY,
    agent               VARCHAR,
    subject             VARCHAR NOT NULL,
    status              VARCHAR NOT NULL,
    failure_reason      VARCHAR,
    error_type          VARCHAR,
    error_message       VARCHAR,
    agent_version       VARCHAR,
    model               VARCHAR,
    prompt_hash         VARCHAR,
    tool_schema_hashes  JSON,
    version             JSON,
    parent_run_id       VARCHAR,
    fork_step           BIGINT,
    fork_mode           VARCHAR,
    fork_changed        VARCHAR,
    started_at          TIMESTAMPTZ,
    ended_at            TIMESTAMPTZ,
    duration_s          DOUBLE,
    spent_seconds       DOUBLE,
    turns               BIGINT,
    tokens              BIGINT,
    input_tokens        BIGINT,
    output_tokens       BIGINT,
    limit_turns         BIGINT,
    limit_tokens        BIGINT,
    limit_seconds       DOUBLE,
    attempts            BIGINT,
    steps               BIGINT NOT NULL,
    last_step           BIGINT,
    events              BIGINT,
    pending_approvals   VARCHAR[] NOT NULL,
    committed_keys      VARCHAR[] NOT NULL,
    in_doubt_keys       VARCHAR[] NOT NULL,
    simulated_keys      VARCHAR[] NOT NULL,
    capture             VARCHAR,
    input               JSON,
    output              JSON,
    first_stream_seq    BIGINT NOT NULL,
    last_stream_seq     BIGINT NOT NULL,
    fold_error          VARCHAR
);

CREATE TABLE steps (
    run_id         VARCHAR NOT NULL,
    step_no        BIGINT NOT NULL,
    kind           VARCHAR NOT NULL,
    name           VARCHAR NOT NULL,
    status         VARCHAR NOT NULL,
    input_hash     VARCHAR NOT NULL,
    output         JSON,
    error          JSON,
    effect_key     VARCHAR,
    request_id     VARCHAR,
    tokens         BIGINT,
    input_tokens   BIGINT,
    output_tokens  BIGINT,
    duration_ms    DOUBLE,
    started_at     TIMESTAMPTZ,
    seq            BIGINT,
    agent          VARCHAR,
    agent_version  VARCHAR,
    version        JSON,
    PRIMARY KEY (run_id, step_no)
);

CREATE TABLE checkpoints (
    run_id            VARCHAR PRIMARY KEY,
    status            VARCHAR NOT NULL,
    last_step         BIGINT,
    next_seq          BIGINT,
    last_stream_seq   BIGINT NOT NULL,
    first_stream_seq  BIGINT NOT NULL,
    fold_error        VARCHAR,
    checkpoint        JSON NOT NULL
);

CREATE TABLE effect_keys (
    subject          VARCHAR PRIMARY KEY,
    key              VARCHAR NOT NULL,
    status           VARCHAR NOT NULL,
    run_id           VARCHAR,
    step             BIGINT,
    result           JSON,
    error            JSON,
    via              VARCHAR,
    events           BIGINT,
    last_hash        VARCHAR NOT NULL,
    last_stream_seq  BIGINT NOT NULL
);

CREATE TABLE model_prices (
    model              VARCHAR PRIMARY KEY,
    usd_per_1m_input   DOUBLE NOT NULL,
    usd_per_1m_output  DOUBLE NOT NULL
);
"""

_VIEWS = """
-- One row per effect step of a run, with the truth of its idempotency key's own subject.
CREATE VIEW effects AS
WITH s AS (SELECT * FROM steps WHERE kind = 'effect')
SELECT
    coalesce(s.effect_key, k.key) AS key,
    CASE
        WHEN s.run_id IS NULL THEN
            CASE k.status WHEN 'claimed' THEN 'in_doubt' WHEN 'free' THEN 'released' ELSE k.status END
        WHEN s.status IN ('committed', 'failed', 'simulated') THEN s.status
        WHEN k.status = 'claimed' THEN 'in_doubt'
        WHEN k.status = 'committed' THEN 'committed'
        ELSE 'intended'
    END AS state,
    coalesce(s.run_id, k.run_id) AS run_id,
    coalesce(s.step_no, k.step) AS step,
    s.name AS name,
    s.agent AS agent,
    CASE WHEN s.status = 'committed' THEN coalesce(k.via, 'record') ELSE k.via END AS via,
    coalesce(s.output, k.result) AS result,
    coalesce(s.error, k.error) AS error,
    s.started_at AS started_at,
    s.duration_ms AS duration_ms,
    k.status AS key_status,
    k.subject AS key_subject
FROM s FULL OUTER JOIN effect_keys k
    ON k.key = s.effect_key AND k.run_id = s.run_id AND k.step = s.step_no;

-- One row per approval step as the fold sees it, with what was asked and when it was decided.
CREATE VIEW approvals AS
WITH requested AS (
    SELECT run_id, payload->>'request_id' AS request_id, payload->'args' AS args
    FROM events
    WHERE type = 'approval.requested' AND starts_with(subject, 'ledger.run.')
), resolved AS (
    SELECT run_id, payload->>'request_id' AS request_id, payload->>'digest' AS digest,
           arg_min(ts, stream_seq) AS decided_at
    FROM events
    WHERE type = 'approval.resolved' AND starts_with(subject, 'ledger.run.')
    GROUP BY ALL
)
SELECT
    s.run_id, s.step_no AS step, s.request_id, s.name AS action, s.input_hash AS digest, s.status,
    q.args, s.started_at AS requested_at,
    s.output->>'by' AS decided_by, s.output->>'reason' AS reason,
    CASE WHEN s.status IN ('approved', 'denied') THEN r.decided_at END AS decided_at,
    s.agent
FROM steps s
LEFT JOIN requested q ON q.run_id = s.run_id AND q.request_id = s.request_id
LEFT JOIN resolved r ON r.run_id = s.run_id AND r.request_id = s.request_id AND r.digest = s.input_hash
WHERE s.kind = 'approval';

CREATE VIEW effects_in_doubt AS
SELECT key, run_id, step, name, agent, started_at FROM effects WHERE state = 'in_doubt';

CREATE VIEW pending_approvals AS
SELECT run_id, step, request_id, action, args, requested_at, agent FROM approvals WHERE status = 'pending';

-- Failed runs and the first step that went wrong (an error, a failed effect or a denial).
CREATE VIEW failed_runs AS
SELECT
    r.run_id, r.agent, r.failure_reason, r.error_type, r.error_message, r.started_at, r.ended_at,
    f.step_no AS first_bad_step, f.kind AS first_bad_kind, f.name AS first_bad_name,
    f.status AS first_bad_status
FROM runs r
LEFT JOIN (
    SELECT run_id, arg_min(step_no, step_no) AS step_no, arg_min(kind, step_no) AS kind,
           arg_min(name, step_no) AS name, arg_min(status, step_no) AS status
    FROM steps WHERE status IN ('error', 'failed', 'denied')
    GROUP BY run_id
) f ON f.run_id = r.run_id
WHERE r.status = 'failed';

CREATE VIEW token_usage_daily AS
SELECT
    CAST(s.started_at AS DATE) AS day, s.agent, s.name AS model, count(DISTINCT s.run_id) AS runs,
    count(*) AS calls, sum(s.input_tokens) AS input_tokens, sum(s.output_tokens) AS output_tokens,
    sum(s.tokens) AS tokens
FROM steps s WHERE s.kind = 'model'
GROUP BY ALL;

CREATE VIEW step_latency AS
SELECT
    kind, name, count(*) AS calls,
    quantile_cont(duration_ms, 0.5) AS p50_ms, quantile_cont(duration_ms, 0.95) AS p95_ms,
    max(duration_ms) AS max_ms
FROM steps WHERE kind IN ('model', 'tool', 'effect')
GROUP BY ALL;

-- Cost needs prices: fill model_prices (it survives --rebuild); unknown models cost NULL.
CREATE VIEW run_costs AS
SELECT
    s.run_id, any_value(s.agent) AS agent, sum(s.input_tokens) AS input_tokens,
    sum(s.output_tokens) AS output_tokens,
    sum(s.input_tokens * p.usd_per_1m_input + s.output_tokens * p.usd_per_1m_output) / 1e6 AS cost_usd,
    bool_and(p.model IS NOT NULL) AS priced
FROM steps s LEFT JOIN model_prices p ON p.model = s.name
WHERE s.kind = 'model'
GROUP BY s.run_id;

CREATE VIEW forks AS
SELECT r.run_id, r.parent_run_id, r.fork_step, r.fork_mode, r.fork_changed, r.status,
       p.status AS parent_status, r.agent, r.started_at
FROM runs r LEFT JOIN runs p ON p.run_id = r.parent_run_id
WHERE r.parent_run_id IS NOT NULL;
"""

# Child runs (``run.child``): a child's run and step in its parent, the child of a child step, the tree.
# ``runs.parent_run_id`` stays the branch's (run.forked): a child is not a fork.
_CHILD_RUNS = """
ALTER TABLE runs ADD COLUMN child_of_run_id VARCHAR;
ALTER TABLE runs ADD COLUMN child_of_step BIGINT;
ALTER TABLE steps ADD COLUMN child_run_id VARCHAR;

CREATE VIEW child_runs AS
SELECT r.run_id, r.child_of_run_id AS parent_run_id, r.child_of_step AS parent_step, r.agent, r.status,
       p.agent AS parent_agent, p.status AS parent_status, s.status AS step_status, r.started_at, r.ended_at
FROM runs r
LEFT JOIN runs p ON p.run_id = r.child_of_run_id
LEFT JOIN steps s ON s.run_id = r.child_of_run_id AND s.step_no = r.child_of_step AND s.kind = 'child'
WHERE r.child_of_run_id IS NOT NULL;
"""

# Who claimed a key (``KeyState.writer``): the projector folds a key's later messages by it (a worker's
# word is never the agent's: runledger.sdk.effects.agent_view). NULL in rows projected before: read as "" (never
# claimed), until `runledger project --rebuild` folds them again.
_KEY_WRITER = """
ALTER TABLE effect_keys ADD COLUMN writer VARCHAR;
"""

# One name for a step's number in every table and view: ``steps.step_no`` becomes ``step``, as in
# ``events``, ``effect_keys``, ``effects`` and ``approvals`` (DuckDB's error on the old name lists
# ``step`` as the candidate). The views that read it are made again, and ``effects`` gains ``args``:
# what the effect was called with (the first ``effect.intended``, or ``effect.simulated`` in a live
# re-run, of its run and step; content, sealed like ``result`` unless opened: docs/tables.md).
_STEP = """
ALTER TABLE steps RENAME COLUMN step_no TO step;

CREATE OR REPLACE VIEW effects AS
WITH s AS (SELECT * FROM steps WHERE kind = 'effect'),
joined AS (
    SELECT
        coalesce(s.effect_key, k.key) AS key,
        CASE
            WHEN s.run_id IS NULL THEN
                CASE k.status WHEN 'claimed' THEN 'in_doubt' WHEN 'free' THEN 'released' ELSE k.status END
            WHEN s.status IN ('committed', 'failed', 'simulated') THEN s.status
            WHEN k.status = 'claimed' THEN 'in_doubt'
            WHEN k.status = 'committed' THEN 'committed'
            ELSE 'intended'
        END AS state,
        coalesce(s.run_id, k.run_id) AS run_id,
        coalesce(s.step, k.step) AS step,
        s.name AS name,
        s.agent AS agent,
        CASE WHEN s.status = 'committed' THEN coalesce(k.via, 'record') ELSE k.via END AS via,
        coalesce(s.output, k.result) AS result,
        coalesce(s.error, k.error) AS error,
        s.started_at AS started_at,
        s.duration_ms AS duration_ms,
        k.status AS key_status,
        k.subject AS key_subject
    FROM s FULL OUTER JOIN effect_keys k
        ON k.key = s.effect_key AND k.run_id = s.run_id AND k.step = s.step
), intents AS (
    SELECT run_id, step, arg_min(payload->'args', stream_seq) AS args
    FROM events
    WHERE type IN ('effect.intended', 'effect.simulated') AND starts_with(subject, 'ledger.run.')
    GROUP BY run_id, step
)
SELECT j.key, j.state, j.run_id, j.step, j.name, j.agent, j.via, j.result, j.error, j.started_at,
       j.duration_ms, j.key_status, j.key_subject, i.args
FROM joined j LEFT JOIN intents i ON i.run_id = j.run_id AND i.step = j.step;

CREATE OR REPLACE VIEW approvals AS
WITH requested AS (
    SELECT run_id, payload->>'request_id' AS request_id, payload->'args' AS args
    FROM events
    WHERE type = 'approval.requested' AND starts_with(subject, 'ledger.run.')
), resolved AS (
    SELECT run_id, payload->>'request_id' AS request_id, payload->>'digest' AS digest,
           arg_min(ts, stream_seq) AS decided_at
    FROM events
    WHERE type = 'approval.resolved' AND starts_with(subject, 'ledger.run.')
    GROUP BY ALL
)
SELECT
    s.run_id, s.step, s.request_id, s.name AS action, s.input_hash AS digest, s.status,
    q.args, s.started_at AS requested_at,
    s.output->>'by' AS decided_by, s.output->>'reason' AS reason,
    CASE WHEN s.status IN ('approved', 'denied') THEN r.decided_at END AS decided_at,
    s.agent
FROM steps s
LEFT JOIN requested q ON q.run_id = s.run_id AND q.request_id = s.request_id
LEFT JOIN resolved r ON r.run_id = s.run_id AND r.request_id = s.request_id AND r.digest = s.input_hash
WHERE s.kind = 'approval';

CREATE OR REPLACE VIEW failed_runs AS
SELECT
    r.run_id, r.agent, r.failure_reason, r.error_type, r.error_message, r.started_at, r.ended_at,
    f.step AS first_bad_step, f.kind AS first_bad_kind, f.name AS first_bad_name,
    f.status AS first_bad_status
FROM runs r
LEFT JOIN (
    SELECT run_id, min(step) AS step, arg_min(kind, step) AS kind,
           arg_min(name, step) AS name, arg_min(status, step) AS status
    FROM steps WHERE status IN ('error', 'failed', 'denied')
    GROUP BY run_id
) f ON f.run_id = r.run_id
WHERE r.status = 'failed';

CREATE OR REPLACE VIEW child_runs AS
SELECT r.run_id, r.child_of_run_id AS parent_run_id, r.child_of_step AS parent_step, r.agent, r.status,
       p.agent AS parent_agent, p.status AS parent_status, s.status AS step_status, r.started_at, r.ended_at
FROM runs r
LEFT JOIN runs p ON p.run_id = r.child_of_run_id
LEFT JOIN steps s ON s.run_id = r.child_of_run_id AND s.step = r.child_of_step AND s.kind = 'child'
WHERE r.child_of_run_id IS NOT NULL;
"""

# Classes of failure (runledger.record.failures): each failed run's class id and the parts it is made of,
# computed by the projector from the fold with ``failure_signature`` (the same function `runledger
# failures` and the page read it through); the classes of recorded runs (branches are re-runs of them, not
# failures of their own) with their counts, when they were first and last seen, and example runs. Rows
# projected before it have NULL classes until `runledger project --rebuild`.
_FAILURE_CLASSES = """
ALTER TABLE runs ADD COLUMN failure_class VARCHAR;
ALTER TABLE runs ADD COLUMN failure_step BIGINT;
ALTER TABLE runs ADD COLUMN failure_step_kind VARCHAR;
ALTER TABLE runs ADD COLUMN failure_step_name VARCHAR;
ALTER TABLE runs ADD COLUMN failure_shape VARCHAR;

CREATE VIEW failure_classes AS
SELECT
    failure_class AS class_id, agent, any_value(error_type) AS error_type,
    any_value(failure_step_kind) AS step_kind, any_value(failure_step_name) AS step_name,
    count(*) AS runs, min(ended_at) AS first_seen, max(ended_at) AS last_seen,
    list(run_id ORDER BY ended_at DESC, run_id)[1:3] AS example_runs,
    arg_max(error_message, ended_at) AS last_message,
    any_value(failure_shape) AS shape
FROM runs
WHERE status = 'failed' AND failure_class IS NOT NULL AND parent_run_id IS NULL
GROUP BY failure_class, agent;
"""

# Forgeries under a run's id (``runs.forgeries``): messages its fold refused from their writers (another
# agent under a taken run id, a worker on an agent's run, a forged decision) and bytes that are no event
# off its own subject, each quarantined; counted from the checkpoint's ``refused`` for rows projected before.
_FORGERIES = """
ALTER TABLE runs ADD COLUMN forgeries BIGINT;
UPDATE runs SET forgeries = coalesce(
    (SELECT json_array_length(c.checkpoint, '$.refused') FROM checkpoints c WHERE c.run_id = runs.run_id), 0);
"""

MIGRATIONS: list[Migration] = [
    Migration("tables", _TABLES),
    Migration("views", _VIEWS),
    Migration("child runs", _CHILD_RUNS),
    Migration("key writer", _KEY_WRITER),
    Migration("step", _STEP),
    Migration("failure classes", _FAILURE_CLASSES),
    Migration("forgeries", _FORGERIES),
]
LATEST = len(MIGRATIONS)


def current_version(con: Any) -> int:
    """The schema version of an open DuckDB connection (0 for an empty file)."""
    # fetchall, never fetchone: DuckDB refuses new work on a connection with an unfinished result.
    exists = con.execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_name = 'schema_migrations'"
    ).fetchall()
    if not exists[0][0]:
        return 0
    rows = con.execute("SELECT coalesce(max(version), 0) FROM schema_migrations").fetchall()
    return int(rows[0][0])


def migrate(con: Any, path: str) -> int:
    """Bring the file to ``LATEST``, one transaction a migration. Returns the version it found.

    Raises SchemaTooNewError when the file is ahead of this code.
    """
    found = current_version(con)
    if found > LATEST:
        raise SchemaTooNewError(path, found, LATEST)
    for version in range(found + 1, LATEST + 1):
        migration = MIGRATIONS[version - 1]
        con.execute("BEGIN TRANSACTION")
        try:
            con.execute(migration.sql)
            con.execute("INSERT INTO schema_migrations (version, name) VALUES (?, ?)", [version, migration.name])
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
    return found
