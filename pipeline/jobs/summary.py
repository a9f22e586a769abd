"""The training job's console summary (also the MLflow run's description)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pipeline.tracking.run import run_description, ui_command
from pipeline.training.state import BestModel, TrainHistory


@dataclass(frozen=True)
class JobSummary:
    """What the job did: the run, its training data, the workers' :class:`TrainHistory` and the
    exported model. Built after training by :meth:`from_training` (a new history field only
    needs adding to :meth:`render` to be shown); a run found already finished has only the
    first four fields."""

    run_name: str
    run_id: str
    tracking_uri: str
    experiment: str
    already_finished: bool = False
    corpus: str = ""
    """The training data, in one line."""
    history: TrainHistory = field(default_factory=TrainHistory)
    """The history in the workers' last report."""
    steps: int = 0
    """Optimizer steps done (the last report's position)."""
    exported_epoch: float | None = None
    """The evaluation the exported model comes from (fractional inside an epoch)."""
    exported_step: int | None = None
    model_dir: str | None = None
    """The exported model folder."""
    model_uri: str | None = None
    registered_as: str | None = None
    """``name/version`` in the model registry."""
    wall_seconds: float = 0.0
    base_model: str = ""
    """What was fine-tuned: the model's hub name or folder name, never a local path."""
    data_name: str = ""
    """What it was trained on: the data file's name (``train.tsv``), never its folder."""
    eval_note: str = ""
    """What the reported evaluation measures, where the run knows it is not a quality measure
    (the demo's generated STS set)."""

    @classmethod
    def from_training(
        cls,
        run_name: str,
        run_id: str,
        tracking_uri: str,
        experiment: str,
        *,
        corpus: str,
        history: TrainHistory,
        steps: int,
        best: BestModel | None,
        model_dir: Path,
        base_model: str = "",
        data_name: str = "",
        eval_note: str = "",
    ) -> JobSummary:
        """The summary of a trained run whose model was exported from ``best`` (None without
        evaluation: the last epoch's model, at the last step)."""
        return cls(
            run_name,
            run_id,
            tracking_uri,
            experiment,
            corpus=corpus,
            history=history,
            steps=steps,
            exported_epoch=best.epoch if best is not None else float(len(history.epoch_losses)),
            exported_step=best.step if best is not None else steps,
            model_dir=str(model_dir),
            base_model=base_model,
            data_name=data_name,
            eval_note=eval_note,
        )

    @property
    def epochs(self) -> int:
        """Epochs completed."""
        return len(self.history.epoch_losses)

    def scores(self) -> str | None:
        """``first file spearman start -> exported``, each retrieval set's nDCG@10 the same way
        (None without an evaluation of the exported step)."""
        evaluations = self.history.evaluations
        if not evaluations or self.exported_step is None:
            return None
        first = evaluations[0]
        start = first if first["epoch"] == 0 else None
        shipped = next((h for h in evaluations if h["step"] == self.exported_step), None)
        if shipped is None:
            return None

        def change(key: str) -> str:
            after = shipped.get(key, float("nan"))
            if start is None or key not in start:
                return f"{after:.2f}"
            return f"{start[key]:.2f} -> {after:.2f} ({after - start[key]:+.2f})"

        parts = []
        key = next((k for k in first if k.startswith("sts_") and k.endswith("_spearman")), None)
        if key is not None:
            parts.append(f"{key.removeprefix('sts_').removesuffix('_spearman')} spearman {change(key)}")
        for key in (k for k in first if k.startswith("retrieval_") and k.endswith("_ndcg_at_10")):
            parts.append(
                f"{key.removeprefix('retrieval_').removesuffix('_ndcg_at_10')} ndcg@10 {change(key)}"
            )
        return "; ".join(parts)

    def sts_line(self) -> str | None:
        """:meth:`scores` and which evaluation was exported, from the evaluation history."""
        text = self.scores()
        if text is None:
            return None
        evaluations = self.history.evaluations
        candidates = len(evaluations) - (evaluations[0]["epoch"] == 0)
        return (
            f"{text}; exported epoch {self.exported_epoch:g} (step {self.exported_step}, best of "
            f"{candidates} evaluation{'s' if candidates != 1 else ''} after training; the starting "
            f"model's is the 'before', never exported)"
        )

    def headline(self) -> str:
        """One line for the top of the run's description: the base model, the data, and the
        shipped score against the starting model's with the difference (where the start was
        evaluated), then what that score is worth where the run knows (:attr:`eval_note`); no
        local path."""
        scores = self.scores()
        base = self.base_model or "a model"
        data = f"{self.data_name}: {self.corpus}" if self.data_name else self.corpus
        stopped = ", stopped early" if self.history.stopped_early else ""
        trained = (
            f"SimCSE run {self.run_name!r} fine-tuned {base} on {data}, "
            f"{self.epochs} epochs ({self.steps} steps{stopped})"
        )
        if scores is None:
            return f"{trained}; no evaluation."
        note = f" Note: {self.eval_note}." if self.eval_note else ""
        return f"{trained}. Shipped the model of step {self.exported_step}: {scores}.{note}"

    def description(self) -> str:
        """The MLflow run's description: the headline, then the console summary as a list,
        without its lines that name this machine's folders (useless inside the UI)."""
        return run_description(self.render(local_paths=False), self.headline())

    def render(self, local_paths: bool = True) -> str:
        """The console summary; without ``local_paths`` (the run description's list), no model
        folder and no ``mlflow ui`` command for this machine, and no eval-set note (the
        description's headline carries it)."""
        if self.already_finished:
            return (
                f"run {self.run_name!r} already finished (MLflow run {self.run_id}); nothing to do.\n"
                f"  review with   {ui_command(self.tracking_uri)}"
            )
        history = self.history
        refreshes = [s for s in history.refresh_seconds if s > 0]  # 0 where no new plan was adopted
        plans = ", ".join(f"v{v}" + (" (random)" if v == 0 else " (mined)") for v in history.plan_versions)
        losses = history.epoch_losses
        loss = f"{losses[0]:.4f} -> {losses[-1]:.4f} (epoch means)" if losses else "n/a"
        restarts = (
            f"; the miner actor was restarted {history.miner_restarts}x" if history.miner_restarts else ""
        )
        lines = [
            f"SimCSE run {self.run_name!r} finished in {self.wall_seconds:.0f}s",
            f"  epochs        {self.epochs} ({self.steps} steps)"
            + ("; stopped early: no better evaluation within eval.patience" if history.stopped_early else ""),
            f"  loss          {loss}",
            f"  batch plans   {plans}",
            f"  mining        {len(refreshes)} refresh{'es' if len(refreshes) != 1 else ''}, {sum(refreshes):.1f}s of "
            f"miner time; training waited {sum(history.wait_seconds):.1f}s{restarts}",
            f"  corpus        {self.corpus}",
        ]
        sts = self.sts_line()
        if sts:
            lines.append(f"  eval          {sts}")
        if self.eval_note and local_paths:  # the description's headline says it
            lines.append(f"  eval set      {self.eval_note}")
        lines += [
            *([f"  model         {self.model_dir}"] if local_paths else []),
            f"  mlflow run    {self.run_id} (experiment {self.experiment!r})",
            *([f"  mlflow model  {self.model_uri}"] if self.model_uri else []),
            *([f"  registered    {self.registered_as}"] if self.registered_as else []),
            *([f"  review with   {ui_command(self.tracking_uri)}"] if local_paths else []),
        ]
        return "\n".join(lines)
