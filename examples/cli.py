"""The examples' sub-command of ``runledger``: ``demo``, the refund agent over a few tickets."""

from __future__ import annotations

import argparse
from typing import Any

from runledger.cli.connect import nats_url, run_async


def cmd_demo(args: argparse.Namespace) -> int:
    from runledger.examples.refund_agent.demo import main as demo_main

    return run_async(demo_main(nats_url(args), show=print))


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Entry point of the examples' sub-commands."""
    p = sub.add_parser("demo", parents=[common], help="run the refund agent over a few tickets and show the trace")
    p.set_defaults(func=cmd_demo)
