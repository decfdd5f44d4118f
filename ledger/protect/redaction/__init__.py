"""Redaction: secrets and configured fields replaced by stable tokens before anything is published.

The public names of the package; its modules are private (the design notes, and the ``Redactor``,
are in ``_redactor``; the catalogue of detectors in ``_detectors``; the scan of one text in
``_scan``; wrappers in ``_wrappers`` and ``_unwrap``; the token in ``_tokens``; ``RedactionPolicy``
in ``_policy``; ``SecretResolver`` in ``_secrets``; ``off_loop`` in ``_offload``).
"""

from runledger.protect.redaction._detectors import (
    DETECTORS,
    NON_SENSITIVE_KEYS,
    SENSITIVE_KEYS,
    Detector,
    Extent,
    luhn_ok,
)
from runledger.protect.redaction._offload import OFFLOAD_MIN_CHARS, off_loop, text_size
from runledger.protect.redaction._policy import WRAPPERS, FieldPaths, RedactionPolicy, RedactionStats
from runledger.protect.redaction._redactor import (
    CACHE_MAX_CHARS,
    CACHE_MAX_ENTRIES,
    CACHE_MAX_TEXT,
    CACHE_MIN_CHARS,
    PLAIN_MAX_ENTRIES,
    Redactor,
)
from runledger.protect.redaction._scan import GATE_MAX_CHARS, WINDOW_CHARS, WRAPPER_DEPTH
from runledger.protect.redaction._secrets import SecretResolver
from runledger.protect.redaction._tokens import (
    SECRET_SCHEME,
    TOKEN_CLOSE,
    TOKEN_OPEN,
    contains_token,
    is_token,
    without_token_keys,
)

__all__ = [
    "CACHE_MAX_CHARS",
    "CACHE_MAX_ENTRIES",
    "CACHE_MAX_TEXT",
    "CACHE_MIN_CHARS",
    "DETECTORS",
    "GATE_MAX_CHARS",
    "NON_SENSITIVE_KEYS",
    "OFFLOAD_MIN_CHARS",
    "PLAIN_MAX_ENTRIES",
    "SECRET_SCHEME",
    "SENSITIVE_KEYS",
    "TOKEN_CLOSE",
    "TOKEN_OPEN",
    "WINDOW_CHARS",
    "WRAPPERS",
    "WRAPPER_DEPTH",
    "Detector",
    "Extent",
    "FieldPaths",
    "RedactionPolicy",
    "RedactionStats",
    "Redactor",
    "SecretResolver",
    "contains_token",
    "is_token",
    "luhn_ok",
    "off_loop",
    "text_size",
    "without_token_keys",
]
