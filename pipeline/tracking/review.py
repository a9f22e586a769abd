"""What a person reviewing a run in MLflow reads: the per-epoch evaluation table, the plots
(loss, STS per epoch, alignment-uniformity trajectory) and the run description.

Everything here works from plain data (the train loop's ``eval_history`` and the loss
history), so it can be rebuilt for any finished run.
"""

from __future__ import annotations

import math
from pathlib import Path

from pipeline.tracking.plots import pyplot
from pipeline.tracking.run import TrackedRun


def eval_table_markdown(history: list[dict[str, float]], best_epoch: float | None = None) -> str:
    """A markdown table: one row per evaluation, one column per STS metric and per retrieval
    set's nDCG@10, MRR@10 and Recall@10."""
    if not history:
        return ""
    metric_keys = [
        k for k in history[0] if k.startswith("sts_") and not k.endswith(("_alignment", "_uniformity"))
    ] + [
        k
        for k in history[0]
        if k.startswith("retrieval_") and k.endswith(("_ndcg_at_10", "_mrr_at_10", "_recall_at_10"))
    ]
    diag_keys = [k for k in history[0] if k.endswith(("_alignment", "_uniformity"))]
    columns = ["epoch", "step", *metric_keys, *diag_keys]
    lines = [
        "| " + " | ".join(c.removeprefix("sts_") for c in columns) + " |",
        "|" + "---|" * len(columns),
    ]
    for row in history:
        cells = []
        for c in columns:
            value = row.get(c, float("nan"))
            if c == "epoch":
                mark = " (best)" if best_epoch is not None and value == best_epoch else ""
                cells.append(f"{value:g}{mark}")
            elif c == "step":
                cells.append(f"{int(value)}")
            else:
                cells.append(
                    "" if math.isnan(value) else f"{value:.3f}" if c in diag_keys else f"{value:.2f}"
                )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_sts_per_epoch(history: list[dict[str, float]], path: str | Path) -> None:
    """Spearman of every STS file against the epoch."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    epochs = [h["epoch"] for h in history]
    for key in [k for k in history[0] if k.endswith("_spearman")]:
        ax.plot(
            epochs, [h.get(key, float("nan")) for h in history], marker="o", label=key.removeprefix("sts_")
        )
    ax.set_xlabel("epoch (0 = starting model)")
    ax.set_ylabel("Spearman x 100")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_alignment_uniformity(history: list[dict[str, float]], path: str | Path) -> None:
    """The SimCSE analysis plot: uniformity (x) against alignment (y), one point per
    evaluation, joined in order. Down and left is better."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 4))
    names = [
        k.removeprefix("sts_").removesuffix("_alignment") for k in history[0] if k.endswith("_alignment")
    ]
    for name in names:
        xs = [h.get(f"sts_{name}_uniformity", float("nan")) for h in history]
        ys = [h.get(f"sts_{name}_alignment", float("nan")) for h in history]
        ax.plot(xs, ys, marker="o", label=name)
        for h, x, y in zip(history, xs, ys, strict=True):
            ax.annotate(f"{h['epoch']:g}", (x, y), fontsize=7, textcoords="offset points", xytext=(3, 3))
    ax.set_xlabel("uniformity (lower is better)")
    ax.set_ylabel("alignment (lower is better)")
    ax.set_title("alignment-uniformity by epoch", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_loss(
    steps: list[int], losses: list[float], path: str | Path, epoch_ends: list[int] | None = None
) -> None:
    """Training loss per step (log scale), with a moving average and the epoch boundaries."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(steps, losses, alpha=0.35, label="train_loss")
    window = max(1, len(losses) // 20)
    if window > 1:
        smooth = [
            sum(losses[max(0, i - window + 1) : i + 1]) / (i + 1 - max(0, i - window + 1))
            for i in range(len(losses))
        ]
        ax.plot(steps, smooth, label=f"moving mean ({window} steps)")
    for end in epoch_ends or []:
        ax.axvline(end, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("step")
    ax.set_ylabel("InfoNCE loss")
    if losses and min(losses) > 0:  # a log scale: the first steps' drop would flatten the rest
        ax.set_yscale("log")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def log_review(
    tracked: TrackedRun,
    history: list[dict[str, float]],
    exported_epoch: float | None,
    epoch_losses: list[float],
    run_dir: Path,
) -> None:
    """Write the review files under ``run_dir/review`` and log them to the run's ``review/``
    artifacts: ``eval_by_epoch.md``, ``sts_by_epoch.png``, ``alignment_uniformity.png``, ``loss.png``."""
    out = run_dir / "review"
    out.mkdir(parents=True, exist_ok=True)
    loss_history = tracked.client.get_metric_history(tracked.run_id, "train/loss")
    if loss_history:
        points = sorted((m.step, m.value) for m in loss_history)
        ends = sorted(
            {int(m.step) for m in tracked.client.get_metric_history(tracked.run_id, "train/epoch_loss")}
        )
        plot_loss([p[0] for p in points], [p[1] for p in points], out / "loss.png", ends)
    if history and any(k.startswith("sts_") for k in history[0]):  # retrieval only: no STS plots
        plot_sts_per_epoch(history, out / "sts_by_epoch.png")
        plot_alignment_uniformity(history, out / "alignment_uniformity.png")
    if history:
        table = eval_table_markdown(history, exported_epoch)
        losses = ", ".join(f"epoch {i + 1}: {loss:.4f}" for i, loss in enumerate(epoch_losses))
        (out / "eval_by_epoch.md").write_text(
            "# Evaluation by epoch\n\nSpearman x 100 of cosine similarity (STS files), nDCG@10, MRR@10 and "
            "Recall@10 x 100 (retrieval sets); epoch 0 is the starting model; "
            "fractional epochs are `eval.every_steps` evaluations. The exported model is marked (best).\n\n"
            f"{table}\n\nMean training loss: {losses}\n"
        )
    tracked.log_artifacts(out, "review")
