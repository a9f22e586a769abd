"""Chaos check (issue 37): the Twitter URL recipe, refreshed every epoch, with train workers and
the miner SIGKILLed at random moments, must end where an unkilled run with the same seed ends.

    python jobs/recipes/prepare.py --data ../shared/data        # once: the recipe's model link
    python -m bench.chaos --kills 5 --seed 1                    # about an hour on 2 cores

Two ``jobs/train.py`` runs of ``jobs/configs/recipe-twitter-url.yaml`` with
``mining.refresh=every_epoch``, ``run.seed`` ``--seed``, evaluation off during training and
``checkpoint.every_steps`` ``--checkpoint-every`` (so that a kill loses a few steps, not an
epoch), in fresh folders:

- ``calm``: nothing is killed;
- ``chaos``: after a seeded random pause (``--min-gap`` to ``--max-gap`` seconds) one process is
  SIGKILLed, the victim drawn among the job's Ray Train workers and its miner actor, until
  ``--kills`` kills have landed (a draw that finds no such process waits for the next one).
  ``train.max_failures`` (the workers' and the miner's failure budget) is raised above
  ``--kills`` so that the job always resumes.

Both exported models are scored by the one evaluator of the bench
(``jobs/evaluate.py --retrieval <dev> --json``); the check passes when the dev nDCG@10 values
differ by at most ``--tolerance`` (0.05). It prints the kills (time, victim, pid) and both
scores as markdown for docs/benchmarks.md. A check, not a test: it takes an hour and its kill
times depend on the clock, on purpose.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import tempfile
import time
from pathlib import Path

from bench.common import REPO
from bench.hard_negatives import evaluator_command, retrieval_scores
from bench.running_job import RunningJob

RECIPE = str(REPO / "jobs/configs/recipe-twitter-url.yaml")
DATA = REPO.parent / "shared/data/twitter-url"
VICTIMS = ("RayTrainWorker", "HardNegativeMiner")
"""Process titles Ray gives a train worker and the miner actor."""


def recipe_overrides(run_dir: Path, seed: int, checkpoint_every: int, kills: int) -> list[str]:
    return [
        f"run.name=chaos-s{seed}", f"run.seed={seed}", f"run.output_dir={run_dir}", "mining.refresh=every_epoch",
        "eval.retrieval=[]", f"checkpoint.every_steps={checkpoint_every}", f"train.max_failures={kills + 3}",
        f"tracking.uri=sqlite:///{run_dir / 'mlruns.db'}",
        f"model.name_or_path={REPO / 'runs/recipe-data/all-MiniLM-L6-v2'}",
        # The job runs in run_dir: the recipe's relative data paths, made absolute.
        f"data.path={DATA / 'train.tsv'}", f"data.pool={DATA / 'train.tsv'}",
    ]  # fmt: skip


def run_job(
    run_dir: Path, *, overrides: list[str], kills: int, rng: random.Random, gaps: tuple[float, float]
) -> tuple[int, list[dict], float]:
    """One job; ``kills`` SIGKILLs at seeded random moments (none when 0). Returns its exit
    status, the kills and its wall seconds."""
    run_dir.mkdir(parents=True, exist_ok=True)
    job = RunningJob(run_dir, overrides, config=RECIPE)
    landed: list[dict] = []
    try:
        while job.running() and len(landed) < kills:
            time.sleep(rng.uniform(*gaps))
            title = rng.choice(VICTIMS)
            candidates = job.processes(title)
            if not candidates or not job.running():
                continue
            victim = rng.choice(candidates)
            victim.kill()
            landed.append(
                {"after_s": round(time.monotonic() - job.started, 1), "victim": title, "pid": victim.pid}
            )
            print(
                f"[chaos] kill {len(landed)}: {title} pid {victim.pid} at {landed[-1]['after_s']}s",
                flush=True,
            )
        status = job.wait(timeout=math.inf)
    finally:
        job.kill_all()
    (run_dir / "job.log").write_text(job.output)
    return status, landed, time.monotonic() - job.started


def score(model_dir: Path, dev: str) -> float:
    import subprocess

    out = subprocess.run(evaluator_command(model_dir, dev, 32), cwd=REPO, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"jobs/evaluate.py exited {out.returncode}: {out.stderr[-2000:]}")
    return retrieval_scores(out.stdout)["ndcg_at_10"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1, help="run.seed of both runs (and the kill draw)")
    parser.add_argument("--checkpoint-every", type=int, default=40, help="checkpoint.every_steps")
    parser.add_argument("--min-gap", type=float, default=60.0, help="shortest pause before a kill, s")
    parser.add_argument("--max-gap", type=float, default=300.0, help="longest pause before a kill, s")
    parser.add_argument("--dev", default=str(DATA / "dev"), help="the BEIR folder both models are scored on")
    parser.add_argument(
        "--tolerance", type=float, default=0.05, help="largest nDCG@10 difference that passes"
    )
    parser.add_argument("--workdir", default=None, help="where both runs go (default: a temporary folder)")
    args = parser.parse_args(argv)
    root = Path(args.workdir or tempfile.mkdtemp(prefix="chaos-"))
    rng = random.Random(args.seed)
    results = {}
    for name, kills in (("calm", 0), ("chaos", args.kills)):
        run_dir = root / name
        overrides = recipe_overrides(run_dir, args.seed, args.checkpoint_every, args.kills)
        status, landed, wall = run_job(
            run_dir, overrides=overrides, kills=kills, rng=rng, gaps=(args.min_gap, args.max_gap)
        )
        if status != 0:
            print(
                f"error: the {name} run exited {status}; its output: {run_dir / 'job.log'}", file=sys.stderr
            )
            return 1
        model = run_dir / f"chaos-s{args.seed}" / "model"
        results[name] = {"kills": landed, "wall_s": round(wall), "ndcg_at_10": score(model, args.dev)}
    difference = results["chaos"]["ndcg_at_10"] - results["calm"]["ndcg_at_10"]
    passed = abs(difference) <= args.tolerance
    print(json.dumps(results))
    print("\n| run | kills | wall s | dev nDCG@10 |\n|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {len(r['kills'])} | {r['wall_s']} | {r['ndcg_at_10']:.2f} |")
    print("\nKills: " + "; ".join(f"{k['victim']} at {k['after_s']} s" for k in results["chaos"]["kills"]))
    print(
        f"\n{'PASS' if passed else 'FAIL'}: chaos - calm = {difference:+.3f} nDCG@10 (tolerance {args.tolerance})"
    )
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
