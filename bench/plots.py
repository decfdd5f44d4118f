"""The report's plots: PNG files drawn with matplotlib's Agg backend (no display needed).

matplotlib is in the ``bench`` extra; it is imported here only, when a plot is drawn.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def latency_cdf(path: Path, title: str, series: Mapping[str, Sequence[float]], *, xlabel: str = "ms") -> Path:
    """One cumulative-distribution line per series, log x axis: medians and tails at a glance."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, values in series.items():
        ordered = sorted(values)
        if not ordered:
            continue
        n = len(ordered)
        ax.plot(ordered, [(i + 1) / n for i in range(n)], label=f"{label} (n={n})")
    ax.set_xscale("log")
    ax.set_xlabel(f"{xlabel} (log scale)")
    ax.set_ylabel("fraction of samples at or below")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, plt, path)


def bars(
    path: Path,
    title: str,
    groups: Sequence[str],
    series: Mapping[str, Sequence[float]],
    *,
    ylabel: str,
    log: bool = False,
    errors: Mapping[str, Sequence[tuple[float, float]]] | None = None,
) -> Path:
    """Grouped bars: one group per ``groups`` entry, one bar per series; ``errors`` gives (min, max) whiskers."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / max(1, len(series))
    for i, (label, values) in enumerate(series.items()):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        yerr = None
        if errors and label in errors:
            lo = [max(0.0, v - e[0]) for v, e in zip(values, errors[label], strict=True)]
            hi = [max(0.0, e[1] - v) for v, e in zip(values, errors[label], strict=True)]
            yerr = [lo, hi]
        ax.bar(xs, values, width=width, label=label, yerr=yerr, capsize=3)
    ax.set_xticks(range(len(groups)), list(groups))
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    ax.set_title(title)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, plt, path)


def _save(fig: Any, plt: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
