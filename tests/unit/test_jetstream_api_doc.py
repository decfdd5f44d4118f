"""docs/data-protection.md's table of the JetStream API, role by role, is what ``runledger.protect.roles``
gives each role: every call of every row (tests/jetstream_api.py), for every role, allowed by the
permissions exactly where the doc's cell says (the server is held to the same permissions in
tests/integration/test_jetstream_api.py)."""

from __future__ import annotations

from runledger.protect.roles import permissions
from tests.jetstream_api import ROLES, calls, doc_allows, doc_table, permitted, templates

ROLE_OF = {"agent-NAME": "agent", "analyst": "analyst", "operator": "operator", "worker": "worker", "admin": "admin"}


def test_every_call_of_every_role_is_allowed_exactly_where_the_doc_says() -> None:
    table = doc_table()
    wrong: list[str] = []
    checked = 0
    for row, cells in table.items():
        for template in templates(row):
            for call in (c for c in calls() if c.template == template):
                for column in ROLES:
                    role = ROLE_OF[column]
                    for granted in (False, True) if role == "analyst" else (False,):
                        checked += 1
                        says, gives = (
                            doc_allows(cells[column], call, granted=granted),
                            permitted(role, call.subject, granted=granted),
                        )
                        if says != gives:
                            who = f"{column}{' (granted)' if granted else ''}"
                            verdicts = (
                                f"the doc says {'yes' if says else 'no'}, the permissions {'yes' if gives else 'no'}"
                            )
                            wrong.append(f"{who} {call.subject}: {verdicts}")
    assert not wrong, "docs/data-protection.md's JetStream API table is not the roles' permissions:\n" + "\n".join(
        wrong
    )
    assert checked > 800  # every row, stream, scope and role


def test_the_table_names_every_api_subject_a_role_may_send() -> None:
    """Nothing a role may send to ``$JS.`` is missing from the table: each allowed ``$JS.`` pattern of
    each role matches at least one call the table lets that role send."""
    every = calls()
    table = doc_table()
    for column in ROLES[:-1]:  # the admin's `>` is the table's `all`
        role = ROLE_OF[column]
        patterns = [p for p in permissions(role, "alpha" if role == "agent" else None)["publish"]["allow"]
                    if p.startswith("$JS.")]  # fmt: skip
        for pattern in patterns:
            shown = [c for c in every if permitted(role, c.subject) and _matches(pattern, c.subject)
                     and doc_allows(table[_row(table, c.template)][column], c)]  # fmt: skip
            assert shown, f"{column} may send {pattern}, which no row of the table shows"


def test_no_role_but_the_admin_may_delete_a_consumer_or_create_one_unscoped() -> None:
    for column in ROLES[:-1]:
        for call in calls():
            if call.template.startswith(("CONSUMER.DELETE", "CONSUMER.DURABLE.CREATE")) or call.template in (
                "CONSUMER.CREATE.<stream>", "CONSUMER.CREATE.<stream>.<name>",
            ):  # fmt: skip
                assert not permitted(ROLE_OF[column], call.subject), (column, call.subject)
            if call.template == "CONSUMER.CREATE.<stream>.<name>.<filter>" and permitted(ROLE_OF[column], call.subject):
                # An agent's own runs and keys; the work queue's consumer, which the admin made a pull consumer.
                assert (column, call.stream, call.scope) in {
                    ("agent-NAME", "LEDGER", "own"),
                    ("worker", "LEDGER_CMD", "queue"),
                }


def _row(table: dict[str, dict[str, str]], template: str) -> str:
    return next(row for row in table if template in templates(row))


def _matches(pattern: str, subject: str) -> bool:
    from runledger.log.memory import subject_matches

    return subject_matches(pattern, subject)
