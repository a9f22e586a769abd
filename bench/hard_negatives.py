"""Hard-negative batch samplers against random batches and the sentence-transformers peer, on
the quality of the final model (issue 16): dev Spearman x 100 and paraphrase retrieval
(MRR@10, recall@1 x 100) over several seeds. For supervised triplet mode (task ``snli``): the
given contradictions against mined negatives beside them, and the peer's own miner.

Each variant x seed is one ``jobs/train.py`` run of the task's recipe config with the
variant's ``--set`` overrides (plus ``run.seed``, ``run.name``, ``data.max_rows``,
``train.epochs`` and the ``hard-negatives-bench`` MLflow experiment); ``peer`` is
``bench/st_mnrl_recipe.py`` on the same rows, batch size, max length, learning rate and epochs.
Every run is scored as it ends, not at its best epoch (the peer has no best epoch): a pipeline
run's scores are read from its MLflow metric history at the last evaluation step.

    python jobs/recipes/prepare.py --data ../shared/data          # once: runs/recipe-data
    python bench/hard_negatives.py --task cnsd --variants random,knn,rwr,clusters,mixed,peer \\
        --seeds 1,2,3 --skip-done                                    # a grid, resumable in chunks
    python bench/hard_negatives.py --task wiki --variants knn+debias,knn+cluster-debias --seeds 1,2,3
    python bench/hard_negatives.py --task cnsd --variants knn,peer --seeds 1 --max-rows 256 --epochs 2
    python bench/hard_negatives.py --task snli --seeds 1,2,3         # the triplet variants, 2 epochs
    python bench/hard_negatives.py --report                          # markdown table of the results

Tasks ``cnsd`` and ``wiki`` (unsupervised SimCSE, neighbourhood mode; baseline ``random``):
``random`` (refresh on, random batches: ``mining.batch_sampler=random``), ``random-norefresh``
(``mining.enabled=false``), ``knn``, ``rwr``, ``clusters``, ``mixed``
(``mining.batch_sampler=<name>``), any of those plus ``+debias`` (``mining.debias=threshold``)
or ``+cluster-debias`` (``mining.debias=cluster``), and ``peer``.

Task ``snli`` (recipe (b): supervised SimCSE on SNLI triplets, ``mining.negative_mode=triplet``,
STS-B dev; baseline ``given``): ``given`` (``mining.enabled=false``: each anchor's given
contradiction only), ``mined`` (refresh on, ``mining.num_negatives=1``: a mined negative beside
the given one), ``mined+random`` (also ``mining.random_negatives=1``), ``peer`` (MNRL on the
given triplets) and ``peer-mined`` (``st_mnrl_recipe.py --mine-hard-negatives``: the peer's
``mine_hard_negatives`` on the (anchor, positive) pairs of the same rows with the same model and
the pipeline's settings (``range_min``, ``relative_margin``, ``num_negatives``, ``sampling``,
``top_k`` as its ``range_max``), then MNRL on anchor, positive, given and mined negative). The
pipeline mines between epochs, so its mined negatives exist from epoch 2 on: the task defaults
to 2 epochs (the recipe trains 1), and ``mined`` variants need ``--epochs`` >= 2. The peer
mines once, up front, with the starting model (its documented use), and leaves out of training
the rows it found no negative for (``mined_anchors`` in the results, beside the pipeline's
``mining/selected``; the table's "mined" column).

One JSON line per finished run is appended to ``--results``; a failed run is reported and the
grid goes on (exit status 1 at the end). Run folders go under ``runs/hard-negatives/`` and are
removed once their line is written (the MLflow run keeps the metrics and the model) unless
``--keep-run-dirs``. Children run with ``HF_HUB_OFFLINE=1``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.markdown_report import machine_info, machine_line  # noqa: E402
from pipeline.mining.planning import SAMPLERS  # noqa: E402  (the samplers the miner knows)

EXPERIMENT = "hard-negatives-bench"
BENCH_DIR = REPO / "runs" / "hard-negatives"
RECIPE_DATA = REPO / "runs" / "recipe-data"
DEBIAS = {"debias": "threshold", "cluster-debias": "cluster"}
TRIPLET_VARIANTS = {
    "given": ["mining.enabled=false"],
    "mined": ["mining.enabled=true", "mining.num_negatives=1"],
    "mined+random": ["mining.enabled=true", "mining.num_negatives=1", "mining.random_negatives=1"],
}
"""Task ``snli``'s pipeline variants (triplet mode); ``mined`` is the setting the peer matches."""
PEERS = {"peer": False, "peer-mined": True}
"""The sentence-transformers variants: whether they run ``mine_hard_negatives`` first."""
SCORES = ("spearman", "mrr_at_10", "recall_at_1")


@dataclass(frozen=True)
class TaskSpec:
    """A task of the grid: its recipe config and the variants that apply to it."""

    config: str
    triplet: bool
    """Supervised triplet mode: the triplet variants and both peers; else (neighbourhood mode)
    the batch samplers and ``peer``."""
    baseline: str
    """The variant every other one is compared with in the report."""
    variants: str
    """``--variants`` by default."""
    epochs: int | None = None
    """``train.epochs`` unless ``--epochs`` says (None: the recipe's)."""


SAMPLER_VARIANTS = "random,knn,rwr,clusters,mixed,knn+debias,peer"
TASKS = {
    "cnsd": TaskSpec(
        "jobs/configs/recipe-cnsd-unsup.yaml", triplet=False, baseline="random", variants=SAMPLER_VARIANTS
    ),
    "wiki": TaskSpec(
        "jobs/configs/recipe-wiki-unsup.yaml", triplet=False, baseline="random", variants=SAMPLER_VARIANTS
    ),
    "snli": TaskSpec(
        "jobs/configs/recipe-snli-sup.yaml", triplet=True, baseline="given",
        variants="given,mined,mined+random,peer,peer-mined", epochs=2,
    ),
}  # fmt: skip
BASELINE = "random"
"""The report's baseline for a task it does not know."""


def variant_overrides(task: str, variant: str) -> list[str] | None:
    """The ``--set`` overrides of one of ``task``'s variants (None: a peer, not a pipeline run).

    Raises:
        ValueError: a variant that is unknown or not one of ``task``'s (a sampler for a triplet
            task, a triplet variant for an unsupervised one), naming ``task``'s.
    """
    sampler, _, debias = variant.partition("+")
    if TASKS[task].triplet:
        if variant in TRIPLET_VARIANTS:
            return TRIPLET_VARIANTS[variant]
        if variant in PEERS:
            return None
        known = ", ".join([*TRIPLET_VARIANTS, *PEERS])
        other_mode = variant == "random-norefresh" or sampler in SAMPLERS
        why = f"Batch samplers and debiasing are for neighbourhood mode (tasks {tasks(False)}); {task} trains triplets"
    else:
        if variant == "peer":
            return None
        if variant == "random-norefresh":
            return ["mining.enabled=false"]
        if sampler in SAMPLERS and (not debias or debias in DEBIAS):
            return [f"mining.batch_sampler={sampler}"] + (
                [f"mining.debias={DEBIAS[debias]}"] if debias else []
            )
        known = (
            f"peer, random-norefresh, {', '.join(SAMPLERS)}, optionally with +{' or +'.join(DEBIAS)} "
            "(e.g. knn+debias)"
        )
        other_mode = variant in TRIPLET_VARIANTS or variant in PEERS
        why = f"The triplet variants and peer-mined are for triplet mode (tasks {tasks(True)}); {task} is unsupervised"
    raise ValueError(
        f"variant {variant!r} is not one of task {task}'s: {known}" + (f". {why}." if other_mode else "")
    )


def tasks(triplet: bool) -> str:
    """The names of the triplet (or of the neighbourhood-mode) tasks."""
    return ", ".join(name for name, spec in TASKS.items() if spec.triplet == triplet)


@dataclass(frozen=True)
class Task:
    """What a task's runs share, resolved from its recipe config and the CLI."""

    name: str
    config: str
    max_rows: int | None
    epochs: int
    data_path: str
    model: str
    sts: str
    """The first ``eval.sts`` file: the one that picks checkpoints, and the one scored here."""
    lr: float
    batch_size: int
    max_seq_len: int
    tracking_uri: str
    experiment: str
    peer_mining: tuple[str, ...] = ()
    """``st_mnrl_recipe.py``'s mining options for ``peer-mined``: the ``mined`` variant's
    settings (triplet tasks only)."""


def peer_mining_args(mining: Any) -> tuple[str, ...]:
    """``st_mnrl_recipe.py --mine-hard-negatives`` with a ``MiningSection``'s settings: its
    ``top_k`` candidates (or ``range_max``) as the peer's ``range_max``, the same ``range_min``,
    ``relative_margin``, ``num_negatives``, ``sampling`` and encode batch."""
    margin = -1.0 if mining.relative_margin is None else mining.relative_margin  # -1: none
    return (
        "--mine-hard-negatives", "--range-min", str(mining.range_min),
        "--range-max", str(mining.range_max or mining.top_k), "--relative-margin", str(margin),
        "--num-negatives", str(mining.num_negatives), "--sampling", mining.sampling,
        "--mining-batch-size", str(mining.encode_batch_size),
    )  # fmt: skip


def resolve_task(name: str, max_rows: int | None, epochs: int | None, experiment: str = EXPERIMENT) -> Task:
    """The task's recipe config with the CLI's rows and epochs applied (None: the task's
    default, else the recipe's)."""
    from pipeline.config.loading import load_config
    from pipeline.tracking.run import resolve_tracking_uri

    spec = TASKS[name]
    epochs = epochs or spec.epochs
    overrides = [f"data.max_rows={max_rows}"] if max_rows else []
    overrides += [f"train.epochs={epochs}"] if epochs else []
    cfg = load_config(REPO / spec.config, overrides)
    peer_mining = ()
    if spec.triplet:
        peer_mining = peer_mining_args(
            load_config(REPO / spec.config, overrides + TRIPLET_VARIANTS["mined"]).mining
        )
    return Task(
        name=name,
        config=spec.config,
        max_rows=cfg.data.max_rows,
        epochs=cfg.train.epochs,
        data_path=str(cfg.data.path),
        model=cfg.model.name_or_path,
        sts=cfg.eval.sts[0],
        lr=cfg.train.lr,
        batch_size=cfg.train.batch_size,
        max_seq_len=cfg.data.max_seq_len,
        tracking_uri=resolve_tracking_uri(cfg.tracking.uri, REPO),  # the store the jobs write to
        experiment=experiment,
        peer_mining=peer_mining,
    )


def run_name(task: Task, variant: str, seed: int) -> str:
    """Unique per task, variant, rows, epochs and seed (``+`` is not allowed in run names)."""
    rows = task.max_rows or "all"
    return f"hn-{task.name}-{variant.replace('+', '_')}-r{rows}-e{task.epochs}-s{seed}"


def child_env() -> dict[str, str]:
    """The children never reach the hub (the recipe model is a local folder) and keep quiet."""
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}


def run_logged(cmd: list[str], log: Path) -> tuple[int, float, str]:
    """Run ``cmd`` from the repository root, its output to ``log``; (status, wall seconds, output)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with log.open("w", encoding="utf-8") as handle:
        status = subprocess.run(
            cmd, cwd=REPO, env=child_env(), stdout=handle, stderr=subprocess.STDOUT
        ).returncode
    return status, time.perf_counter() - started, log.read_text(encoding="utf-8", errors="replace")


def metric_key(sts_path: str, metric: str) -> str:
    """The MLflow name of an STS metric, as :meth:`STSScore.metrics` and ``eval_metric_names``
    build it: ``eval/sts_<file stem>_<metric>``."""
    stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in Path(sts_path).stem)
    return f"eval/sts_{stem}_{metric}"


def finished_run(task: Task, name: str) -> Any | None:
    """The finished MLflow run called ``name`` in the task's experiment, if there is one."""
    from mlflow.tracking import MlflowClient

    from pipeline.tracking.run import RUN_NAME_TAG, STATE_TAG

    client = MlflowClient(tracking_uri=task.tracking_uri)
    experiment = client.get_experiment_by_name(task.experiment)
    if experiment is None:
        return None
    runs = client.search_runs(
        [experiment.experiment_id],
        filter_string=f"tags.`{RUN_NAME_TAG}` = '{name}' and tags.`{STATE_TAG}` = 'finished'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    return runs[0] if runs else None


def final_scores(task: Task, run: Any) -> dict[str, Any]:
    """The final model's scores (the evaluation at the highest step, i.e. after the last epoch,
    whichever epoch was exported), steps, rows, times and the latest ``mining/`` metrics."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=task.tracking_uri)
    out: dict[str, Any] = {}
    for metric in SCORES:
        history = client.get_metric_history(run.info.run_id, metric_key(task.sts, metric))
        if not history:
            raise RuntimeError(f"run {run.info.run_id} logged no {metric_key(task.sts, metric)}")
        last = max(history, key=lambda m: (m.step, m.timestamp))
        out[metric] = last.value
        out["steps"] = last.step
    metrics = run.data.metrics
    epoch_seconds = client.get_metric_history(run.info.run_id, "train/epoch_seconds")
    out["rows"] = int(metrics["data/rows"]) if "data/rows" in metrics else None
    out["train_seconds"] = round(sum(m.value for m in epoch_seconds), 1) if epoch_seconds else None
    if run.info.end_time:
        out["run_seconds"] = round((run.info.end_time - run.info.start_time) / 1000, 1)
    out["mining"] = {k: v for k, v in sorted(metrics.items()) if k.startswith("mining/")}
    out["mlflow_run_id"] = run.info.run_id
    return out


def run_pipeline(task: Task, variant: str, seed: int, overrides: list[str], keep_dir: bool) -> dict[str, Any]:
    """One ``jobs/train.py`` run (or, if a finished MLflow run of that name exists, just its scores)."""
    name = run_name(task, variant, seed)
    output_dir = BENCH_DIR / task.name
    wall = None
    run = finished_run(task, name)
    if run is None:
        cmd = [sys.executable, "jobs/train.py", "--config", task.config]
        sets = [
            *overrides,
            f"run.seed={seed}",
            f"run.name={name}",
            f"run.output_dir={output_dir}",
            f"train.epochs={task.epochs}",
            f"tracking.experiment={task.experiment}",
        ]
        sets += [f"data.max_rows={task.max_rows}"] if task.max_rows else []
        for item in sets:
            cmd += ["--set", item]
        status, wall, output = run_logged(cmd, BENCH_DIR / "logs" / f"{name}.log")
        if status != 0:
            raise RuntimeError(f"jobs/train.py exited {status}:\n{tail(output)}")
        run = finished_run(task, name)
        if run is None:
            raise RuntimeError(f"jobs/train.py finished but no finished MLflow run {name!r}:\n{tail(output)}")
    record = {"run_name": name, "wall_seconds": None if wall is None else round(wall, 1)}
    record.update(final_scores(task, run))
    if not keep_dir:
        shutil.rmtree(output_dir / name, ignore_errors=True)  # MLflow keeps scores and model
    return record


def run_peer(task: Task, variant: str, seed: int, keep_dir: bool) -> dict[str, Any]:
    """``bench/st_mnrl_recipe.py`` on the task's rows, batch size, max length, lr and epochs;
    ``peer-mined``: after ``mine_hard_negatives`` with the task's :attr:`Task.peer_mining`."""
    name = run_name(task, variant, seed)
    out_dir = BENCH_DIR / task.name / name
    cmd = [
        sys.executable, "bench/st_mnrl_recipe.py", "--model", task.model, "--train", task.data_path,
        "--epochs", str(task.epochs), "--lr", str(task.lr), "--batch-size", str(task.batch_size),
        "--max-seq-len", str(task.max_seq_len), "--sts", task.sts, "--out", str(out_dir),
        "--seed", str(seed),
    ]  # fmt: skip
    cmd += ["--max-rows", str(task.max_rows)] if task.max_rows else []
    cmd += list(task.peer_mining) if PEERS[variant] else []
    status, wall, output = run_logged(cmd, BENCH_DIR / "logs" / f"{name}.log")
    if status != 0:
        raise RuntimeError(f"bench/st_mnrl_recipe.py exited {status}:\n{tail(output)}")
    result = json.loads(next(line for line in reversed(output.splitlines()) if line.startswith("{")))
    if not keep_dir:
        shutil.rmtree(out_dir, ignore_errors=True)
    mining = ("mined_anchors", "mining_rows_in", "mining_seconds", "mining_settings")
    return {
        "run_name": name,
        "wall_seconds": round(wall, 1),
        **{k: result[k] for k in SCORES},
        "steps": result["steps"],
        "rows": result["rows"],
        "train_seconds": result["train_seconds"],
        **{k: result[k] for k in mining if k in result},
    }


def parse_list(text: str) -> list[str]:
    """``"a, b,,c"`` -> ``["a", "b", "c"]``."""
    return [item.strip() for item in text.split(",") if item.strip()]


def tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.splitlines()[-lines:])


def read_results(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def done_key(record: dict[str, Any]) -> tuple[Any, ...]:
    """What makes two runs the same experiment: --skip-done skips a planned run with this key."""
    return (record["task"], record["variant"], record["seed"], record["max_rows"], record["epochs"])


def git_commit() -> str | None:
    """``HEAD``'s short hash, ``+dirty`` with uncommitted changes (results are only comparable
    at one code state)."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        )
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True)
    except OSError:
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "") if head.returncode == 0 else None


def run_grid(args: argparse.Namespace) -> int:
    """Every variant x seed of ``--task`` not yet done, one results line each."""
    if not RECIPE_DATA.is_dir():
        print(
            f"{RECIPE_DATA.relative_to(REPO)} is missing: run "
            "`python jobs/recipes/prepare.py --data ../shared/data` first",
            file=sys.stderr,
        )
        return 2
    variants = parse_list(args.variants or TASKS[args.task].variants)
    seeds = [int(s) for s in parse_list(args.seeds)]
    try:
        overrides = {v: variant_overrides(args.task, v) for v in variants}
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    task = resolve_task(args.task, args.max_rows, args.epochs, args.experiment)
    mined = [v for v in variants if "mining.enabled=true" in (overrides[v] or [])]
    if TASKS[task.name].triplet and mined and task.epochs < 2:
        print(
            f"error: --epochs {task.epochs} is too few for {', '.join(mined)}: triplet mode mines "
            "between epochs, so its mined negatives exist from epoch 2 on "
            f"(task {task.name}'s default: {TASKS[task.name].epochs} epochs)",
            file=sys.stderr,
        )
        return 2
    results = Path(args.results)
    done = {done_key(r) for r in read_results(results)} if args.skip_done else set()
    common = {"task": task.name, "max_rows": task.max_rows, "epochs": task.epochs}
    machine, commit = machine_line(machine_info()), git_commit()
    failed = 0
    for seed in seeds:  # seeds outermost: a grid cut short still has every variant at seed 1
        for variant in variants:
            planned = {**common, "variant": variant, "seed": seed}
            if done_key(planned) in done:
                print(f"[skip] {task.name} {variant} seed {seed}: already in {results}", flush=True)
                continue
            print(f"[run ] {task.name} {variant} seed {seed} ...", flush=True)
            try:
                if overrides[variant] is None:
                    measured = run_peer(task, variant, seed, args.keep_run_dirs)
                else:
                    measured = run_pipeline(task, variant, seed, overrides[variant], args.keep_run_dirs)
            except Exception as exc:  # one failed run must not lose the rest of the grid
                failed += 1
                print(f"[fail] {task.name} {variant} seed {seed}: {exc}", file=sys.stderr, flush=True)
                continue
            record = {**planned, **measured, "commit": commit, "machine": machine, "finished_at": time.time()}
            results.parent.mkdir(parents=True, exist_ok=True)
            with results.open("a", encoding="utf-8") as handle:
                handle.write(json.dumps(record) + "\n")
            print(
                f"[done] {task.name} {variant} seed {seed}: spearman {record['spearman']:.2f}, "
                f"mrr@10 {record['mrr_at_10']:.2f}, recall@1 {record['recall_at_1']:.2f}, "
                f"{record['steps']} steps, {record['wall_seconds'] or record.get('run_seconds')}s",
                flush=True,
            )
    return 1 if failed else 0


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (NaN for a single value)."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else math.nan


def difference(variant: list[float], baseline: list[float]) -> str:
    """``+0.42 (outside)``: the mean difference to the baseline, and whether it is larger than
    the two spreads together (their mean ± sample std ranges do not overlap)."""
    (m, s), (mb, sb) = mean_std(variant), mean_std(baseline)
    delta = m - mb
    if math.isnan(s) or math.isnan(sb):
        return f"{delta:+.2f} (1 seed)"
    return f"{delta:+.2f} ({'outside' if abs(delta) > s + sb else 'within'} spread)"


def paired_difference(variant: dict[int, float], baseline: dict[int, float]) -> str:
    """``+0.42 ± 0.10 (outside spread, 3 seeds)``: the mean and sample std of the per-seed
    differences ``variant[seed] - baseline[seed]`` over the seeds both have, and whether the
    mean is larger than that std.

    A pipeline variant and its baseline at the same seed train the same epoch 1 (the same
    random plan, dropout and weights; only the refreshed epochs differ), so the per-seed
    difference removes what the seed does to every variant alike, which is most of the spread
    across seeds. Its own spread is then the spread that matters."""
    deltas = [variant[seed] - baseline[seed] for seed in sorted(variant) if seed in baseline]
    if not deltas:
        return "n/a"
    if len(deltas) == 1:
        return f"{deltas[0]:+.2f} (1 seed)"
    m, s = mean_std(deltas)
    return f"{m:+.2f} ± {s:.2f} ({'outside' if abs(m) > s else 'within'} spread, {len(deltas)} seeds)"


def variant_order(variant: str, baseline: str = BASELINE) -> tuple[int, str]:
    """The baseline first, then ``random-norefresh``, the samplers in the order of
    :data:`SAMPLERS` (each before its debiased forms), the triplet variants, anything else, the
    peers last."""
    if variant == baseline:
        return (0, variant)
    known = ["random-norefresh", *SAMPLERS, *TRIPLET_VARIANTS]
    if variant in PEERS:
        return (100 + list(PEERS).index(variant), variant)
    base = variant if variant in known else variant.partition("+")[0]
    return (1 + known.index(base) if base in known else 50, variant)


def mined_count(record: dict[str, Any]) -> float | None:
    """Anchors that got a mined negative: the peer's ``mined_anchors``, or the pipeline's
    ``mining/selected`` at its last refresh (None: no mining)."""
    if record.get("mined_anchors") is not None:
        return record["mined_anchors"]
    return (record.get("mining") or {}).get("mining/selected")


def batch_similarity(record: dict[str, Any]) -> float | None:
    """Mean cosine similarity of the in-batch pairs of the last refreshed plan, under the
    refresh model (``mining/batch_similarity_mean``; None: no refresh): how hard its batches were."""
    return (record.get("mining") or {}).get("mining/batch_similarity_mean")


def report(records: Iterable[dict[str, Any]]) -> str:
    """Markdown: per task (and rows, epochs), one row per variant with n seeds, mean ± std of
    each score and its difference to the task's baseline (``random``; ``given`` for ``snli``)
    at the same task, rows and epochs; triplet tasks also show the anchors with a mined negative,
    the others the in-batch similarity of the refreshed epoch's batches."""
    groups: dict[tuple[Any, ...], dict[str, list[dict[str, Any]]]] = {}
    for r in records:
        groups.setdefault((r["task"], r["max_rows"], r["epochs"]), {}).setdefault(r["variant"], []).append(r)
    if not groups:
        return "no results yet"
    out = []
    for (task, max_rows, epochs), by_variant in sorted(groups.items(), key=lambda kv: str(kv[0])):
        spec = TASKS.get(task)
        base, triplet = (spec.baseline, spec.triplet) if spec else (BASELINE, False)
        delta = f"Δ {base}"
        columns = ["variant", "n", "spearman", delta, "mrr@10", delta, "recall@1", delta]
        columns += ["mined" if triplet else "batch sim", "steps", "wall s"]
        rows = {r["rows"] for runs in by_variant.values() for r in runs}
        out += [
            f"### {task}: {max_rows or 'all'} rows ({', '.join(map(str, sorted(rows)))} trained), {epochs} epochs",
            "",
            "Final model (not the best epoch), dev set; mean ± sample std over seeds. Δ of a "
            f"pipeline variant: mean ± std over seeds of its score minus `{base}`'s at the same "
            "seed (both trained the same first epoch), 'outside spread' when the mean exceeds "
            f"that std; Δ of a peer: its mean minus `{base}`'s, 'outside spread' when that "
            "exceeds both std together."
            + (
                " mined: anchors with a mined negative (the pipeline's last refresh; the peer's "
                "one mining pass, whose other rows it leaves out)."
                if triplet
                else " batch sim: mean cosine similarity of in-batch pairs in the refreshed "
                "epoch's batches, under the refresh model (how hard the sampler made them)."
            ),
            "",
            "| " + " | ".join(columns) + " |",
            "|" + "---|" * len(columns),
        ]
        baseline = by_variant.get(base)
        for variant in sorted(by_variant, key=lambda v: variant_order(v, base)):
            runs = by_variant[variant]
            cells = [variant, str(len({r["seed"] for r in runs}))]
            for score in SCORES:
                m, s = mean_std([r[score] for r in runs])
                cells.append(f"{m:.2f}" + ("" if math.isnan(s) else f" ± {s:.2f}"))
                if baseline is None:
                    cells.append("n/a")
                elif variant == base:
                    cells.append("")
                elif variant in PEERS:  # its own trainer: nothing in common with the baseline's seeds
                    cells.append(difference([r[score] for r in runs], [r[score] for r in baseline]))
                else:
                    cells.append(
                        paired_difference(
                            {r["seed"]: r[score] for r in runs}, {r["seed"]: r[score] for r in baseline}
                        )
                    )
            if triplet:
                mined = [m for m in map(mined_count, runs) if m is not None]
                cells.append(f"{statistics.fmean(mined):.0f}" if mined else "")
            else:
                similarity = [m for m in map(batch_similarity, runs) if m is not None]
                cells.append(f"{statistics.fmean(similarity):.3f}" if similarity else "")
            cells.append("/".join(sorted({str(r["steps"]) for r in runs})))
            walls = [r["wall_seconds"] for r in runs if r.get("wall_seconds") is not None]
            cells.append(f"{statistics.fmean(walls):.0f}" if walls else "")
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    machines = sorted(
        {r.get("machine") or "unknown" for runs in groups.values() for v in runs.values() for r in v}
    )
    commits = sorted(
        {r.get("commit") or "unknown" for runs in groups.values() for v in runs.values() for r in v}
    )
    out.append(f"Machines: {'; '.join(machines)}. Commits: {', '.join(commits)}.")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--task", choices=sorted(TASKS), default="cnsd")
    parser.add_argument(
        "--variants",
        default=None,
        help="comma-separated (default: the task's; "
        + "; ".join(f"{name}: {spec.variants}" for name, spec in TASKS.items())
        + ")",
    )
    parser.add_argument("--seeds", default="1,2,3", help="comma-separated run.seed values (default: 1,2,3)")
    parser.add_argument("--max-rows", type=int, default=None, help="data.max_rows (default: the recipe's)")
    parser.add_argument(
        "--epochs", type=int, default=None, help="train.epochs (default: snli 2, the others the recipe's)"
    )
    parser.add_argument(
        "--results",
        default=str(BENCH_DIR.relative_to(REPO) / "results.jsonl"),
        help="JSON lines, one per finished run, appended (default: runs/hard-negatives/results.jsonl)",
    )
    parser.add_argument(
        "--experiment",
        default=EXPERIMENT,
        help=f"MLflow experiment of the pipeline runs (default: {EXPERIMENT}); a finished run of the "
        "same name there is read, not trained again",
    )
    parser.add_argument("--skip-done", action="store_true", help="skip runs already in --results")
    parser.add_argument("--keep-run-dirs", action="store_true", help="keep checkpoints and exported models")
    parser.add_argument(
        "--report", action="store_true", help="print the markdown table of --results and exit"
    )
    args = parser.parse_args(argv)
    if args.report:
        print(report(read_results(Path(args.results))))
        return 0
    return run_grid(args)


if __name__ == "__main__":
    sys.exit(main())
