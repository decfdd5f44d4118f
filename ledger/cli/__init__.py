"""The command line: ``main`` is the ``runledger`` program, ``register`` adds the core's sub-commands."""

from runledger.cli.app import main
from runledger.cli.commands import register

__all__ = ["main", "register"]
