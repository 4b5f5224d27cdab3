"""Images for the Dagster UI: rendered with matplotlib and embedded as Markdown."""

from __future__ import annotations

import base64
import io

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")  # no display on servers
import matplotlib.pyplot as plt  # noqa: E402


def loss_curve_png(loss_history: list[list[float]], title: str) -> bytes:
    fig, ax = plt.subplots(figsize=(6, 3.2), dpi=100)
    steps = [p[0] for p in loss_history]
    ax.plot(steps, [p[1] for p in loss_history], color="#4F43DD", linewidth=1.5)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def confusion_matrix_png(matrix: list[list[int]], class_names: list[str], title: str) -> bytes:
    """Rows are the true class, columns the predicted one; each cell shows its count."""
    n = len(matrix)
    names = class_names if len(class_names) == n else [str(i) for i in range(n)]
    side = max(3.2, 0.45 * n + 1.6)
    fig, ax = plt.subplots(figsize=(side, side), dpi=100)
    ax.imshow(matrix, cmap="Blues")
    ax.set_xticks(range(n), names, rotation=45, ha="right")
    ax.set_yticks(range(n), names)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(title)
    peak = max((max(row) for row in matrix), default=0)
    for i, row in enumerate(matrix):
        for j, count in enumerate(row):
            ax.text(j, i, str(count), ha="center", va="center", fontsize=8,
                    color="white" if count > peak / 2 else "black")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def markdown_image(png: bytes, alt: str) -> str:
    return f"![{alt}](data:image/png;base64,{base64.b64encode(png).decode()})"


def sweep_png(trials: list[dict], objective: str, direction: str, title: str) -> bytes:
    """The objective of every trial by trial number: finished trials as dots, pruned ones as crosses
    at their last reported value, with the best so far as a step line."""
    fig, ax = plt.subplots(figsize=(6, 3.2), dpi=100)
    done = [t for t in trials if t["state"] == "complete" and t.get("value") is not None]
    ax.scatter([t["number"] for t in done], [t["value"] for t in done], color="#4F43DD", label="complete", zorder=3)
    pruned = [t for t in trials if t["state"] == "pruned" and t.get("last_value") is not None]
    if pruned:
        ax.scatter([t["number"] for t in pruned], [t["last_value"] for t in pruned], marker="x", color="#B0B0B0",
                   label="pruned", zorder=3)
    if done:
        best, line = None, []
        for t in sorted(done, key=lambda t: t["number"]):
            better = best is None or (t["value"] > best if direction == "maximize" else t["value"] < best)
            best = t["value"] if better else best
            line.append((t["number"], best))
        ax.step([p[0] for p in line], [p[1] for p in line], where="post", color="#DD4F43", label="best so far")
    ax.set_xlabel("trial")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))  # trials are whole numbers
    ax.set_ylabel(f"validation {objective}")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()
