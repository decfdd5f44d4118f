"""What importing the SDK costs: the public names load on first use, and the sandbox guest's
import path (the guest, the Run API, an agent module) stays off the NATS client, cryptography
and the analytics stack, which every sandbox container would otherwise load at start."""

from __future__ import annotations

import subprocess
import sys

import ledger

HEAVY = ("nats", "cryptography", "duckdb", "pyarrow", "docker")


def _loaded_after(statement: str) -> set[str]:
    code = f"import sys\n{statement}\nprint(' '.join(sorted({{m.split('.')[0] for m in sys.modules}})))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(done.stdout.split())


def test_every_public_name_resolves_to_its_module() -> None:
    for name in ledger.__all__:
        obj = getattr(ledger, name)
        assert obj is not None
        assert name in dir(ledger)


def test_fold_is_the_function_even_after_the_submodule_is_imported() -> None:
    # ``fold`` names a submodule too: importing it must not rebind ``ledger.fold`` to the module.
    _loaded_after("import ledger.fold\nfrom ledger import fold\nassert callable(fold), fold")


def test_the_guest_import_path_is_lean() -> None:
    statement = "import sandbox.guest, ledger.run, ledger.fold\nimport examples.refund_agent.agent"
    assert _loaded_after(statement) & set(HEAVY) == set()


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        ledger.NoSuchThing  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchThing" in str(exc)
    else:
        raise AssertionError("expected AttributeError")
