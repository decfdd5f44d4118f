"""What building an agent costs at import: the sandbox guest imports ``runledger.sdk.agent`` and an
agent module (which builds its ``AgentSpec``) in every container it starts, before its first
request. Neither needs the protection stack nor the event models, which were most of the guest's
start-up CPU; these tests fail if either comes back onto that path."""

from __future__ import annotations

import subprocess
import sys

# Loaded by the SDK where it records or reads a run, never to build an AgentSpec (a name here also
# stands for the modules under it: runledger.protect.redaction and its private modules).
OFF_THE_START_PATH = (
    "runledger.protect.capture",
    "runledger.protect.redaction",
    "runledger.protect.keystore",
    "runledger.protect.blobs",
    "runledger.record.events",
    "runledger.log",
)


def _heavy(modules: set[str]) -> set[str]:
    return {m for m in modules if m.startswith(OFF_THE_START_PATH)}


def _modules_after(statement: str) -> set[str]:
    code = f"import sys\n{statement}\nprint(' '.join(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(done.stdout.split())


def test_importing_the_agent_module_loads_no_protection_nor_events() -> None:
    assert _heavy(_modules_after("import runledger.sdk.agent")) == set()


def test_the_guest_start_path_loads_no_protection_nor_events() -> None:
    # What the guest does before its first request: import itself, load the agent ahead (the
    # example's module builds its spec at import) and hash its code.
    statement = (
        "import runledger.sandbox.guest as guest\n"
        "spec = guest.preload('runledger.examples.refund_agent.agent:spec')\n"
        "assert spec is not None and spec.data_policy.capture == 'redacted'\n"
        "guest.code_hash(spec.fn)\n"
        "from runledger import AgentSpec, Budgets, DataPolicy, VersionTuple"
    )
    assert _heavy(_modules_after(statement)) == set()


def test_the_redaction_policy_loads_when_it_is_first_read() -> None:
    statement = (
        "import runledger.sdk.agent\n"
        "from runledger.examples.refund_agent.agent import spec\n"
        "from runledger.protect.redaction import RedactionPolicy\n"
        "assert spec().data_policy.redaction == RedactionPolicy()"
    )
    assert "runledger.protect.redaction" in _modules_after(statement)


def test_the_old_import_paths_name_the_same_classes() -> None:
    from runledger.protect import capture, data_policy
    from runledger.record import budgets, events, versions

    assert capture.DataPolicy is data_policy.DataPolicy
    assert capture.Capture is data_policy.Capture
    assert capture.DEFAULT_BLOB_THRESHOLD == data_policy.DEFAULT_BLOB_THRESHOLD
    assert events.Budgets is budgets.Budgets
    assert events.VersionTuple is versions.VersionTuple
    assert events.RunStarted.model_fields["budgets"].annotation is budgets.Budgets
    assert events.RunStarted.model_fields["version"].annotation is versions.VersionTuple
