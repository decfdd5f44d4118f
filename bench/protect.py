"""What content protection costs: the transform alone, a recorded step end to end, and the worst input.

    python -m bench.protect [--steps 1000] [--adversarial-only]

1. ``PayloadProtector.protect`` on a typical tool step (about 1 KB of arguments and output
   with one secret), per capture mode, with and without sealing; and redaction of a large
   document per MB.
2. Runs of tool steps on an embedded nats-server (fsync before every ack), the policies
   taking turns round by round: the time per recorded step, so the protection's share of a
   real step is visible.
3. Adversarial input: for every detector (and the registered-secret search and the base64
   and URL-encoded wrappers), 1 MiB of each input built to make it work hardest (prefixes
   that almost match, repeated: ``-eyJ`` for the JWT detector, ``AKIA`` for AWS key ids, digit
   groups for cards, ``password =`` with nothing after it...), redacted by that detector alone
   and by the whole default redactor, medians of interleaved runs, against baselines over the same
   MiB in the same runs (``str.replace`` of a character it does not hold: one pass over the memory;
   a regex that visits every character and matches none: the engine's cost a character). And, apart,
   "dense" input where every candidate is a real, distinct secret: its cost is one token each.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import random
import re
import statistics
import time
from collections.abc import Callable
from typing import Any

from bench.common import server, summary, table
from bench.report import Goal, Section, SuiteOptions, Table, num, ratio_cell, ratio_stats
from runledger import AgentSpec, Run, ScriptedModel
from runledger.log.client import connect
from runledger.protect import redaction
from runledger.protect.capture import DataPolicy, PayloadProtector
from runledger.protect.keystore import RunKeys
from runledger.protect.redaction import DETECTORS, RedactionPolicy, Redactor, _detectors
from runledger.record.events import ToolCalled
from runledger.sdk.lifecycle import start_run

POLICIES = {
    "full, unsealed (no protection)": DataPolicy(capture="full", encrypt=False),
    "redacted, unsealed": DataPolicy(capture="redacted", encrypt=False),
    "redacted, sealed (default)": DataPolicy(),
    "hash-only": DataPolicy(capture="hash-only", encrypt=False),
}

ARGS = {
    "url": "https://api.example.com/v1/orders/8891",
    "headers": {"Accept": "application/json", "X-Request-Id": "01JD3V6W8Y0Q9ZK4XH5M2N7P8R"},
    "body": {"customer": "Ann Example", "note": "refund requested, parcel arrived broken " * 4},
}
OUTPUT = {
    "status": 200,
    "order": {"id": "order-8891", "amount": 42.5, "items": [{"sku": f"SKU-{i}", "qty": i} for i in range(10)]},
    "debug": "upstream used key sk-proj-Abcdefghij0123456789KLMNOPqrstuv for this call",
    "text": "Lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 8,
}


async def transform_costs(n: int = 2000) -> dict[str, dict[str, float]]:
    """µs per ``protect()`` of a typical tool step, per policy."""
    out = {}
    body = ToolCalled(step=0, name="http", args=ARGS, args_digest="d" * 64, output=OUTPUT)
    for label, policy in POLICIES.items():
        keys = RunKeys.generate("bench.run")
        protector = PayloadProtector(policy, keys if (policy.encrypt or policy.capture != "full") else None)
        times = []
        for _ in range(n):
            t = time.perf_counter()
            await protector.protect(body)
            times.append((time.perf_counter() - t) * 1e6)
        out[label] = summary(times)
    return out


def large_document_cost(mb: int = 20) -> float:
    """ms per MB to redact a large text document."""
    line = "Invoice 2026-11-29 order-8891 amount 10.50 EUR customer Ann Example; see https://example.com/x?id=9\n"
    doc = line * (mb * 1024 * 1024 // len(line))
    redactor = Redactor(os.urandom(32))
    t = time.perf_counter()
    redactor.redact_text(doc)
    return (time.perf_counter() - t) / mb * 1000


async def step_costs(steps: int, rounds: int = 5) -> dict[str, Any]:
    """ms per recorded tool step, per policy: ``rounds`` rounds of one run of ``steps // rounds`` steps per policy.

    The policies take turns inside each round, so the extra cost over "no protection" is paired round by round.
    """

    async def agent(run: Run) -> Any:
        for i in range(per_run):
            await run.tool("http", {**ARGS, "i": i}, fn=lambda a: OUTPUT)
        return per_run

    per_run = max(1, steps // rounds)
    per_step: dict[str, list[float]] = {label: [] for label in POLICIES}
    with server() as state:
        async with await connect(state.url) as client:
            warm = AgentSpec("bench", agent, ScriptedModel([]), agent_version="v1")
            await start_run(client, warm, None)
            for _ in range(rounds):
                for label, policy in POLICIES.items():
                    spec = AgentSpec("bench", agent, ScriptedModel([]), agent_version="v1", data_policy=policy)
                    t = time.perf_counter()
                    await start_run(client, spec, None)
                    per_step[label].append((time.perf_counter() - t) / per_run * 1000)
    return {"steps_per_run": per_run, "rounds": rounds, "ms_per_step": per_step}


# -- 3. adversarial input -----------------------------------------------------------------------------------

MIB = 1024 * 1024
ADVERSARIAL_GOAL_MS = 100.0
KNOWN_SECRET = "hunter2-rosebud-xyzzy-42"  # registered, as a resolved secret:// reference would be


def _fill(unit: str) -> Callable[[int], str]:
    return lambda size: (unit * (size // len(unit) + 1))[:size]


def _random(make: Callable[[random.Random], str]) -> Callable[[int], str]:
    def build(size: int) -> str:
        rng = random.Random(size)
        parts: list[str] = []
        total = 0
        while total < size:
            parts.append(make(rng))
            total += len(parts[-1])
        return "".join(parts)[:size]

    return build


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


_PRINTABLE = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,:;-"
_SECRET_RUN = _b64(b"password: hunter2") + " "  # one secret: the exact path, every run's offsets


def _text_run(rng: random.Random) -> str:
    return _b64(bytes(rng.choices(_PRINTABLE, k=12))) + " "


def _after_secret(build: Callable[[int], str]) -> Callable[[int], str]:
    return lambda size: _SECRET_RUN + build(size - len(_SECRET_RUN))


def _luhn_digit(body: str) -> str:
    return str(next(d for d in range(10) if redaction.luhn_ok(body + str(d))))


# detector -> (name, builder of `size` characters). Near misses: every candidate fails late, or the
# shape that made the former patterns rescan (quadratic JWT: `-eyJ`; `aws`/`password` prefixes).
ADVERSARIAL: dict[str, list[tuple[str, Callable[[int], str]]]] = {
    "private_key": [
        ("header, no footer", _fill("-----BEGIN PRIVATE KEY-----")),
        ("`-----BEGIN A A A ...`", _fill("-----BEGIN A A A A A A A A ")),
        ("4-dash header", _fill("-----BEGIN RSA PRIVATE KEY----\n")),
        ("`private key ` (hint only)", _fill("private key ")),
    ],
    "url_password": [
        ("`://user:`", _fill("://user:")),
        ("`a://` + 255 + `:` + 255, no `@`", _fill("a://" + "u" * 255 + ":" + "p" * 255 + " ")),
        ("`ab://u:p` + 250 chars", _fill("ab://u:p" + "x" * 250 + " ")),
    ],
    "slack_webhook": [
        ("`https://hooks.slack.com/services/`", _fill("https://hooks.slack.com/services/")),
        ("webhook + 19 chars", _fill("https://hooks.slack.com/services/" + "T" * 19 + " ")),
    ],
    "anthropic_key": [
        ("`sk-ant-`", _fill("sk-ant-")),
        ("`sk-ant-aa-` + 19 chars", _fill("sk-ant-aa-" + "x" * 19 + " ")),
    ],
    "openai_key": [
        ("`sk-`", _fill("sk-")),
        ("`sk-` + 19 chars", _fill("sk-" + "a" * 19 + " ")),
        ("`xsk-` + 30 chars (no boundary)", _fill("xsk-" + "a" * 30 + " ")),
    ],
    "stripe_key": [("`sk_live_`", _fill("sk_live_")), ("`sk_live_` + 15 chars", _fill("sk_live_" + "a" * 15 + " "))],
    "aws_access_key_id": [("`AKIA`", _fill("AKIA")), ("`AKIA` + 15 chars", _fill("AKIA" + "A" * 15 + " "))],
    "aws_secret_key": [
        ("`aws `", _fill("aws ")),
        ("`aws secret `", _fill("aws secret ")),
        ("`aws_secret_access_key = ` + 39 chars", _fill("aws_secret_access_key = " + "a" * 39 + " ")),
    ],
    "github_token": [
        ("`ghp_`", _fill("ghp_")),
        ("`ghp_` + 35 chars", _fill("ghp_" + "a" * 35 + " ")),
        ("`github_pat_`", _fill("github_pat_")),
    ],
    "slack_token": [("`xoxb-`", _fill("xoxb-")), ("`xoxb-` + 9 chars", _fill("xoxb-" + "a" * 9 + " "))],
    "google_api_key": [("`AIza`", _fill("AIza")), ("`AIza` + 34 chars", _fill("AIza" + "a" * 34 + " "))],
    "google_oauth_token": [("`ya29.`", _fill("ya29.")), ("`ya29.` + 19 chars", _fill("ya29." + "a" * 19 + " "))],
    "jwt": [
        ("`-eyJ`", _fill("-eyJ")),
        ("`.eyJ`", _fill(".eyJ")),
        ("`eyJ` + 8 + `.x.` (no 2nd eyJ)", _fill("eyJ" + "a" * 8 + ".x.")),
        ("two segments, short third", _fill("eyJaaaaaaaa.eyJbbbbbbbb.ccccccc ")),
    ],
    "bearer_token": [("`bearer `", _fill("bearer ")), ("`Bearer ` + 7 chars", _fill("Bearer " + "a" * 7 + " "))],
    "basic_auth": [("`Basic `", _fill("Basic ")), ("`Basic ` + 11 chars", _fill("Basic " + "A" * 11 + " "))],
    "credential": [
        ("`password=` (one value)", _fill("password=")),
        ("`password\\n`", _fill("password\n")),
        ("`password =\\n` (no value)", _fill("password =\n")),
        ('`password: ""\\n`', _fill('password: ""\n')),
        ("`max_tokens: 1\\n` (not a secret)", _fill("max_tokens: 1\n")),
        ("`password: ` + 1,000 blanks", _fill("password: " + " " * 1000 + "\n")),
        ("`password: a,b;c ` (separators inside a value)", _fill("password: a,b;c ")),
    ],
    "card_number": [
        ("`4111 ` (digit groups)", _fill("4111 ")),
        ("digits only", _fill("4")),
        ("`4111-1`", _fill("4111-1")),
    ],
    "registered secret": [
        ("its prefix, repeated", _fill(KNOWN_SECRET[:-1] + " ")),
        ("its first character", _fill(KNOWN_SECRET[0])),
    ],
    "base64": [
        ("one 1 MiB blob (binary)", lambda size: _b64(random.Random(1).randbytes(size * 3 // 4))[:size]),
        ("one blob of text", lambda size: _b64(("lorem ipsum dolor sit amet " * (size // 27 + 1)).encode())[:size]),
        ("mixed-case runs of 16", _random(lambda r: "".join(r.choice("aAbB0+") for _ in range(16)) + " ")),
        ("base64 of `AKIA` + 15 chars", _fill(_b64(b"AKIA" + b"A" * 15) + " ")),
        ("76-column lines", _fill(_b64(b"x" * 57) + "\n")),
        # As many distinct runs as fit, each decoding to text every detector then scans (the probe's worst).
        ("distinct runs of 16, text inside, one a secret", _after_secret(_random(_text_run))),
        ("distinct runs of 16, digits inside", _random(lambda r: _b64(bytes(r.choices(b"0123456789", k=12))) + " ")),
    ],
    "urlencoded": [
        ("`%3D%3D%3D `", _fill("%3D%3D%3D ")),
        ("`password%3D `", _fill("password%3D ")),
        ("`a%20b%20c%20d `", _fill("a%20b%20c%20d ")),
        ("one long run, escape at the end", lambda size: "a" * (size - 3) + "%3D"),
    ],
}

# Every candidate a real, distinct secret: the cost is one token (an HMAC and a string) each.
DENSE: dict[str, tuple[str, Callable[[int], str]]] = {
    "aws_access_key_id": (
        "distinct key ids",
        _random(lambda r: "AKIA" + "".join(r.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567") for _ in range(16)) + " "),
    ),
    "card_number": (
        "distinct valid cards",
        _random(lambda r: (b := "4" + "".join(r.choice("0123456789") for _ in range(14))) + _luhn_digit(b) + " "),
    ),
    "card_number (candidates)": (
        "random 4-digit groups: a card-shaped number every 20 characters, 1 in 10 valid",
        _random(lambda r: " ".join(f"{r.randrange(4000, 7000)}" for _ in range(4)) + " "),
    ),
    "credential": ("`pwd=<distinct>\\n`", _random(lambda r: f"pwd={r.getrandbits(40):x}\n")),
    # Values each ended by a list separator on one long line: each value's end is found without
    # reading to the end of the line (the form a quadratic list rule would show).
    "credential (list)": (
        "`pwd=<distinct>, ` and `pwd=<distinct>,k=1 ` on one line",
        _random(lambda r: f"pwd={r.getrandbits(40):x}, pwd=x{r.getrandbits(40):x},k=1 "),
    ),
    "jwt": (
        "distinct JWTs",
        _random(lambda r: f"eyJ{r.getrandbits(64):x}.eyJ{r.getrandbits(64):x}.{r.getrandbits(64):x} "),
    ),
    "base64": ("base64 of distinct AKIA keys", _random(lambda r: _b64(f"AKIA{r.getrandbits(64):016X}".encode()) + " ")),
}


WRAPPER_KINDS = ("base64", "urlencoded")


def _redactor_for(kind: str, everything: bool, wrapper: bool = True) -> Redactor:
    """The default redactor, or one that runs ``kind`` alone (a detector, the registered secrets, a
    wrapper: with every detector, which its probe needs; ``wrapper=False``: those detectors only)."""
    kind = kind.split(" (")[0]
    if everything:
        policy = RedactionPolicy()
    elif kind == "registered secret":
        policy = RedactionPolicy(detectors=(), unwrap=())
    elif kind in WRAPPER_KINDS:
        policy = RedactionPolicy(unwrap=(kind,) if wrapper else ())
    else:
        policy = RedactionPolicy(detectors=tuple(d for d in DETECTORS if d.kind == kind), unwrap=())
    redactor = Redactor(os.urandom(32), policy)
    redactor.add_secret(KNOWN_SECRET, "secret:db")
    return redactor


# CPU time of this thread (``time.thread_time``): on a shared machine the wall clock mostly measures
# the other processes. Still, a busy machine slows the CPU work too (caches, a shared core), so each
# input is timed ``reps`` times, interleaved with two baselines over the same MiB: ``str.replace`` of
# a character it does not hold (one pass over the memory) and a regex that visits every character and
# matches none (what the detectors' engine costs a character). The median is the figure; the ratio to
# the regex pass, taken run by run, is what a noisy run changes least.
_RE_PASS = re.compile(r"[\x01\x02]")


def _cpu_ms(fn: Callable[[], object]) -> float:
    t = time.thread_time()
    fn()
    return (time.thread_time() - t) * 1000


def _scan_ms(kind: str, text: str, everything: bool, wrapper: bool = True) -> float:
    _detectors.card_ok.cache_clear()
    redactor = _redactor_for(kind, everything, wrapper)  # fresh: no warm token cache
    return _cpu_ms(lambda: redactor._scan(text))


def _measure(kind: str, text: str, reps: int) -> dict[str, Any]:
    alone, everything, replace, regex = [], [], [], []
    for _ in range(reps):
        ms = _scan_ms(kind, text, False)
        if kind in WRAPPER_KINDS:  # the wrapper's own cost: less the detectors' scan of the text itself
            ms = max(0.0, ms - _scan_ms(kind, text, False, wrapper=False))
        alone.append(ms)
        everything.append(_scan_ms(kind, text, True))
        replace.append(_cpu_ms(lambda: text.replace("\x01", "")))
        regex.append(_cpu_ms(lambda: _RE_PASS.search(text)))
    return {
        "detector_ms": statistics.median(alone),
        "detector_best_ms": min(alone),
        "all_ms": statistics.median(everything),
        "baseline_ms": statistics.median(replace),
        "regex_ms": statistics.median(regex),
        "detector_per_regex": statistics.median([a / max(r, 1e-6) for a, r in zip(alone, regex, strict=True)]),
    }


def adversarial_costs(size: int = MIB, reps: int = 5) -> dict[str, list[dict[str, Any]]]:
    """ms of CPU to redact ``size`` characters of each adversarial input: the detector alone, the
    default redactor, and the baselines (medians of ``reps`` interleaved runs, each from a fresh
    redactor)."""
    rows = []
    for kind, inputs in ADVERSARIAL.items():
        for name, build in inputs:
            rows.append({"detector": kind, "input": name, **_measure(kind, build(size), reps)})
    dense = []
    for kind, (name, build) in DENSE.items():
        text = build(size)
        redactor = _redactor_for(kind, True)
        t = time.thread_time()
        out = redactor._scan(text)
        ms = (time.thread_time() - t) * 1000
        tokens = out.count("«redacted:")
        dense.append(
            {"detector": kind, "input": name, "all_ms": ms, "tokens": tokens, "us_per_token": ms * 1000 / tokens}
        )
    return {"adversarial": rows, "dense": dense}


def adversarial_section_parts(result: dict[str, list[dict[str, Any]]], size: int) -> tuple[list[Table], Goal, str]:
    rows = result["adversarial"]
    table = Table(
        f"adversarial input, {size // 1024} KiB each: ms of CPU, median of runs (a wrapper alone: the default "
        "detectors with it, less without it), against one regex pass over the same text",
        ["detector", "input", "detector alone", "best", "default redactor", "regex pass", "detector / regex pass"],
        [
            [r["detector"], r["input"], num(r["detector_ms"]), num(r["detector_best_ms"]), num(r["all_ms"]),
             num(r["regex_ms"]), f"{r['detector_per_regex']:.1f}x"]
            for r in rows
        ],
    )  # fmt: skip
    dense = Table(
        f"dense input, {size // 1024} KiB each: every candidate a distinct real secret (default redactor)",
        ["detector", "input", "ms of CPU", "tokens", "µs per token"],
        [
            [r["detector"], r["input"], num(r["all_ms"]), f"{r['tokens']:,}", num(r["us_per_token"])]
            for r in result["dense"]
        ],
    )
    worst = max(rows, key=lambda r: r["detector_ms"])
    per_mib = worst["detector_ms"] * MIB / size
    goal = Goal(
        f"every redaction detector: 1 MiB of adversarial input in under {ADVERSARIAL_GOAL_MS:.0f} ms",
        per_mib < ADVERSARIAL_GOAL_MS,
        f"worst: {worst['detector']} on {worst['input']}, {per_mib:.1f} ms per MiB (median; "
        f"{worst['detector_per_regex']:.1f}x a regex pass over the same text)",
    )
    worst_all = max(rows, key=lambda r: r["all_ms"])
    note = (
        f"Adversarial input: the slowest detector took {per_mib:.1f} ms per MiB, median of runs "
        f"({worst['detector']}, {worst['input']}; {worst['detector_per_regex']:.1f}x one regex pass over it); "
        f"the whole default redactor at most {worst_all['all_ms'] * MIB / size:.1f} ms per MiB "
        f"({worst_all['detector']}, {worst_all['input']})."
    )
    return [table, dense], goal, note


def run_suite(opts: SuiteOptions) -> Section:
    n, mb, steps, rounds = (50, 1, 20, 2) if opts.quick else (2000, 20, 1000, 5)
    transform = asyncio.run(transform_costs(n))
    redaction_ms_per_mb = large_document_cost(mb)
    steps_out = asyncio.run(step_costs(steps, rounds))
    adversarial_size = MIB // 4 if opts.quick else MIB
    adversarial = adversarial_costs(adversarial_size, 1 if opts.quick else 5)
    section = Section(
        part="protect",
        title="what content protection costs",
        data={"transform_us": transform, "redaction_ms_per_mb": redaction_ms_per_mb, **steps_out, **adversarial},
    )
    section.workload = (
        f"(1) `PayloadProtector.protect` of a typical tool step (about 1 KB of arguments and output holding one "
        f"API key), {n} times per data policy. (2) Redacting a {mb} MB text document. (3) Runs of "
        f"{steps_out['steps_per_run']} tool steps (the same ~1 KB step) on an embedded nats-server that fsyncs "
        f"before every ack, one run per policy in each of {rounds} rounds (the policies take turns), timed per "
        "recorded step (a run's time divided by its steps, run start and end included). (4) "
        f"{adversarial_size // 1024} KiB of each adversarial input (`bench/protect.py`, ADVERSARIAL: near misses built "
        "for each detector), redacted by that detector alone and by the default redactor, CPU time, median of "
        "interleaved runs, against one regex pass over the same text; and as much dense input, every candidate a "
        "distinct real secret."
    )
    base_label = next(iter(POLICIES))
    per_step = steps_out["ms_per_step"]
    rows = []
    for label in POLICIES:
        t = transform[label]
        step = summary(per_step[label])
        extra = [a - b for a, b in zip(per_step[label], per_step[base_label], strict=True)]
        ratio = ratio_stats(list(zip(per_step[label], per_step[base_label], strict=True)))
        rows.append([label, num(t["p50"]), num(t["p99"]), num(step["p50"]), num(step["min"]), num(step["max"]),
                     f"{statistics.median(extra):+.3f}", ratio_cell(ratio)])  # fmt: skip
    section.tables.append(Table(
        "per policy", ["policy", "protect() p50 µs", "p99 µs", "ms per recorded step p50", "min", "max",
                       "extra ms a step (paired)", "/ no protection"], rows))  # fmt: skip
    section.notes.append(f"Redaction of a large document: {redaction_ms_per_mb:.0f} ms per MB.")
    tables, goal, note = adversarial_section_parts(adversarial, adversarial_size)
    if opts.quick:
        goal.met = None  # a smoke run: a quarter MiB, one run each
    section.tables.extend(tables)
    section.goals.append(goal)
    section.notes.append(note)
    from bench.plots import bars

    labels = list(POLICIES)
    section.plots.append(
        bars(
            opts.plot_dir / "protect.png",
            "ms per recorded tool step, by data policy (min-max over rounds)",
            [x.split(" (")[0].replace(", ", ",\n") for x in labels],
            {"ms per step": [summary(per_step[x])["p50"] for x in labels]},
            ylabel="ms",
            errors={"ms per step": [(min(per_step[x]), max(per_step[x])) for x in labels]},
        )
    )
    return section


def print_adversarial(size: int = MIB, reps: int = 5) -> None:
    result = adversarial_costs(size, reps)
    tables, goal, note = adversarial_section_parts(result, size)
    for t in tables:
        print(t.title)
        print(table([t.columns, *t.rows]))
        print()
    print(("met: " if goal.met else "MISSED: ") + f"{goal.text}. {goal.detail}")
    print(note)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--adversarial-only", action="store_true", help="only part 3, 1 MiB per input")
    args = parser.parse_args()
    if args.adversarial_only:
        print_adversarial()
        return
    rows = [["policy", "protect() p50 µs", "p99 µs"]]
    for label, s in (await transform_costs()).items():
        rows.append([label, f"{s['p50']:.0f}", f"{s['p99']:.0f}"])
    print(table(rows))
    print()
    print(f"redaction of a 20 MB document: {large_document_cost():.0f} ms per MB")
    print()
    out = await step_costs(args.steps)
    base = statistics.median(next(iter(out["ms_per_step"].values())))
    rows = [["policy", "ms per recorded step", "vs no protection"]]
    for label, values in out["ms_per_step"].items():
        rows.append([label, f"{statistics.median(values):.2f}", f"{statistics.median(values) - base:+.2f} ms"])
    print(table(rows))
    print()
    print_adversarial()


if __name__ == "__main__":
    asyncio.run(main())
