"""Guests that lie to the broker: the guest proposes, the host decides.

One test per class of lie (tests/sandbox_agents/liars/agents.py), each against the real Docker engine
and a real nats-server: host secrets asked for through every request, another lineage's key, a
key of the guest's choosing under --allow-effects, model parameter overrides, malformed outcomes
(a lone surrogate among them), a guest that never reads, a disk to fill, floods of events, blobs
and bytes. Each is contained (the branch ends with a clear reason, recorded, never "running"),
the same host then serves an honest re-run, no real effect happens beyond the parent's own
payment (counted by the payment tool's log), and no container is left.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import runledger.sandbox.broker as broker_module
from runledger.log.client import LedgerClient
from runledger.protect.loading import load_run
from runledger.record.fold import Checkpoint, fold
from runledger.sandbox.containers import SandboxPolicy, SandboxPool
from runledger.sandbox.rerun import Rerunner, RerunRequest, RerunResult
from runledger.sdk.lifecycle import start_run
from tests.integration.sandbox.owned import containers_of
from tests.sandbox_agents.liars import agents as liars

pytestmark = [pytest.mark.integration, pytest.mark.docker, pytest.mark.timeout(240)]
MOD = "tests.sandbox_agents.liars.agents"
PARENT = "liar-parent"
CAP_TOKENS = 256
# Host CPU one hostile request nested 100 deep may cost, measured with time.process_time over the
# whole re-run (every thread of this process: broker, branch, NATS and docker clients, the sandbox's
# start and removal) divided by its requests. Generous for a loaded 2-core machine; see the test for
# what was measured. Before: one 3.6 MB request cost 14-24 s (a check pass per level on the event
# loop, then every walk of 1.8 million values).
DEEP_FRAME_CPU_S = 2.0
SECRETS = {  # the host's environment: values that must never reach a guest
    liars.ALLOWED_SECRET: "allowed-value-7d1e2f",
    liars.DECLARED_ONLY: "declared-only-value-5b9c",
    liars.HOST_ONLY: "host-only-value-a41f",
    f"RUNLEDGER_SECRET_{liars.PREFIXED}": "prefixed-value-c0de",
}


@dataclass
class Host:
    client: LedgerClient
    docker: Any
    image: str
    tmp_path: Path
    pools: list[SandboxPool] = field(default_factory=list)
    cpu_s: float = 0.0  # host CPU (this process, every thread) of the last contained re-run
    left: list[str] = field(default_factory=list)  # containers of this process right after it

    def policy(self, **overrides: Any) -> SandboxPolicy:
        base: dict[str, Any] = {"image": self.image, "timeout_s": 30.0, "io_timeout_s": 2.0, "max_tokens": CAP_TOKENS,
                                "secrets": frozenset({liars.ALLOWED_SECRET})}  # fmt: skip
        return SandboxPolicy(**{**base, **overrides})

    def payments(self) -> list[dict[str, Any]]:
        log = self.tmp_path / "pay.log"
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    async def contained(
        self, agent: str, *, policy: SandboxPolicy | None = None, **request: Any
    ) -> tuple[RerunResult, Checkpoint]:
        """Re-run ``agent`` (live from step 0 of the parent), then an honest agent on the same pool.
        Returns the first result and its branch as recorded (content opened)."""
        pool = SandboxPool(self.docker, policy or self.policy(), size=0)
        self.pools.append(pool)
        rerunner = Rerunner(self.client, pool)
        try:
            cpu = time.process_time()
            result = await rerunner.rerun(RerunRequest(parent_run_id=PARENT, agent=f"{MOD}:{agent}", mode="live",
                                                       fork_step=0, timeout_s=30, **request))  # fmt: skip
            self.cpu_s = time.process_time() - cpu
            self.left = containers_of(self.docker, os.getpid())  # before the pool closes: nothing may wait for it
            branch = fold((await load_run(self.client, result.run_id)).records)
            assert branch.status == result.status and branch.status in ("completed", "failed"), branch.status
            # The host is alive and serves the next request with the same pool.
            honest = await rerunner.rerun(RerunRequest(parent_run_id=PARENT, agent=f"{MOD}:honest_spec",
                                                       mode="live", fork_step=0))  # fmt: skip
            assert (honest.status, honest.output) == ("completed", "honest"), honest
        finally:
            await pool.close()
        assert len(pool) == 0
        return result, branch


@pytest.fixture
async def host(
    client: LedgerClient, docker: Any, sandbox_image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Host]:
    monkeypatch.setenv("TEST_PAYMENTS_LOG", str(tmp_path / "pay.log"))
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(liars, "SEEN", [])
    monkeypatch.setattr(liars, "MODEL_CALLS", [])
    parent = await start_run(client, liars.parent_spec(), None, run_id=PARENT)
    assert parent.status == "completed", parent.error
    h = Host(client, docker, sandbox_image, tmp_path)
    assert len(h.payments()) == 1  # the parent's own payment, for order-1
    try:
        yield h
    finally:
        for pool in h.pools:
            await pool.close()
        assert containers_of(docker, os.getpid()) == [], "a sandbox container was left behind"


def recorded_text(branch: Checkpoint) -> str:
    return json.dumps(branch.to_dict(), ensure_ascii=False, default=str)


def failure(branch: Checkpoint) -> str:
    error = branch.error or {}
    return f"{error.get('message')}\n{error.get('traceback')}"


async def test_host_secrets_are_unreachable_through_any_request(host: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    traffic: list[bytes] = []
    original_encode, original_read = broker_module.encode, broker_module.read_message

    def tee_encode(message: dict[str, Any]) -> bytes:
        data = original_encode(message)
        traffic.append(data)
        return data

    async def tee_read(reader: Any, *limits: Any) -> Any:
        message = await original_read(reader, *limits)
        traffic.append(repr(message).encode())
        return message

    monkeypatch.setattr(broker_module, "encode", tee_encode)
    monkeypatch.setattr(broker_module, "read_message", tee_read)
    result, branch = await host.contained("secrets_spec")
    assert result.status == "completed", result.error
    got = result.output
    # Undeclared, or declared but not allowed by the operator: refused, nothing looked up.
    assert "may not resolve secret://RL_HOST_ONLY" in got["host_only"] and "declare it" in got["host_only"]
    assert "may not resolve secret://RL_PREFIXED" in got["prefixed"]
    assert "may not resolve secret://RL_DECLARED_ONLY" in got["declared_only"] and "allow it" in got["declared_only"]
    assert "may not resolve secret://RL_HOST_ONLY" in got["explode_host_only"]
    # Declared and allowed: the tool on the host got the value; the guest gets its token, in the
    # output and in the error message alike.
    assert f"x {SECRETS[liars.ALLOWED_SECRET]} y" in liars.SEEN
    assert "«redacted:secret" in got["allowed"]["echo"]
    assert "ValueError: cannot use «redacted:secret" in got["explode_allowed"]
    assert got["effect"]["simulated"] is True  # a new key, not acted: its secret never resolved
    assert got["model"] == "ok"
    seen = b"".join(traffic)
    assert b"may not resolve" in seen  # the channel was really observed
    record = recorded_text(branch)
    for value in SECRETS.values():
        assert value.encode() not in seen, value
        assert value not in json.dumps(got) and value not in record, value
    assert host.payments()[1:] == []


async def test_another_lineages_key_is_neither_served_nor_acted(host: Host) -> None:
    victim = await start_run(host.client, liars.victim_spec(), None, run_id="victim-run")
    assert victim.status == "completed"
    receipt = victim.output["receipt"]
    assert len(host.payments()) == 2
    result, branch = await host.contained("lineage_spec", allow_effects=True)
    assert result.status == "completed", result.error
    marker = {"simulated": True, "effect": "pay", "key": "pay:victim-7", "reason": "other_lineage"}
    assert result.output == {"tool": marker, "effect": marker}
    assert receipt not in json.dumps(result.output) and receipt not in recorded_text(branch)
    assert branch.committed_keys == [] and set(branch.simulated_keys) == {"pay:victim-7"}
    assert len(host.payments()) == 2  # no second payment for the victim's order


async def test_a_guest_chosen_key_is_refused_under_allow_effects(host: Host) -> None:
    result, branch = await host.contained("chosen_key_spec", allow_effects=True)
    assert (result.status, result.reason) == ("failed", "sandbox"), result
    assert "named its own idempotency key" in failure(branch)
    # Through the Run API the key is not even sent: the host computes pay:order-1 from the
    # arguments and serves the lineage's own record (or marks other arguments), acting nothing.
    polite, branch = await host.contained("polite_key_spec", allow_effects=True)
    assert polite.status == "completed", polite.error
    assert polite.output["same"]["paid"] == {"order": "order-1", "amount": 5}
    assert polite.output["other"]["reason"] == "args_differ" and polite.output["other"]["key"] == "pay:order-1"
    assert branch.committed_keys == ["pay:order-1"]
    assert host.payments() == [{"order": "order-1", "amount": 5}]  # the parent's, and nothing more


async def test_model_parameters_are_the_hosts_to_decide(host: Host) -> None:
    result, branch = await host.contained("model_override_spec")
    assert (result.status, result.reason) == ("failed", "sandbox"), result
    assert "model parameter 'model' is not allowed in a re-run" in failure(branch)
    assert all("model" not in call and "n" not in call for call in liars.MODEL_CALLS)
    capped, branch = await host.contained("many_tokens_spec")
    assert capped.status == "completed", capped.error
    assert {"max_tokens": CAP_TOKENS, "temperature": 0.2} in liars.MODEL_CALLS
    assert all(call.get("max_tokens", 0) <= CAP_TOKENS for call in liars.MODEL_CALLS)
    model_steps = [s for s in branch.steps.values() if s.kind == "model"]
    assert [s.name for s in model_steps] == ["counting-1"]  # the branch's model, as recorded


@pytest.mark.parametrize(
    ("variant", "fragment"),
    [
        ("surrogate_output", "lone surrogate"),
        ("surrogate_error", "lone surrogate"),
        ("surrogate_key", "lone surrogate"),
        ("deep_output", "nested deeper than"),
        ("error_not_an_object", "field 'error' of a failed message has type str"),
        ("nan_args", "NaN is not JSON"),
        ("huge_number", "out of range"),
        ("unknown_field", "unexpected field 'also'"),
        ("name_not_text", "field 'name' of a tool message has type list"),
    ],
)
async def test_a_malformed_message_fails_the_branch_not_the_host(host: Host, variant: str, fragment: str) -> None:
    result, branch = await host.contained(f"malformed_{variant}_spec")
    assert (result.status, result.reason) == ("failed", "sandbox"), result
    text = failure(branch)
    assert "malformed channel message" in text and fragment in text, text[:2000]


async def test_a_guest_that_never_reads_is_cut_off_at_the_write_deadline(host: Host) -> None:
    started = time.monotonic()
    result, branch = await host.contained("never_read_spec")
    assert (result.status, result.reason) == ("failed", "sandbox"), result
    assert "did not read its replies within 2s" in failure(branch)
    assert time.monotonic() - started < 25  # the write deadline, not the 30 s wall clock


async def test_a_guest_cannot_write_to_the_hosts_disk(host: Host) -> None:
    result, branch = await host.contained("disk_spec")
    assert (result.status, result.reason) == ("failed", "exception"), result
    message = (branch.error or {}).get("message") or ""
    report = json.loads(message[message.index("disk attempts: ") + len("disk attempts: ") :])
    tmp = report.pop("/tmp/fill.bin")
    # Nothing outside the container's own tmpfs takes a byte: the socket is the only mount of the
    # host's, and a socket cannot be written to as a file.
    assert all(r["errno"] is not None and r["written"] == 0 for r in report.values()), report
    assert len(report) == 5, report
    assert tmp["errno"] == 28 and tmp["written"] <= 64 * 1024 * 1024, tmp  # ENOSPC: the tmpfs limit holds


@pytest.mark.parametrize(
    ("agent", "limits", "fragment"),
    [
        ("flood_events_spec", {"max_events": 150}, "limit of 150 recorded events"),
        ("flood_blobs_spec", {"max_blobs": 6}, "limit of 6 recorded blobs"),
        ("flood_bytes_spec", {"max_bytes": 400_000}, "limit of 400000 recorded bytes"),
    ],
)
async def test_a_flood_fails_the_branch_at_its_cap(
    host: Host, agent: str, limits: dict[str, int], fragment: str
) -> None:
    result, branch = await host.contained(agent, policy=host.policy(**limits))
    assert (result.status, result.reason) == ("failed", "sandbox"), result
    assert fragment in failure(branch)
    assert len(branch.steps) <= limits.get("max_events", 10_000)


@pytest.mark.parametrize("variant", ["text", "binary", "deep"])
async def test_garbage_before_hello_fails_the_branch_and_leaves_no_container(host: Host, variant: str) -> None:
    result, branch = await host.contained(f"garbage_{variant}_spec")
    assert (result.status, result.reason) == ("failed", "sandbox"), result
    assert branch.status == "failed" and result.run_id == branch.run_id
    assert "did not say hello" in failure(branch), failure(branch)
    assert host.left == [], "the sandbox that sent garbage was left running"
    assert host.payments()[1:] == []


async def test_deep_frames_cost_the_host_a_bounded_cpu_per_request(host: Host) -> None:
    result, branch = await host.contained("deep_frames_spec")
    per_request = host.cpu_s / liars.DEEP_FRAMES
    print(f"host CPU of the re-run: {host.cpu_s:.2f}s for {liars.DEEP_FRAMES} requests ({per_request:.2f}s each)")
    assert per_request < DEEP_FRAME_CPU_S, host.cpu_s
    # Three frames at the cap were served; the huge one was refused before it was parsed.
    assert (result.status, result.reason, result.requests) == ("failed", "sandbox", liars.DEEP_FRAMES - 1), result
    assert "more than 100000 values" in failure(branch), failure(branch)
    assert host.left == []


async def test_big_frames_repeated_stop_at_the_reruns_host_cpu_budget(host: Host) -> None:
    """Tool requests just under the 4 MiB line limit, one after another, each parsed, redacted, recorded
    twice (arguments and output, as blobs) and echoed: before, nothing stopped them until 256 MiB were
    recorded (32 requests, 6.6 s of host CPU here; 21.9 s in the review that found it). Now the re-run
    ends at its budget of host CPU, with the reason."""
    budget = 2.0
    result, branch = await host.contained("repeat_big_frames_spec", policy=host.policy(max_host_cpu_s=budget))
    print(f"host CPU of the re-run: {host.cpu_s:.2f}s, metered {result.host_cpu_s:.2f}s, {result.requests} requests")
    assert (result.status, result.reason) == ("failed", "sandbox"), result
    assert f"over its budget of {budget:g}s (SandboxPolicy.max_host_cpu_s)" in failure(branch), failure(branch)
    # Stopped at the first request past the budget (one request's cost at most over it), long before
    # the byte cap would have.
    assert budget < result.host_cpu_s < budget + DEEP_FRAME_CPU_S, result.host_cpu_s
    assert result.requests < SandboxPolicy().max_bytes // (2 * liars.BIG_FRAME_CHARS), result.requests
    # The witness: the CPU of this whole process over the re-run (its container's start and removal, the
    # branch's start and outcome, every thread), which the meter does not read.
    assert host.cpu_s < budget + DEEP_FRAME_CPU_S, host.cpu_s
    assert host.left == []
