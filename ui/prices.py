"""The price table, as the page imports it: it lives in ``runledger.ops.prices`` (the sandbox's sweep
prices its branches with it too, and the sandbox sits below the page)."""

from runledger.ops.prices import Price, PriceTable, usage

__all__ = ["Price", "PriceTable", "usage"]
