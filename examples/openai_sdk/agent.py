"""An agent that uses the official OpenAI SDK, its calls recorded as model steps of a runledger run.

    export OPENAI_API_KEY=...                  # read by the SDK; never recorded
    python -m runledger.examples.openai_sdk.agent --nats URL --run R-1 "What is an idempotency key?"
    python -m runledger.examples.openai_sdk.agent --nats URL --run R-1 --resume   # answered from the record

From the ``runledger`` program, ``env_spec`` is the same agent configured by the SDK's own variables
(``OPENAI_BASE_URL``, ``OPENAI_API_KEY``) and ``OPENAI_MODEL``::

    runledger run --agent runledger.examples.openai_sdk.agent:env_spec --input '"What is an idempotency key?"'

``--base-url`` points the SDK at any OpenAI-compatible server. The second command resumes the run:
the recorded answer comes back as a ``ChatCompletion`` without calling the API. ``--sync`` runs the
same agent written as blocking code (``sync_agent``) with the blocking client, ``openai.OpenAI``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import Any

import openai

from runledger import AgentSpec, Run, SyncRun, connect, sync_agent
from runledger.integrations.openai import OpenAIModel, recorded
from runledger.sdk.lifecycle import resume_run, start_run

NAME = "openai-sdk-example"


def spec(base_url: str | None, model: str) -> AgentSpec:
    async def agent(run: Run) -> Any:
        async with openai.AsyncOpenAI(base_url=base_url) as sdk:
            client = recorded(sdk, run)  # the one line that makes the calls below steps of the run
            answer = await client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": str(run.input)}]
            )
            return answer.choices[0].message.content

    return AgentSpec(NAME, agent, OpenAIModel(model=model), agent_version="v1")


def env_spec() -> AgentSpec:
    """``spec`` as the SDK configures itself: ``OPENAI_BASE_URL`` (read by the SDK) and ``OPENAI_MODEL``."""
    return spec(None, os.environ.get("OPENAI_MODEL", "gpt-4o-mini"))


def sync_spec(base_url: str | None, model: str) -> AgentSpec:
    def agent(run: SyncRun) -> Any:
        with openai.OpenAI(base_url=base_url) as sdk:
            client = recorded(sdk, run)  # the blocking client, recorded through the SyncRun
            answer = client.chat.completions.create(model=model, messages=[{"role": "user", "content": str(run.input)}])
            return answer.choices[0].message.content

    return AgentSpec(NAME, sync_agent(agent), OpenAIModel(model=model), agent_version="v1")


async def main_async(args: argparse.Namespace) -> None:
    agent_spec = (sync_spec if args.sync else spec)(args.base_url, args.model)
    async with await connect(args.nats) as client:
        if args.resume:
            result = await resume_run(client, agent_spec, args.run)
        else:
            result = await start_run(client, agent_spec, args.question, run_id=args.run)
    print(result.status, result.output if result.status == "completed" else result.error)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("question", nargs="?", default="Say hello.")
    parser.add_argument("--nats", required=True, help="the ledger's NATS URL")
    parser.add_argument("--run", required=True, help="the run id")
    parser.add_argument("--resume", action="store_true", help="resume the run instead of starting it")
    parser.add_argument("--sync", action="store_true", help="the blocking agent and client (openai.OpenAI)")
    parser.add_argument("--model", default="gpt-4o-mini")
    parser.add_argument("--base-url", default=None, help="an OpenAI-compatible endpoint (default: OpenAI's)")
    asyncio.run(main_async(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
