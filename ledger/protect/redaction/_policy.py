"""What a run redacts (``RedactionPolicy``): field paths, detectors, credential-named keys, wrappers.

Field paths (``FieldPaths``) are dotted, with ``*`` for one segment and ``**`` for any number; dict
keys are compared in one form (lower case, no ``-_. ``: ``X-Api-Key`` is ``xapikey``) against fnmatch
patterns compiled once per policy, not once per run.
"""

from __future__ import annotations

import fnmatch
import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from runledger.errors import ConfigurationError
from runledger.protect.redaction._detectors import DETECTORS, NON_SENSITIVE_KEYS, SENSITIVE_KEYS, Detector


@functools.lru_cache(maxsize=4096)  # the same few keys (role, content, args...) at every step
def normalize_key(key: str) -> str:
    return key.lower().replace("-", "").replace("_", "")


def key_form(key: str) -> str:
    return key.lower().replace("-", "").replace("_", "").replace(".", "").replace(" ", "")


def key_pattern(patterns: Iterable[str]) -> re.Pattern[str]:
    return _key_pattern_of(frozenset(patterns))


@functools.lru_cache(maxsize=64)  # per policy, not per run (as _alternation_of)
def _key_pattern_of(patterns: frozenset[str]) -> re.Pattern[str]:
    alternatives = sorted({fnmatch.translate(key_form(p)) for p in patterns if p})
    return re.compile("|".join(alternatives)) if alternatives else re.compile(r"(?!)")


class FieldPaths:
    """Dotted field paths with wildcards: ``*`` one segment (a key or a list index), ``**`` any number.

    Segments may use fnmatch patterns (``*_email``). Paths are matched against the path of
    a value from the root it is handed (an event payload: ``args.card``, ``request.messages.3.content``).
    """

    def __init__(self, paths: Iterable[str] = ()) -> None:
        self.paths = tuple(tuple(p.split(".")) for p in paths if p)
        for p in self.paths:
            if any(seg == "" for seg in p):
                raise ConfigurationError(f"field path {'.'.join(p)!r} has an empty segment")

    def __bool__(self) -> bool:
        return bool(self.paths)

    def match(self, path: tuple[str, ...]) -> bool:
        return any(_match(p, path) for p in self.paths)


def _match(pattern: tuple[str, ...], path: tuple[str, ...]) -> bool:
    if not pattern:
        return not path
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        return any(_match(rest, path[i:]) for i in range(len(path) + 1))
    return bool(path) and fnmatch.fnmatchcase(path[0], head) and _match(rest, path[1:])


WRAPPERS = ("base64", "urlencoded")  # the encodings redaction looks inside, in this order


@dataclass(frozen=True)
class RedactionPolicy:
    """What to redact: field paths, detectors, credential-named keys, and which wrappers to open."""

    fields: tuple[str, ...] = ()
    detectors: tuple[Detector, ...] = DETECTORS
    extra_detectors: tuple[Detector, ...] = ()
    sensitive_keys: frozenset[str] = SENSITIVE_KEYS
    non_sensitive_keys: frozenset[str] = NON_SENSITIVE_KEYS
    unwrap: tuple[str, ...] = WRAPPERS

    def __post_init__(self) -> None:
        unknown = [w for w in self.unwrap if w not in WRAPPERS]
        if unknown:
            raise ConfigurationError(f"unknown wrapper(s) {unknown}: use some of {list(WRAPPERS)}")


@dataclass
class RedactionStats:
    strings_scanned: int = 0
    replaced: dict[str, int] = field(default_factory=dict)
