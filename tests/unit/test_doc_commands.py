"""Every ``runledger ...`` command line in README.md and docs/*.md parses with the real parser
(``runledger.cli.app.build_parser``), so a renamed or removed command or option fails here, not in
a reader's shell. Nothing runs: argparse only, no server.

What is extracted, and how the docs' notation is read:

- In fenced code blocks, every line whose first word is ``runledger`` (after an optional ``$ `` prompt
  and ``NAME=value`` environment assignments), joined with its ``\\`` continuation lines (and with the
  next lines while a quoted argument is open). Shell syntax
  ends the command: a ``#`` comment, a pipe or redirection (``| head``, ``>/dev/null``), ``&&``, ``;``.
  These lines must parse whole: ``parse_args`` may not exit. Placeholders (``RUN``, ``KEY``,
  ``MODULE:ATTR``, ``"$RUN"``, ``...`` as a value) are ordinary words and parse as such.
- ``[...]`` marks what is optional: a line is parsed without every bracketed part and with every one.
- ``a|b`` (``--committed|--not-committed``; ``\\|`` inside a table) is a choice: parsed once per choice.
- Inline code spans that start with ``runledger `` name a command in prose (``runledger effects
  resolve``, ``runledger rerun --where``) and are often partial: their sub-command path must exist and
  every ``--option`` they name must be one of that command's options.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from runledger.cli.app import build_parser

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^\s*(```|~~~)")
COMMAND = re.compile(r"^(?:\$ )?(?:[A-Z_][A-Z0-9_]*=\S+ )*(runledger\b.*)$")
INLINE = re.compile(r"`(runledger [^`]+)`")
SHELL_END = ("|", "||", "&&", ";", "&")


@dataclass(frozen=True)
class DocCommand:
    where: str  # file:line
    text: str
    inline: bool


def extract(path: Path) -> list[DocCommand]:
    """The command lines of one Markdown file (see the module docstring)."""
    found: list[DocCommand] = []
    fenced, pending, start = False, "", 0
    rel = path.relative_to(ROOT)
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            fenced, pending = not fenced, ""
            continue
        if not fenced:
            found += [DocCommand(f"{rel}:{n}", m.group(1), True) for m in INLINE.finditer(line)]
            continue
        stripped = line.strip()
        if not pending:
            m = COMMAND.match(stripped)
            if m is None:
                continue
            stripped, start = m.group(1), n
        pending = f"{pending} {stripped}".strip()
        if pending.endswith("\\"):
            pending = pending[:-1]
            continue
        if not _closed(pending):  # a quoted argument that goes on over the next line (a long SQL query)
            continue
        found.append(DocCommand(f"{rel}:{start}", pending, False))
        pending = ""
    return found


def _closed(text: str) -> bool:
    try:
        shlex.split(text, comments=True)
    except ValueError:
        return False
    return True


def words(text: str) -> list[str]:
    """The words after ``runledger``, up to the first bit of shell syntax, comments dropped. A ``|``
    inside a word is the docs' choice notation (``a|b``), a ``|`` word on its own a pipe."""
    out: list[str] = []
    for word in shlex.split(text.replace("\\|", "|"), comments=True):
        if word in SHELL_END or word.startswith((">", "2>")):
            break
        out.append(word)
    assert out[:1] == ["runledger"], text
    return out[1:]


def variants(argv: list[str]) -> list[list[str]]:
    """``argv`` without its ``[optional]`` parts and with them, once per ``a|b`` choice."""
    shortest: list[str] = []
    longest: list[str] = []
    depth = 0
    for word in argv:
        opens, closes = word.startswith("["), word.endswith("]")
        bare = word[1 if opens else 0 : len(word) - (1 if closes else 0)]
        depth += opens
        if bare:
            longest.append(bare)
            if not depth:
                shortest.append(bare)
        depth -= closes
    out = []
    for base in (shortest, longest):
        choices = max([w.count("|") + 1 for w in base] or [1])
        for i in range(choices):
            out.append([w.split("|")[min(i, w.count("|"))] if _is_choice(w) else w for w in base])
    return out


def _is_choice(word: str) -> bool:
    return bool(re.fullmatch(r"-{0,2}[\w.-]+(\|-{0,2}[\w.-]+)+", word))


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def parse_error(parser: argparse.ArgumentParser, argv: list[str]) -> str | None:
    """argparse's message when ``argv`` does not parse, else None."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(argv)
    except SystemExit as exc:
        return err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else f"exit {exc.code}"
    return None


def reference_error(parser: argparse.ArgumentParser, argv: list[str]) -> str | None:
    """For an inline mention: its sub-command path exists and names only options of that command."""
    node, path = parser, ["runledger"]
    rest = [w for w in argv if w not in ("-v", "-vv")] or (["-v"] if argv else [])
    while rest and _subcommands(node) and not rest[0].startswith("-"):
        name = rest.pop(0)
        subs = _subcommands(node)
        if name not in subs:
            return f"{' '.join(path)} has no command {name!r} (it has {', '.join(subs)})"
        node, path = subs[name], [*path, name]
    if node is parser and not rest:
        return "no command named"
    options = {o for action in node._actions for o in action.option_strings}  # the program's own: -v
    for word in rest:
        option = word.strip("[]").split("=")[0]
        for alternative in option.split("|"):
            if alternative.startswith("--") and alternative not in options:
                return f"{' '.join(path)} has no option {alternative}"
    return None


COMMANDS = [c for path in DOCS for c in extract(path)]


@pytest.fixture(scope="module")
def parser() -> argparse.ArgumentParser:
    built = build_parser()
    missing = [name for name, sub in _subcommands(built).items() if sub.prefix_chars != "-"]
    assert not missing, f"commands whose extra is not installed (they would parse anything): {missing}"
    return built


def test_the_docs_hold_command_lines_of_both_kinds() -> None:
    assert sum(not c.inline for c in COMMANDS) > 60 and sum(c.inline for c in COMMANDS) > 100


@pytest.mark.parametrize("command", [c for c in COMMANDS if not c.inline], ids=lambda c: c.where)
def test_a_command_line_of_a_code_block_parses(parser: argparse.ArgumentParser, command: DocCommand) -> None:
    for argv in variants(words(command.text)):
        error = parse_error(parser, argv)
        assert error is None, f"{command.where}: `runledger {' '.join(argv)}` does not parse: {error}"


@pytest.mark.parametrize("command", [c for c in COMMANDS if c.inline], ids=lambda c: c.where)
def test_a_command_named_in_prose_exists(parser: argparse.ArgumentParser, command: DocCommand) -> None:
    error = reference_error(parser, words(command.text))
    assert error is None, f"{command.where}: `{command.text}`: {error}"


def test_the_extractor_reads_the_notation() -> None:
    assert words("runledger show RUN --step 3   # one step") == ["show", "RUN", "--step", "3"]
    assert words("runledger runs --json | head") == ["runs", "--json"]
    assert words('runledger sql "a | b # c" >/dev/null') == ["sql", "a | b # c"]
    assert variants(["approve", "RUN", "R", "--by", "a", "[--deny]", "[--reason", "...]"]) == [
        ["approve", "RUN", "R", "--by", "a"],
        ["approve", "RUN", "R", "--by", "a", "--deny", "--reason", "..."],
    ]
    assert variants(["effects", "resolve", "KEY", "--committed|--not-committed"]) == [
        ["effects", "resolve", "KEY", "--committed"],
        ["effects", "resolve", "KEY", "--not-committed"],
        ["effects", "resolve", "KEY", "--committed"],
        ["effects", "resolve", "KEY", "--not-committed"],
    ]


def test_a_renamed_command_or_option_is_caught(parser: argparse.ArgumentParser) -> None:
    assert "invalid choice: 'resolve'" in (parse_error(parser, ["resolve", "KEY", "--committed", "--by", "a"]) or "")
    assert reference_error(parser, ["resolve"]) is not None
    assert (
        reference_error(parser, ["effects", "resolve", "--comitted"])
        == "runledger effects resolve has no option --comitted"
    )
    assert reference_error(parser, ["effects", "resolve", "--committed"]) is None
