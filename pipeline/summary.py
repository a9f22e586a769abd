"""The training job's console summary (also the MLflow run's description)."""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.tracking.run import (
    ui_command,
)


@dataclass
class JobSummary:
    run_name: str
    run_id: str
    tracking_uri: str
    experiment: str
    model_dir: str | None = None
    epochs: int = 0
    steps: int = 0
    epoch_losses: list[float] = field(default_factory=list)
    plan_versions: list[int] = field(default_factory=list)
    wait_seconds: list[float] = field(default_factory=list)
    refresh_seconds: list[float] = field(default_factory=list)
    corpus: str = ""
    wall_seconds: float = 0.0
    already_finished: bool = False
    eval_history: list[dict[str, float]] = field(default_factory=list)
    exported_epoch: float | None = None
    """The evaluation the exported model comes from (fractional inside an epoch)."""
    exported_step: int | None = None
    miner_restarts: int = 0
    model_uri: str | None = None
    registered_as: str | None = None
    """``name/version`` in the model registry."""

    def sts_line(self) -> str | None:
        """``first file: start -> exported (epoch N)``, from the evaluation history."""
        if not self.eval_history or self.exported_step is None:
            return None
        first = self.eval_history[0]
        key = next(k for k in first if k.startswith("sts_") and k.endswith("_spearman"))
        start = first if first["epoch"] == 0 else None
        shipped = next((h for h in self.eval_history if h["step"] == self.exported_step), None)
        if shipped is None:
            return None
        before = f"{start[key]:.2f} -> " if start is not None else ""
        text = f"{key.removeprefix('sts_').removesuffix('_spearman')} spearman {before}{shipped[key]:.2f}"
        whitened = key + "_whitened"
        if whitened in shipped:
            w_before = f"{start[whitened]:.2f} -> " if start is not None and whitened in start else ""
            text += f" (whitened {w_before}{shipped[whitened]:.2f})"
        candidates = len(self.eval_history) - (start is not None)
        return (
            f"{text}; exported epoch {self.exported_epoch:g} (step {self.exported_step}, best of "
            f"{candidates} evaluation{'s' if candidates != 1 else ''} after training; the starting "
            f"model's is the 'before', never exported)"
        )

    def render(self) -> str:
        if self.already_finished:
            return (
                f"run {self.run_name!r} already finished (MLflow run {self.run_id}); nothing to do.\n"
                f"  review with   {ui_command(self.tracking_uri)}"
            )
        refreshes = [s for s in self.refresh_seconds if s > 0]  # 0 where no new plan was adopted
        plans = ", ".join(f"v{v}" + (" (random)" if v == 0 else " (mined)") for v in self.plan_versions)
        loss = (
            f"{self.epoch_losses[0]:.4f} -> {self.epoch_losses[-1]:.4f} (epoch means)"
            if self.epoch_losses
            else "n/a"
        )
        restarts = f"; the miner actor was restarted {self.miner_restarts}x" if self.miner_restarts else ""
        lines = [
            f"SimCSE run {self.run_name!r} finished in {self.wall_seconds:.0f}s",
            f"  epochs        {self.epochs} ({self.steps} steps)",
            f"  loss          {loss}",
            f"  batch plans   {plans}",
            f"  mining        {len(refreshes)} refresh{'es' if len(refreshes) != 1 else ''}, {sum(refreshes):.1f}s of "
            f"miner time; training waited {sum(self.wait_seconds):.1f}s{restarts}",
            f"  corpus        {self.corpus}",
        ]
        sts = self.sts_line()
        if sts:
            lines.append(f"  eval          {sts}")
        lines += [
            f"  model         {self.model_dir}",
            f"  mlflow run    {self.run_id} (experiment {self.experiment!r})",
            *([f"  mlflow model  {self.model_uri}"] if self.model_uri else []),
            *([f"  registered    {self.registered_as}"] if self.registered_as else []),
            f"  review with   {ui_command(self.tracking_uri)}",
        ]
        return "\n".join(lines)
