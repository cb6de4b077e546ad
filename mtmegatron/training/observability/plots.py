"""The loss curve of a run as a PNG, drawn from its metrics.jsonl (so a resumed run plots its whole history).

May assume: matplotlib is installed (a dependency); the Agg backend needs no display.
"""

from __future__ import annotations

import json
import math


def plot_loss(metrics_path: str, png_path: str, title: str = "") -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = {}
    with open(metrics_path) as f:
        for line in f:
            row = json.loads(line)
            rows[row["iteration"]] = row  # a resumed run re-logs nothing twice, but keep the last if so
    iterations = sorted(rows)
    train = [(it, rows[it]["loss"]) for it in iterations if math.isfinite(rows[it]["loss"])]
    valid = [(it, rows[it]["val_loss"]) for it in iterations if rows[it].get("val_loss") is not None]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    if train:
        ax.plot(*zip(*train), label="train loss", linewidth=1)
    if valid:
        ax.plot(*zip(*valid), "o-", label="validation loss")
    ax.set_xlabel("iteration")
    ax.set_ylabel("LM loss (nats/token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png_path)
    plt.close(fig)
    return png_path
