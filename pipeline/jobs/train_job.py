"""The training job as the driver runs it: config in, trained model and MLflow run out.

Order matters for failing fast: paths and the tracking store are checked before Ray starts;
the corpus is read and the batch size checked before any worker starts; everything after
the MLflow run exists is inside a try block that marks the run FAILED on any error.

The config is resolved once (:func:`resolve_config`: the run name and the generated files
filled in) before it is written beside the run and logged as its params; from then on only
that resolved config is used, and nothing changes it, so that ``resolved_config.yaml``, the
params and what the workers and the miner get are the same. Inside the Ray session the job
runs its sections in order (:func:`train_in_ray`): load the training data, tokenize, put
the inputs in the object store (:mod:`pipeline.jobs.train_inputs`), start the miner, fit,
export and summarise, log the model (:mod:`pipeline.jobs.shipped_model`).
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import datetime
from pathlib import Path
from typing import Any

import ray

from pipeline.config.loading import dump_yaml
from pipeline.config.params import params_in_effect
from pipeline.config.schema import Config
from pipeline.core.errors import ConfigError, first_line
from pipeline.core.retry import call_with_retries
from pipeline.core.seams import connect_timeout_s
from pipeline.data.formats import infer_format
from pipeline.data.input_checks import check_corpus_columns, check_corpus_path
from pipeline.data.synthetic import (
    GENERATED_CORPUS_FILE,
    GENERATED_STS_FILE,
    write_generated_corpus,
    write_generated_sts,
)
from pipeline.evaluation.eval_inputs import eval_datasets
from pipeline.evaluation.in_training import check_eval_sets, selected_metric
from pipeline.evaluation.retrieval_sets import RetrievalSet, read_retrieval_sets
from pipeline.evaluation.scoring import read_sts_files
from pipeline.evaluation.set_names import with_distinct_names
from pipeline.evaluation.sts import STSPairs, read_sts
from pipeline.jobs.shipped_model import export_and_summarise, log_exported_model
from pipeline.jobs.summary import JobSummary
from pipeline.jobs.train_inputs import (
    InputRefs,
    describe_corpus,
    load_training_data,
    put_inputs,
    tokenize_inputs,
)
from pipeline.mining.miner_actor import start_miner_actor
from pipeline.mining.miner_settings import MinerSettings
from pipeline.model.folders import check_model_path, quiet_libraries
from pipeline.model.teacher import model_kind
from pipeline.runtime.cluster import check_cluster_fits, miner_shards, ray_session
from pipeline.runtime.nodes import (
    check_storage_on_every_node,
    live_nodes,
    plan_reads,
    rebuildable_from_storage,
)
from pipeline.runtime.preflight import preflight_train
from pipeline.tracking.context import log_datasets
from pipeline.tracking.relay import relay_needed, start_tracking_relay
from pipeline.tracking.run import (
    CONNECT_TIMEOUT_S,
    TrackedRun,
    check_tracking_reachable,
    resolve_tracking_uri,
    start_or_resume_run,
)
from pipeline.tracking.system import system_metrics
from pipeline.training.contract import LoopConfig, miner_inputs
from pipeline.training.trainer import build_trainer, resumable_checkpoints

Echo = Callable[[str], None]
MINER_LOG_WAIT_S = 30.0
"""How long the job lets the miner's last uploads (table row, histogram) finish before killing it."""


def _is_uri(path: str) -> bool:
    return "://" in path


def run_dir_of(cfg: Config) -> Path:
    """The run's local folder, ``run.output_dir/run.name``, of a resolved config."""
    assert cfg.run.name is not None
    return Path(cfg.run.output_dir).resolve() / cfg.run.name


def run_train_job(cfg: Config, echo: Echo = print, debug: bool = False) -> JobSummary:
    """Run the whole training job described by ``cfg`` and return its summary. ``debug`` (the
    job's ``--debug``) turns on Ray Data's progress bars and Ray Train's console logs.

    ``cfg`` itself is left unchanged: the job runs on :func:`resolve_config`'s copy.

    Raises:
        ConfigError, DataError, ValueError, TimeoutError, RuntimeError: with a one-line
        message; the MLflow run (if created) is marked FAILED first.
    """
    started_at = time.perf_counter()
    check_train_inputs(cfg)
    sts_files = read_sts_files(cfg.eval.sts)  # bad STS files fail before any compute
    retrieval_sets = read_retrieval_sets(cfg.eval.retrieval)  # and bad retrieval sets
    resolved = resolve_config(cfg)
    # resolve_config puts the generated STS file (if any) before the configured ones.
    generated_sts = resolved.eval.sts[: len(resolved.eval.sts) - len(cfg.eval.sts)]
    if generated_sts:
        sts_files = with_distinct_names([*(read_sts(p, "stsb") for p in generated_sts), *sts_files])
    sts_names, retrieval_names = [f.name for f in sts_files], [s.name for s in retrieval_sets]
    check_eval_sets(resolved.eval, sts_names, retrieval_names)
    # Named once here, the metric that picks the export is what the params, the resolved
    # config and the workers all read.
    selected = selected_metric(resolved.eval, sts_names, retrieval_names)
    resolved = dataclasses.replace(resolved, eval=dataclasses.replace(resolved.eval, select_by=selected))
    return _run_resolved(
        resolved,
        sts_files=sts_files,
        started_at=started_at,
        echo=echo,
        retrieval_sets=retrieval_sets,
        debug=debug,
        generated_data=cfg.data.path is None,
    )


def check_train_inputs(cfg: Config) -> None:
    """What can be checked of the config's inputs before anything is written or started:
    the corpus path and columns, the model path, and what the machine must have."""
    if cfg.data.path is not None:
        check_corpus_path(cfg.data.path)
        check_corpus_columns(cfg.data, pairs=cfg.pairs)
    if cfg.model.name_or_path:
        check_model_path(cfg.model.name_or_path)
    if cfg.mining.teacher.model:
        check_model_path(cfg.mining.teacher.model, key="mining.teacher.model")
    preflight_train(cfg)


def resolve_config(cfg: Config) -> Config:
    """The config the run really uses, as a new object that shares nothing with ``cfg``.

    ``run.name`` is set (a fresh ``simcse-<time>`` name when unset), and without
    ``data.path`` the generated corpus and STS file are written under the run folder now
    and named in ``data.path`` and (first) ``eval.sts``, so that the config written beside
    the run and logged as its params names the files the run really used; a distilled
    teacher's ``mining.teacher.temperature``, unset, is set from its kind.

    The result is what ``resolved_config.yaml``, the MLflow params, the workers and the
    miner all get: read it, never assign to it (build another with ``dataclasses.replace``).
    """
    resolved = copy.deepcopy(cfg)  # no section is shared with the caller's object
    name = cfg.run.name or datetime.now().strftime("simcse-%Y%m%d-%H%M%S")
    resolved = dataclasses.replace(resolved, run=dataclasses.replace(resolved.run, name=name))
    resolved = _with_teacher_temperature(resolved)
    if cfg.data.path is not None:
        return _with_read_formats(resolved)
    run_dir = run_dir_of(resolved)
    gen = cfg.data.generated
    if gen.sts_pairs:
        generated_sts = run_dir / GENERATED_STS_FILE
        write_generated_sts(generated_sts, gen.num_groups, gen.sts_pairs)
        sts = [str(generated_sts), *resolved.eval.sts]
        resolved = dataclasses.replace(resolved, eval=dataclasses.replace(resolved.eval, sts=sts))
    if not cfg.pairs:
        generated = run_dir / GENERATED_CORPUS_FILE
        write_generated_corpus(generated, gen.num_groups)
        resolved = dataclasses.replace(resolved, data=dataclasses.replace(resolved.data, path=str(generated)))
    return _with_read_formats(resolved)


def _with_teacher_temperature(cfg: Config) -> Config:
    """``cfg`` with ``mining.teacher.temperature`` set where a distilled teacher leaves it
    unset: ``train.temperature`` for a bi-encoder (its scores are cosines, as the student's
    are), 1 for a cross-encoder (its scores are logits already)."""
    teacher = cfg.mining.teacher
    if teacher.model is None or teacher.temperature is not None or cfg.train.distill_weight == 0:
        return cfg
    temperature = 1.0 if model_kind(teacher.model) == "cross_encoder" else cfg.train.temperature
    teacher = dataclasses.replace(teacher, temperature=temperature)
    return dataclasses.replace(cfg, mining=dataclasses.replace(cfg.mining, teacher=teacher))


def _with_read_formats(cfg: Config) -> Config:
    """``cfg`` with ``data.format`` and ``data.pool_format`` as the files will be read:
    ``auto`` becomes the format the extension names."""
    data = cfg.data
    if data.path is not None:
        data = dataclasses.replace(data, format=infer_format(data.path, data.format))
    if data.pool is not None:
        data = dataclasses.replace(
            data, pool_format=infer_format(data.pool, data.pool_format, key="data.pool_format")
        )
    return dataclasses.replace(cfg, data=data)


def _run_resolved(
    cfg: Config,
    *,
    sts_files: list[STSPairs],
    started_at: float,
    echo: Echo,
    retrieval_sets: list[RetrievalSet] | None = None,
    debug: bool = False,
    generated_data: bool = False,
) -> JobSummary:
    """Open the MLflow run, record the resolved ``cfg`` and train in a Ray session; the run
    is FINISHED with the summary as its description, or FAILED. ``generated_data``: the
    corpus was generated (its ``data.generated`` settings are params)."""
    assert cfg.run.name is not None
    run_dir = run_dir_of(cfg)
    storage_root = cfg.run.storage_path or cfg.run.output_dir
    storage_root = storage_root if _is_uri(storage_root) else str(Path(storage_root).resolve())
    tracking_uri = resolve_tracking_uri(cfg.tracking.uri)
    check_tracking_reachable(tracking_uri, connect_timeout_s(CONNECT_TIMEOUT_S))
    tracked = start_or_resume_run(tracking_uri, cfg.tracking.experiment, cfg.run.name)
    if tracked.already_finished:
        return JobSummary(
            cfg.run.name, tracked.run_id, tracking_uri, cfg.tracking.experiment, already_finished=True
        )
    echo(
        f"[run] {'resuming' if tracked.resumed else 'starting'} {cfg.run.name!r}: MLflow run {tracked.run_id} at {tracking_uri}"
    )

    quiet_libraries()
    with tracked.failing_on_error():
        check_checkpoints_are_this_runs(cfg, tracked, storage_root)
        run_dir.mkdir(parents=True, exist_ok=True)
        resolved_file = run_dir / "resolved_config.yaml"
        resolved_file.write_text(dump_yaml(cfg))
        tracked.log_params(params_in_effect(cfg, generated_data=generated_data))
        tracked.log_artifact(resolved_file)
        log_datasets(tracked, eval_datasets(sts_files, retrieval_sets or []))
        with driver_system_metrics(cfg, tracked), ray_session(cfg, debug) as started_ray:
            check_cluster_fits(cfg, started_ray)
            storage_key = (
                "run.storage_path" if cfg.run.storage_path else "run.storage_path (unset: run.output_dir)"
            )
            check_storage_on_every_node(storage_root, storage_key)
            summary = train_in_ray(
                cfg,
                tracked,
                storage_root=storage_root,
                sts_files=sts_files,
                echo=echo,
                retrieval_sets=retrieval_sets,
                debug=debug,
                joined_cluster=not started_ray,
            )
    summary = dataclasses.replace(summary, wall_seconds=time.perf_counter() - started_at)
    tracked.set_note(summary.description())
    tracked.finish()
    return summary


def check_checkpoints_are_this_runs(cfg: Config, tracked: TrackedRun, storage_root: str) -> None:
    """A new MLflow run must not continue checkpoints it does not own.

    Ray Train resumes whatever run left checkpoints under ``storage_root/run.name``. When the
    MLflow run was just created, they are another run's: one of another
    ``tracking.experiment`` or tracking store, or a deleted run. Training would silently go
    on from its weights, plan and step. Refused before the run's config or a checkpoint is
    written there (a generated corpus was written already, by :func:`resolve_config`).

    Raises:
        ConfigError: naming the folder and the ways out.
    """
    if tracked.resumed:
        return
    assert cfg.run.name is not None
    folder = resumable_checkpoints(storage_root, cfg.run.name)
    if folder is not None:
        raise ConfigError(
            f"run.name {cfg.run.name!r}: {folder} holds the checkpoints of a run that experiment "
            f"{cfg.tracking.experiment!r} at {tracked.tracking_uri} does not have (another "
            "experiment's, another store's, or a deleted run); training would continue it. "
            "Choose another run.name or run.output_dir, or remove that folder"
        )


def driver_system_metrics(cfg: Config, tracked: TrackedRun) -> AbstractContextManager[Any]:
    """The driver's machine's system metrics for the whole job (``tracking.system_metrics``):
    from the run's start, through data loading and export, not only while workers train."""
    if not cfg.tracking.system_metrics:
        return nullcontext()

    return system_metrics(tracked.tracking_uri, tracked.run_id)


def train_in_ray(
    cfg: Config,
    tracked: TrackedRun,
    *,
    storage_root: str,
    sts_files: list[STSPairs],
    echo: Echo,
    retrieval_sets: list[RetrievalSet] | None = None,
    debug: bool = False,
    joined_cluster: bool = True,
) -> JobSummary:
    """The job's sections inside the Ray session: data, model, miner, trainer and export
    (``debug``: Ray Train's console logs on, see :func:`build_trainer`; ``joined_cluster``:
    False when the job started its own local Ray, one node on one disk).

    Returns the summary (``wall_seconds`` still 0); the miner actor is gone when it returns
    or raises.
    """
    run_dir = run_dir_of(cfg)
    reads = plan_reads({"data.path": cfg.data.path, "data.pool": cfg.data.pool}, echo)
    data = load_training_data(cfg, tracked, echo, reads=reads)
    inputs = tokenize_inputs(cfg, data, run_dir, tracked, echo)
    if len(live_nodes()) > 1:  # one node is never lost without the job: nothing to rebuild
        stored = rebuildable_from_storage(inputs.corpus.refs, f"{storage_root}/{cfg.run.name}/tokenized")
        inputs = dataclasses.replace(inputs, corpus=dataclasses.replace(inputs.corpus, refs=stored))
    refs = put_inputs(cfg, data, inputs, sts_files=sts_files, echo=echo, retrieval_sets=retrieval_sets)
    corpus_line = describe_corpus(data, inputs)
    # Training reads the tokens only: dropping the data lets the texts' blocks leave the object
    # store (a teacher keeps them: refs.texts).
    del data
    mined_dir = f"{storage_root}/{cfg.run.name}/mined"  # every node reads the run's storage
    with (
        tracking_relay(tracked, joined_cluster) as relay,
        miner_actor(cfg, tracked, refs, relay, mined_dir=mined_dir) as (miner, miner_pid),
    ):
        result = fit(
            cfg,
            tracked,
            refs=refs,
            miner=miner,
            miner_pid=miner_pid,
            storage_root=storage_root,
            echo=echo,
            debug=debug,
            relay=relay,
        )
        summary = export_and_summarise(cfg, tracked, result, corpus_line, run_dir)
        return log_exported_model(cfg, tracked, summary, run_dir)


@contextmanager
def tracking_relay(tracked: TrackedRun, joined_cluster: bool) -> Iterator[str | None]:
    """The name of the :class:`~pipeline.tracking.relay.TrackingRelay` started on the driver's
    node when the store is on its disk and the job joined a cluster (rank 0 and the miner log
    through it), killed on exit; None for a store every node reaches, and on a local Ray the
    job started itself (one node, one disk: no actor to start). A joined cluster gets it even
    with one node now: an autoscaler may add the nodes the workers land on."""
    if not (joined_cluster and relay_needed(tracked.tracking_uri)):
        yield None
        return
    relay, name = start_tracking_relay(tracked.tracking_uri, tracked.run_id)
    try:
        yield name
    finally:
        ray.kill(relay)


@contextmanager
def miner_actor(
    cfg: Config, tracked: TrackedRun, refs: InputRefs, relay: str | None = None, *, mined_dir: str
) -> Iterator[tuple[Any, int | None]]:
    """The miner actor and its process id once it is placed and loaded, killed on exit;
    ``(None, None)`` when no refresh runs (mining off, or a single epoch). ``relay``: the
    name of the tracking relay the miner logs through, if any; ``mined_dir``: where it writes
    what each refresh mined (the run's storage: every rank reads it).

    Raises:
        TimeoutError: the actor was not placed within ``train.placement_timeout_s``.
    """
    if not cfg.runs_miner:
        yield None, None
        return

    shards = miner_shards(cfg, ray.cluster_resources())
    settings = MinerSettings.from_config(
        cfg, tracked.tracking_uri, tracked.run_id, tracking_relay=relay, shards=shards, mined_dir=mined_dir
    )
    if shards > 1:
        unset = " (mining.shards unset: one per GPU share beyond the train workers')"
        print(
            f"[mining] the miner over {shards} shards{unset if cfg.mining.shards is None else ''}", flush=True
        )
    miner = start_miner_actor(settings)
    try:
        try:
            inputs = miner_inputs(refs.corpus, refs.model, refs.triplets, refs.texts, refs.teacher)
            timeout_s = cfg.train.placement_timeout_s
            deadline = time.monotonic() + timeout_s
            # A miner that dies while it loads (memory pressure on a busy node) is restarted by
            # Ray (train.max_failures); calls made meanwhile fail at once: ask again until the
            # deadline rather than fail the job before its first step.
            miner_pid = call_with_retries(
                lambda: ray.get(miner.ready.remote(inputs), timeout=max(0.1, deadline - time.monotonic())),
                retry_on=ray.exceptions.ActorUnavailableError,
                timeout_s=timeout_s,
                wait_s=1.0,
            )
        except (ray.exceptions.GetTimeoutError, ray.exceptions.ActorUnavailableError):
            selector = (
                f", mining.label_selector={cfg.mining.label_selector}" if cfg.mining.label_selector else ""
            )
            shards = f" and its {settings.shards} shards, each" if settings.shards > 1 else ""
            raise TimeoutError(
                f"the miner actor{shards} (mining.num_cpus={cfg.mining.num_cpus:g}, "
                f"mining.num_gpus={cfg.mining.num_gpus:g}{selector}) was not placed within "
                f"train.placement_timeout_s={timeout_s:g}s"
            ) from None
        yield miner, miner_pid
        # The last refresh's table row and histogram go up in the miner's background; let them
        # land before the actor is killed (a failure here costs a diagnostic, never the run).
        try:
            ray.get(miner.wait_logged.remote(MINER_LOG_WAIT_S), timeout=MINER_LOG_WAIT_S + 5)
        except Exception as exc:
            print(f"[mining] warning: the miner's last uploads did not finish: {first_line(exc)}", flush=True)
    finally:
        ray.kill(miner)


def fit(
    cfg: Config,
    tracked: TrackedRun,
    *,
    refs: InputRefs,
    miner: Any,
    miner_pid: int | None,
    storage_root: str,
    echo: Echo,
    debug: bool = False,
    relay: str | None = None,
) -> Any:
    """Train all epochs with one Ray Train ``fit()``, checkpointing under
    ``storage_root/run.name`` (``debug``: Ray Train's console logs on; ``relay``: the name of
    the tracking relay rank 0 logs through, if any).

    Returns:
        Ray Train's result (its last reported metrics and the final checkpoint).

    Raises:
        The training error Ray Train ended with.
    """
    assert cfg.run.name is not None
    loop_config = LoopConfig(
        config=cfg,
        model_ref=refs.model,
        corpus=refs.corpus,
        triplets_ref=refs.triplets,
        texts=refs.texts,
        teacher_ref=refs.teacher,
        eval_ref=refs.eval,
        retrieval_ref=refs.retrieval,
        miner=miner,
        miner_pid=miner_pid,
        tracking_uri=tracked.tracking_uri,
        run_id=tracked.run_id,
        tracking_relay=relay,
        driver_node_id=ray.get_runtime_context().get_node_id(),
    )
    echo(
        f"[train] {cfg.train.epochs} epochs on {cfg.train.num_workers} worker(s), global batch {cfg.train.batch_size}; "
        f"checkpoints in {storage_root}/{cfg.run.name}"
    )
    result = build_trainer(cfg, ray.put(loop_config), storage_root, cfg.run.name, debug).fit()
    if result.error is not None:
        raise result.error
    return result
