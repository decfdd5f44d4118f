"""The public surface of ``projections``: small, explicit, sorted."""

from __future__ import annotations

import runledger.projections as projections


def test_all_is_sorted_and_importable() -> None:
    assert projections.__all__ == sorted(projections.__all__)
    for name in projections.__all__:
        assert getattr(projections, name) is not None


def test_every_error_is_a_projection_error_and_a_ledger_error() -> None:
    from runledger.errors import LedgerError

    for name in projections.__all__:
        obj = getattr(projections, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, projections.ProjectionError) and issubclass(obj, LedgerError)
