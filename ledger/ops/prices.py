"""The price table: US dollars per million input and output tokens, per model.

The table lives in the projection file, in ``model_prices`` (the table analysts fill for the
``run_costs`` view; ``docs/tables.md``), so the run list's cost column, the cost of a run, a step
or a diff on the page, and a sweep's cost per branch come from one place. ``runledger ui --prices
FILE`` loads a JSON file into it at start; an operator can change a price on the page; ``runledger
rerun --where ... --prices FILE`` prices a sweep with a file instead.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runledger.errors import ConfigurationError
from runledger.record.fold import StepRecord


@dataclass(frozen=True)
class Price:
    input: float  # USD per 1,000,000 input tokens
    output: float  # USD per 1,000,000 output tokens

    def cost(self, input_tokens: int, output_tokens: int) -> float:
        return (input_tokens * self.input + output_tokens * self.output) / 1e6


@dataclass(frozen=True)
class PriceTable:
    prices: dict[str, Price] = field(default_factory=dict)

    @classmethod
    def from_rows(cls, rows: Iterable[tuple[Any, ...]]) -> PriceTable:
        return cls({str(m): Price(float(i), float(o)) for m, i, o in rows})

    @classmethod
    def from_file(cls, path: Path) -> PriceTable:
        """``{"model": {"input": 3.0, "output": 15.0}, "other": [0.5, 1.5], ...}`` (USD per 1M tokens).

        Raises ConfigurationError naming the file and the entry that is wrong."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise ConfigurationError(f"cannot read the price table {path}: {exc}") from exc
        if not isinstance(data, dict):
            raise ConfigurationError(f"{path}: expected an object of model -> price, got {type(data).__name__}")
        prices = {}
        for model, value in data.items():
            if isinstance(value, dict):
                pair = (value.get("input"), value.get("output"))
            elif isinstance(value, list) and len(value) == 2:
                pair = (value[0], value[1])
            else:
                pair = (None, None)
            if not all(isinstance(v, int | float) and not isinstance(v, bool) and v >= 0 for v in pair):
                raise ConfigurationError(
                    f'{path}: the price of {model!r} must be {{"input": USD, "output": USD}} per million tokens '
                    f"(non-negative numbers), got {value!r}"
                )
            prices[str(model)] = Price(float(pair[0]), float(pair[1]))  # type: ignore[arg-type]
        return cls(prices)

    def step_cost(self, step: StepRecord) -> float | None:
        """What a model step cost (None: not a model call, or its model has no price)."""
        if step.kind != "model":
            return None
        price = self.prices.get(step.name)
        if price is None:
            return None
        tokens_in, tokens_out = usage(step)
        return price.cost(tokens_in, tokens_out)

    def run_cost(self, steps: Iterable[StepRecord]) -> tuple[float, bool]:
        """(cost of the model steps, whether every model step had a price)."""
        total, priced = 0.0, True
        for step in steps:
            if step.kind != "model":
                continue
            cost = self.step_cost(step)
            if cost is None:
                priced = False
            else:
                total += cost
        return total, priced


def usage(step: StepRecord) -> tuple[int, int]:
    """(input tokens, output tokens) of a model step, from its recorded response's ``usage``."""
    output = step.output if isinstance(step.output, dict) else {}
    found = output.get("usage")
    used: dict[str, Any] = found if isinstance(found, dict) else {}
    tokens_in, tokens_out = used.get("input_tokens"), used.get("output_tokens")
    if isinstance(tokens_in, int) and isinstance(tokens_out, int):
        return tokens_in, tokens_out
    return step.tokens, 0  # sealed output: the total is structure, the split is not
