"""The pydantic contract: record/events.py's fast decoder leans on pydantic and pydantic-core
internals, so pyproject.toml pins pydantic to the range these tests passed with.

``decode_fast`` (and ``make_event``) rely on:
  * a payload model's ``__pydantic_core_schema__`` being a ``model`` schema (possibly inside
    ``definitions``) around a ``model-fields`` schema with its ``config``, from which a
    ``SchemaValidator`` of the fields alone is built;
  * that validator accepting and refusing exactly what ``Model.model_validate`` does;
  * ``pydantic_core.from_json(raw, allow_inf_nan=False)``;
  * a BaseModel instance being its ``__dict__`` plus the ``__pydantic_fields_set__``,
    ``__pydantic_extra__`` and ``__pydantic_private__`` slots (it builds events without validating).

These tests fail loudly, naming the supported range, when the installed pydantic is outside the
pin or when any of that changed. (tests/unit/test_events.py compares the two decoders on hostile
input; here every event type goes through each of the internals above.)
"""

from __future__ import annotations

import copy
import operator
import pickle
import re
import tomllib
from pathlib import Path
from typing import Any

import pydantic
import pydantic_core
import pytest
from pydantic import BaseModel

from runledger.record.events import (
    PAYLOADS,
    Event,
    Payload,
    _decode_fast,
    _fields_validator,
    decode,
    decode_fast,
    make_event,
)
from tests.unit.helpers import VERSION, Chain

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def pinned_pydantic() -> str:
    """The version specifier of pydantic in pyproject.toml's core dependencies, e.g. '>=2.9,<2.14'."""
    dependencies = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    found = [d for d in dependencies if re.fullmatch(r"pydantic\s*[<>=!~].*", d)]
    assert len(found) == 1, f"pyproject.toml must pin pydantic exactly once in [project].dependencies: {found}"
    return found[0][len("pydantic") :].split(";")[0].replace(" ", "")


SUPPORTED = pinned_pydantic()
CONTRACT = (
    f"pydantic {pydantic.VERSION} (pydantic-core {pydantic_core.__version__}) is installed; runledger supports "
    f"pydantic{SUPPORTED} (pyproject.toml), because record/events.py's decode_fast builds pydantic-core "
    "SchemaValidators from model schemas and events from their slots. Install a supported pydantic "
    f"(pip install 'pydantic{SUPPORTED}'), or adapt decode_fast to the new internals and widen the pin"
)


# -- the version range ----------------------------------------------------------------------------------

_OPS = {
    ">=": operator.ge,
    "<=": operator.le,
    ">": operator.gt,
    "<": operator.lt,
    "==": operator.eq,
    "!=": operator.ne,
}


def _release(version: str) -> tuple[int, ...]:
    """The numeric release of a version ('2.13.0b1' -> (2, 13, 0)), padded for comparison."""
    match = re.match(r"\d+(\.\d+)*", version.strip())
    assert match is not None, f"not a version: {version!r}"
    parts = tuple(int(p) for p in match.group(0).split("."))
    return parts + (0,) * (4 - len(parts))


def simple_contains(specifier: str, version: str) -> bool:
    """``version`` satisfies every clause of ``specifier`` (>=, <=, >, <, ==, != on release numbers).
    Used when ``packaging`` is not installed; ~= and wildcards are refused rather than guessed."""
    for clause in specifier.split(","):
        match = re.fullmatch(r"(>=|<=|==|!=|>|<)\s*([0-9][0-9.]*)", clause.strip())
        assert match is not None, f"cannot read the clause {clause!r} of {specifier!r} without `packaging`"
        if not _OPS[match.group(1)](_release(version), _release(match.group(2))):
            return False
    return True


def contains(specifier: str, version: str) -> bool:
    try:
        from packaging.specifiers import SpecifierSet
        from packaging.version import Version
    except ImportError:
        return simple_contains(specifier, version)
    return SpecifierSet(specifier).contains(Version(version), prereleases=True)


def test_the_installed_pydantic_is_in_the_supported_range() -> None:
    assert contains(SUPPORTED, pydantic.VERSION), CONTRACT
    # The decoder talks to pydantic-core directly: it must be the one this pydantic was released with.
    matched = getattr(pydantic.version, "check_pydantic_core_version", lambda: True)()
    assert matched, f"pydantic-core does not match pydantic. {CONTRACT}"


@pytest.mark.parametrize(
    ("specifier", "version", "inside"),
    [
        (">=2.9,<2.14", "2.9", True),
        (">=2.9,<2.14", "2.9.0", True),
        (">=2.9,<2.14", "2.13.5", True),
        (">=2.9,<2.14", "2.14.0", False),
        (">=2.9,<2.14", "2.8.2", False),
        (">=2.9,<2.14", "3.0.0", False),
        (">=2.9,<2.14", "2.10.0", True),  # numbers, not strings: 10 > 9
        ("<2.14,>=2.9", "2.1.0", False),
        (">2.9,!=2.11.1", "2.11.1", False),
        ("==2.11.1", "2.11.1", True),
    ],
)
def test_the_range_is_read_as_pip_reads_it(specifier: str, version: str, inside: bool) -> None:
    assert simple_contains(specifier, version) is inside
    assert contains(specifier, version) is inside


# -- the internals decode_fast relies on ------------------------------------------------------------------

ERROR = {"type": "ValueError", "message": "boom"}
# One valid payload of every event type (test_every_event_type_has_a_sample keeps the table complete).
SAMPLES: dict[str, dict[str, Any]] = {
    "run.started": {
        "agent": "a",
        "version": VERSION.model_dump(),
        "budgets": {"turns": 3},
        "input": {"q": [1]},
        "labels": {"team": "x"},
        "parent_run_id": "P",
        "parent_step": 1,
    },
    "run.forked": {"forked_from": "P", "fork_step": 2, "mode": "redrive", "changed": "model", "changed_to": "m2"},
    "run.resumed": {"attempt": 2, "from_step": 1, "worker": "w"},
    "run.suspended": {"step": 3, "request_id": "req-1"},
    "run.completed": {"output": {"ok": True, "n": 1.5}},
    "run.failed": {"reason": "exception", "error": ERROR, "step": 4},
    "run.retried": {"step": 4, "by": "op", "reason": "rate limit over"},
    "model.called": {
        "step": 0,
        "model": "m",
        "request": {"messages": []},
        "args_digest": "d",
        "response": {"content": "hi"},
        "usage": {"input_tokens": 3, "output_tokens": 4},
        "duration_ms": 1.25,
    },
    "tool.called": {"step": 1, "name": "t", "args": {"b": [1, None]}, "args_digest": "d", "error": ERROR},
    "clock.read": {"step": 2, "value": "2026-01-01T00:00:00Z"},
    "random.drawn": {"step": 3, "value": 0.25},
    "effect.intended": {
        "step": 4,
        "name": "refund",
        "key": "refund:o",
        "args": {"o": 1},
        "args_digest": "d",
        "effect_class": "irreversible",
    },
    "effect.committed": {"step": 4, "key": "refund:o", "result": {"id": "r"}, "via": "reconcile"},
    "effect.failed": {"step": 4, "key": "refund:o", "error": ERROR},
    "effect.resolved": {"key": "refund:o", "outcome": "committed", "by": "op", "result": 1},
    "effect.simulated": {"step": 5, "name": "email", "key": "email:t", "args": None},
    "child.started": {"step": 7, "run_id": "P-c7", "agent": "kid", "args_digest": "d"},
    "child.completed": {"step": 7, "run_id": "P-c7", "output": {"ok": [1, None]}},
    "child.failed": {"step": 7, "run_id": "P-c7", "reason": "exception", "error": ERROR},
    "approval.requested": {"step": 6, "request_id": "req-1", "action": "refund", "args": [1], "digest": "d"},
    "approval.resolved": {"request_id": "req-1", "digest": "d", "approved": False, "by": "op", "reason": "no"},
    "budget.granted": {"tokens": 100, "by": "op"},
    "version.accepted": {"agent_version": "1.0.1", "previous": "1.0.0", "by": "op", "reason": "hotfix"},
    "run.erased": {"reason": "gdpr", "by": "op", "kid": "k1", "blobs_deleted": 2},
    "graph.checkpointed": {
        "thread_id": "t-1",
        "checkpoint_ns": "",
        "checkpoint_id": "1f0-a",
        "parent_checkpoint_id": "1f0-9",
        "source": "loop",
        "graph_step": 2,
        "forked": True,
        "header": {"v": 4, "id": "1f0-a", "channel_versions": {"messages": 3}},
        "new_versions": {"messages": "00000000000000000000000000000002.0", "n": 3},
        "channels": ["messages"],
        "values": [{"type": "msgpack", "value": ["hi"]}],
        "metadata": {"type": "msgpack", "value": {"source": "loop"}},
    },
    "journal.snapshotted": {
        "head_seq": 3,
        "head_hash": "0" * 64,
        "head_stream_seq": 9,
        "steps": 2,
        "journal": {"$ref": "blob", "sha256": "a" * 64, "size": 10, "media_type": "application/json"},
    },
    "graph.writes_saved": {
        "thread_id": "t-1",
        "checkpoint_id": "1f0-a",
        "task_id": "task-1",
        "task_path": "~__pregel_pull, agent",
        "channels": ["messages"],
        "writes": [{"type": "null"}],
    },
    "workflow.checkpointed": {
        "workflow_name": "orders",
        "checkpoint_id": "c-2",
        "previous_checkpoint_id": "c-1",
        "graph_signature_hash": "ab" * 32,
        "iteration_count": 2,
        "timestamp": "2026-12-01T10:00:00+00:00",
        "version": "1.0",
        "forked": True,
        "checkpoint": {"messages": {}, "state": {"n": 1}},
    },
    "workflow.checkpoint_deleted": {"workflow_name": "orders", "checkpoint_id": "c-1"},
    "graph.checkpoints_deleted": {
        "thread_id": "t-1",
        "checkpoints": {"": ["1f0-9"], "child:1": ["1f0-8"]},
        "reason": "delete_for_runs",
        "run_ids": ["r-1"],
    },
}
# Values of every JSON type, and nested objects with and without an unknown key: for each field.
PROBES: list[Any] = [
    *(None, True, 0, 7, -1, 1.5, "", "x", "exception", [], [1], {}),
    {"type": "E", "message": "m"},
    {"type": "E", "message": "m", "extra": 1},
    {"agent_version": "v", "model": "m", "prompt_hash": "p"},
]


def _mutations(sample: dict[str, Any], cls: type[Payload]) -> list[dict[str, Any]]:
    """Payloads around a valid one: each field removed or replaced by each probe, an unknown field."""
    out = [sample, {**sample, "unknown": 1}]
    for name in cls.model_fields:
        out.append({k: v for k, v in sample.items() if k != name})
        out.extend({**sample, name: probe} for probe in PROBES)
    return out


def _accepts(validate: Any, payload: dict[str, Any]) -> bool:
    try:
        validate(payload)
    except pydantic.ValidationError:
        return False
    return True


def test_every_event_type_has_a_sample() -> None:
    assert set(SAMPLES) == set(PAYLOADS), "add a valid payload of each new event type to SAMPLES"


@pytest.mark.parametrize("type_", sorted(PAYLOADS))
def test_the_model_schema_has_the_layout_the_fields_validator_is_cut_from(type_: str) -> None:
    schema = PAYLOADS[type_].__pydantic_core_schema__
    model = schema["schema"] if schema["type"] == "definitions" else schema
    assert model["type"] == "model", f"{type_}: core schema {schema['type']!r}/{model['type']!r}. {CONTRACT}"
    assert model["schema"]["type"] == "model-fields", f"{type_}: {model['schema']['type']!r}. {CONTRACT}"
    assert model.get("config", {}).get("extra_fields_behavior") == "forbid", f"{type_}: config moved. {CONTRACT}"
    validator = _fields_validator(PAYLOADS[type_])
    assert isinstance(validator, pydantic_core.SchemaValidator)
    # The validator of the fields alone returns the fields, not a model instance: no fallback was taken.
    validated = validator.validate_python(SAMPLES[type_])
    assert not isinstance(validated, BaseModel), f"{type_}: fields validator built the whole model. {CONTRACT}"


@pytest.mark.parametrize("type_", sorted(PAYLOADS))
def test_the_fields_validator_accepts_and_refuses_what_model_validate_does(type_: str) -> None:
    cls = PAYLOADS[type_]
    fields = _fields_validator(cls)
    assert _accepts(cls.model_validate, SAMPLES[type_]), f"the sample of {type_} is not valid"
    disagreements = [
        (payload, model_says)
        for payload in _mutations(SAMPLES[type_], cls)
        if (model_says := _accepts(cls.model_validate, payload)) != _accepts(fields.validate_python, payload)
    ]
    assert disagreements == [], (
        f"{type_}: (payload, model_validate accepts) where the fields validator differs. {CONTRACT}"
    )
    refused = sum(not _accepts(cls.model_validate, p) for p in _mutations(SAMPLES[type_], cls))
    assert refused > 0  # the probes exercise both answers


def _slots(model: BaseModel) -> dict[str, Any]:
    """Everything a BaseModel instance holds: its __dict__ and every slot of its classes."""
    names = {s for klass in type(model).__mro__ for s in getattr(klass, "__slots__", ())}
    return {name: getattr(model, name) for name in sorted(names)}


def _same_instance(built: Event, validated: Event, what: str) -> None:
    """``built`` (assembled from its parts) is, to pydantic, the event ``validated`` is."""
    expected = set(_slots(validated))
    missing = expected - {n for n in expected if hasattr(built, n)}
    assert not missing, f"{what}: pydantic's BaseModel now also has {sorted(missing)}. {CONTRACT}"
    assert _slots(built) == _slots(validated), f"{what} differs from model_validate_json's event. {CONTRACT}"
    assert built == validated
    assert built.model_dump(mode="json") == validated.model_dump(mode="json")
    assert built.model_copy() == validated and copy.deepcopy(built) == validated
    assert pickle.loads(pickle.dumps(built)) == validated
    with pytest.raises(pydantic.ValidationError):
        built.seq = 99  # type: ignore[misc]  # frozen, as a validated event


@pytest.mark.parametrize("type_", sorted(PAYLOADS))
def test_events_built_without_validation_are_the_events_pydantic_validates(type_: str) -> None:
    chain = Chain()
    chain.start()
    body = PAYLOADS[type_].model_validate(SAMPLES[type_])
    made = chain.add(body)
    raw = chain.raw[-1]
    validated = Event.model_validate_json(raw)
    _same_instance(made, validated, f"make_event of {type_}")
    fast = _decode_fast(raw)
    assert fast is not None, f"decode_fast no longer takes its fast path for {type_}. {CONTRACT}"
    _same_instance(fast, validated, f"decode_fast of {type_}")
    assert decode_fast(raw) == decode(raw) == validated
    assert fast.body == body


def test_from_json_parses_as_the_fast_path_expects() -> None:
    _, raw = make_event(PAYLOADS["run.completed"](output=[1.5, "ü", None, {"b": 2**63 - 1}]),
                        run_id="R", agent="a", seq=0, prev_hash="0" * 64)  # fmt: skip
    data = pydantic_core.from_json(raw, allow_inf_nan=False)
    assert type(data) is dict and list(data) == sorted(data)  # canonical order survives
    assert data["payload"]["output"] == [1.5, "ü", None, {"b": 2**63 - 1}]
    assert type(data["seq"]) is int and type(data["payload"]["output"][0]) is float
    for token in (b"NaN", b"Infinity", b"-Infinity"):
        with pytest.raises(ValueError):
            pydantic_core.from_json(raw.replace(b"1.5", token), allow_inf_nan=False)
    with pytest.raises(ValueError):
        pydantic_core.from_json(raw[:-1], allow_inf_nan=False)
