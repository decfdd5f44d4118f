"""The guest's start-up (``runledger.sandbox.guest.lean_start``): its own import of the SDK loads
neither pydantic's plugins nor ``importlib.metadata``, and leaves the process as an agent expects it
(its environment, a working ``importlib.metadata``, the garbage collector on). Each case runs in a
fresh interpreter, as the guest does in its container."""

from __future__ import annotations

import subprocess
import sys

PREAMBLE = """
import gc, importlib, os, sys
sys.modules.pop("importlib.metadata", None)  # as in the container: nothing has loaded it yet
if hasattr(importlib, "metadata"):
    delattr(importlib, "metadata")
import runledger.sandbox.guest as guest
"""


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", PREAMBLE + code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_sdk_is_imported_without_importlib_metadata() -> None:
    out = _run(
        "with guest.lean_start():\n"
        "    import runledger.sdk.agent\n"
        "print('importlib.metadata' in sys.modules, hasattr(importlib, 'metadata'), 'pydantic' in sys.modules)"
    )
    assert out == "False False True"


def test_the_process_is_left_as_an_agent_expects_it() -> None:
    out = _run(
        "os.environ.pop('PYDANTIC_DISABLE_PLUGINS', None)\n"
        "with guest.lean_start():\n"
        "    assert os.environ['PYDANTIC_DISABLE_PLUGINS'] == '__all__' and not gc.isenabled()\n"
        "    import runledger.sdk.agent\n"
        "from pydantic.plugin import _loader\n"
        # The stand-in pydantic holds runs the real module when first used, and a later import is real.
        "names = {d.metadata['Name'].lower() for d in _loader.importlib_metadata.distributions()}\n"
        "import importlib.metadata\n"
        "same = importlib.metadata.version('pydantic') == __import__('pydantic').VERSION\n"
        "print('PYDANTIC_DISABLE_PLUGINS' in os.environ, gc.isenabled(), 'pydantic' in names,\n"
        "      type(importlib.metadata).__name__, same)"
    )
    assert out == "False True True module True"


def test_a_value_the_environment_had_is_restored() -> None:
    out = _run(
        "os.environ['PYDANTIC_DISABLE_PLUGINS'] = 'some_plugin'\n"
        "with guest.lean_start():\n"
        "    pass\n"
        "print(os.environ['PYDANTIC_DISABLE_PLUGINS'])"
    )
    assert out == "some_plugin"
