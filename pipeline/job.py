"""The training job as the driver runs it: config in, trained model and MLflow run out.

Order matters for failing fast: paths and the tracking store are checked before Ray starts;
the corpus is read and the batch size checked before any worker starts; everything after
the MLflow run exists is inside a try block that marks the run FAILED on any error.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from pipeline.cluster import check_cluster_fits, ray_session
from pipeline.config.loading import dump_yaml
from pipeline.config.schema import Config
from pipeline.config.sections import ConfigError
from pipeline.data.corpus import load_clean_corpus
from pipeline.data.pairs import index_triplets, read_pairs
from pipeline.data.readers import check_corpus_columns, check_corpus_path
from pipeline.data.synthetic import write_generated_corpus, write_generated_sts
from pipeline.data.tokenize import tokenize_corpus_with_stats
from pipeline.data.tokenized import dataset_digest
from pipeline.evaluation.scoring import STSEvalSet, read_sts_files, with_distinct_names
from pipeline.evaluation.sts import STSPairs, read_sts
from pipeline.model.folders import (
    check_model_path,
    fetch_pretrained_dir,
    load_tokenizer,
    pack_dir,
    quiet_libraries,
)
from pipeline.model.tiny import build_tiny_model_dir
from pipeline.preflight import preflight_train
from pipeline.summary import JobSummary
from pipeline.tracking.context import log_run_context
from pipeline.tracking.run import (
    TrackedRun,
    check_tracking_reachable,
    resolve_tracking_uri,
    start_or_resume_run,
)


def _is_uri(path: str) -> bool:
    return "://" in path


def prepare_model_dir(cfg: Config, texts: list[str], run_dir: Path) -> Path:
    """The initial model folder: the configured one, or a tiny BERT with a tokenizer trained
    on the corpus. Reused as-is when a resumed run already made it."""
    if cfg.model.name_or_path:
        return fetch_pretrained_dir(cfg.model.name_or_path, run_dir / "initial_model")
    target = run_dir / "initial_model"
    if (target / "config.json").exists():
        return target
    tiny = cfg.model.tiny
    return build_tiny_model_dir(
        texts,
        target,
        hidden_size=tiny.hidden_size,
        num_layers=tiny.num_layers,
        num_heads=tiny.num_heads,
        intermediate_size=tiny.intermediate_size,
        vocab_size=tiny.vocab_size,
        max_seq_len=cfg.data.max_seq_len,
        dropout=cfg.model.dropout,
        seed=cfg.run.seed,
    )


def run_train_job(cfg: Config, echo: Callable[[str], None] = print) -> JobSummary:
    """Run the whole training job described by ``cfg`` and return its summary.

    Raises:
        ConfigError, DataError, ValueError, TimeoutError, RuntimeError: with a one-line
        message; the MLflow run (if created) is marked FAILED first.
    """
    started_at = time.perf_counter()
    run_name = cfg.run.name or datetime.now().strftime("simcse-%Y%m%d-%H%M%S")
    cfg.run.name = run_name
    run_dir = Path(cfg.run.output_dir).resolve() / run_name
    storage_root = cfg.run.storage_path or cfg.run.output_dir
    storage_root = storage_root if _is_uri(storage_root) else str(Path(storage_root).resolve())
    if cfg.data.path is not None:
        check_corpus_path(cfg.data.path)
        check_corpus_columns(cfg.data, pairs=cfg.mining.negative_mode == "triplet")
    if cfg.model.name_or_path:
        check_model_path(cfg.model.name_or_path)
    preflight_train(cfg)
    sts_files = read_sts_files(cfg.eval.sts, cfg.eval.format)  # bad STS files fail before any compute
    if cfg.data.path is None:
        # The generated files are written now, so that the config written beside the run and
        # logged as its params names the corpus and STS file the run really used.
        gen = cfg.data.generated
        if gen.sts_pairs:
            generated_sts = run_dir / "generated_sts.tsv"
            write_generated_sts(generated_sts, gen.num_groups, gen.group_size, gen.sts_pairs, gen.seed)
            cfg.eval.sts = [str(generated_sts), *cfg.eval.sts]
            sts_files = with_distinct_names([read_sts(generated_sts, "stsb"), *sts_files])
        if cfg.mining.negative_mode != "triplet":
            generated = run_dir / "generated_corpus.txt"
            write_generated_corpus(generated, gen.num_groups, gen.group_size, gen.seed)
            cfg.data.path = str(generated)

    tracking_uri = resolve_tracking_uri(cfg.tracking.uri)
    check_tracking_reachable(tracking_uri, cfg.tracking.connect_timeout_s)
    tracked = start_or_resume_run(tracking_uri, cfg.tracking.experiment, run_name)
    summary = JobSummary(run_name, tracked.run_id, tracking_uri, cfg.tracking.experiment)
    if tracked.already_finished:
        summary.already_finished = True
        return summary
    echo(
        f"[run] {'resuming' if tracked.resumed else 'starting'} {run_name!r}: MLflow run {tracked.run_id} at {tracking_uri}"
    )

    quiet_libraries()
    with tracked.failing_on_error():
        run_dir.mkdir(parents=True, exist_ok=True)
        resolved = run_dir / "resolved_config.yaml"
        resolved.write_text(dump_yaml(cfg))
        tracked.log_params(cfg.flat())
        tracked.log_artifact(resolved)
        with ray_session(cfg) as started_ray:
            check_cluster_fits(cfg, started_ray)
            _train(cfg, tracked, summary, run_dir, storage_root, sts_files, echo)
    summary.wall_seconds = time.perf_counter() - started_at
    tracked.set_note("```\n" + summary.render() + "\n```")
    tracked.finish()
    return summary


def _train(
    cfg: Config,
    tracked: TrackedRun,
    summary: JobSummary,
    run_dir: Path,
    storage_root: str,
    sts_files: list[STSPairs],
    echo: Callable[[str], None],
) -> None:
    """Data, model, miner, trainer and export, inside a Ray session; fills ``summary``."""
    miner, miner_pid = None, None
    try:
        triplets = None
        if cfg.mining.negative_mode == "triplet":
            anchors, positives, negatives, rows = read_pairs(cfg.data)
            corpus, triplets = index_triplets(anchors, positives, negatives)
            given = int((triplets.negative >= 0).sum())
            echo(
                f"[data] {cfg.data.path}: {len(triplets)} (anchor, positive) rows of {rows} "
                f"({rows - len(triplets)} with an empty field dropped), {given} with a given negative, "
                f"{corpus.num_rows} distinct texts"
            )
            summary.corpus = f"{len(triplets)} triplet rows over {corpus.num_rows} distinct texts"
            num_rows = len(triplets)
            tracked.set_tags(
                {"data.rows_read": rows, "data.triplets": num_rows, "data.texts": corpus.num_rows}
            )
        else:
            assert cfg.data.path is not None  # a generated corpus was written by run_train_job
            corpus, stats = load_clean_corpus(cfg.data)
            echo(f"[data] {cfg.data.path}: {stats.describe()}")
            summary.corpus = f"{stats.sentences} sentences ({stats.empty_dropped} empty, {stats.duplicates_dropped} duplicates dropped)"
            num_rows = stats.sentences
            tracked.set_tags(stats.tags())
        no_commit = log_run_context(
            tracked, cfg.data.path, num_rows, dataset_digest(corpus, triplets), cfg.mining.negative_mode
        )
        if no_commit:
            echo(f"[run] {no_commit}")
        if num_rows < cfg.train.batch_size:
            raise ConfigError(
                f"train.batch_size ({cfg.train.batch_size}) is larger than the corpus ({num_rows} "
                f"{'rows' if triplets is not None else 'sentences'})"
            )

        model_dir = prepare_model_dir(cfg, corpus.column("text").to_pylist(), run_dir)
        tokenizer = load_tokenizer(model_dir)
        t0 = time.perf_counter()
        tokenized, token_stats = tokenize_corpus_with_stats(corpus, tokenizer, cfg.data)
        echo(f"[data] tokenized {token_stats.describe()} in {time.perf_counter() - t0:.1f}s")
        tracked.set_tags(token_stats.tags())
        tracked.log_metrics(
            {
                "data/rows": num_rows,
                "data/texts": corpus.num_rows,
                "data/truncated_share": token_stats.truncated / max(1, token_stats.sentences),
            },
            step=0,
        )

        import ray

        corpus_ref = ray.put(tokenized)
        model_ref = ray.put(pack_dir(model_dir))
        triplets_ref = ray.put(triplets) if triplets is not None else None
        eval_ref = None
        if sts_files:
            eval_set = STSEvalSet(sts_files, tokenizer, cfg.data.max_seq_len)
            eval_ref = ray.put(eval_set)
            echo(
                f"[eval] {', '.join(f'{f.name} ({len(f)} pairs)' for f in sts_files)}: "
                f"{eval_set.num_sentences} sentences, evaluated at the start and every epoch end"
                + (f" and every {cfg.eval.every_steps} steps" if cfg.eval.every_steps else "")
            )
        if cfg.mining.enabled and cfg.train.epochs > 1:
            from pipeline.mining.miner import start_miner_actor

            miner = start_miner_actor(
                cfg.mining.num_cpus,
                cfg.mining.num_gpus,
                corpus_table=corpus_ref,
                model_blob=model_ref,
                pooler=cfg.model.pooler,
                batch_size=cfg.train.batch_size,
                top_k=cfg.mining.top_k,
                encode_batch_size=cfg.mining.encode_batch_size,
                seed=cfg.run.seed,
                tracking_uri=tracked.tracking_uri,
                run_id=tracked.run_id,
                index_spec=cfg.mining.index_spec(),
                filters=cfg.mining.negative_filters(),
                encode_actors=cfg.mining.encode_actors,
                encode_num_cpus=cfg.mining.encode_num_cpus,
                encode_num_gpus=cfg.mining.encode_num_gpus,
                triplets=triplets_ref,
                length_group_batches=cfg.train.group_batches,
                max_restarts=cfg.mining.max_restarts,
            )
            try:
                miner_pid = ray.get(miner.ready.remote(), timeout=cfg.mining.timeout_s)
            except ray.exceptions.GetTimeoutError:
                raise TimeoutError(
                    f"the miner actor (mining.num_cpus={cfg.mining.num_cpus:g}, mining.num_gpus={cfg.mining.num_gpus:g}) "
                    f"was not placed within mining.timeout_s={cfg.mining.timeout_s:g}s"
                ) from None

        from pipeline.tracking.export import (
            best_model_metrics,
            export_checkpoint_model,
            log_sentence_transformers_model,
        )
        from pipeline.tracking.review import log_review
        from pipeline.training.contract import LoopConfig, history_from_report
        from pipeline.training.trainer import build_trainer

        loop_config = LoopConfig(
            config=cfg,
            model_ref=model_ref,
            corpus_ref=corpus_ref,
            triplets_ref=triplets_ref,
            eval_ref=eval_ref,
            miner=miner,
            miner_pid=miner_pid,
            tracking_uri=tracked.tracking_uri,
            run_id=tracked.run_id,
        )
        echo(
            f"[train] {cfg.train.epochs} epochs on {cfg.train.num_workers} worker(s), global batch {cfg.train.batch_size}; "
            f"checkpoints in {storage_root}/{cfg.run.name}"
        )
        assert cfg.run.name is not None
        result = build_trainer(cfg, loop_config, storage_root, cfg.run.name).fit()
        if result.error is not None:
            raise result.error
        metrics = result.metrics or {}
        history = history_from_report(metrics)
        summary.epochs = len(history.epoch_losses)
        summary.steps = int(metrics.get("step", 0))
        summary.epoch_losses = history.epoch_losses
        summary.plan_versions = history.plan_versions
        summary.wait_seconds = history.wait_seconds
        summary.refresh_seconds = history.refresh_seconds
        summary.eval_history = history.evaluations
        summary.miner_restarts = history.miner_restarts

        export_dir, best = export_checkpoint_model(result.checkpoint, run_dir / "model")
        summary.exported_epoch = best.epoch if best is not None else float(summary.epochs)
        summary.exported_step = best.step if best is not None else summary.steps
        summary.model_dir = str(export_dir)
        log_review(tracked, summary.eval_history, summary.exported_epoch, summary.epoch_losses, run_dir)
        tracked.set_tags(
            {
                "simcse.exported_epoch": f"{summary.exported_epoch:g}",
                "simcse.exported_step": summary.exported_step,
            }
        )
        best_scores = best_model_metrics(summary.eval_history, summary.exported_epoch, summary.exported_step)
        tracked.log_metrics(best_scores, step=summary.exported_step)
        evaluated = [
            f"eval/{key.removeprefix('best/')}"
            for key in best_scores
            if key not in ("best/epoch", "best/step")
        ]
        summary.model_uri, version = log_sentence_transformers_model(
            tracked,
            export_dir,
            cfg.tracking.register_as,
            step=summary.exported_step,
            linked_metrics=[*evaluated, *best_scores],
            description=f"SimCSE run {summary.run_name!r} (MLflow run {summary.run_id}): "
            + (
                summary.sts_line()
                or f"exported at epoch {summary.exported_epoch:g}, step {summary.exported_step}"
            ),
        )
        if version is not None:
            summary.registered_as = f"{cfg.tracking.register_as}/{version}"
    finally:
        if miner is not None:
            import ray

            ray.kill(miner)
