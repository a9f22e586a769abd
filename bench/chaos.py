"""Chaos check (issue 37): the Twitter URL recipe, refreshed every epoch, with train workers and
the miner SIGKILLed at random moments, must end where an unkilled run with the same seed ends.

    python jobs/recipes/prepare.py --data ../shared/data        # once: the recipe's model link
    python -m bench.chaos --kills 5 --seed 1                    # about an hour on 2 cores
    python -m bench.chaos --mode node-loss --kills 3 --seed 1   # whole Ray nodes lost instead

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

``--mode node-loss`` runs both jobs on a local multi-node Ray cluster instead
(:mod:`bench.local_cluster`): a head with no CPUs (the driver's node, as on KubeRay) and two
worker nodes, one labelled ``role=trainer`` for the train workers and one ``role=miner`` for
the miner (``train.label_selector``, ``mining.label_selector``), checkpoints on a folder every
node sees (``run.storage_path``). A kill there loses a whole node, the one holding the drawn
victim: every process on it SIGKILLed at once, its raylet and object store with them, as a
preempted machine vanishes. A fresh node with the same label then joins, as an autoscaler
replaces it. The calm run uses the same cluster, and loses nothing.

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
from bench.local_cluster import RayHead, RayWorkerNode
from bench.running_job import RunningJob

RECIPE = str(REPO / "jobs/configs/recipe-twitter-url.yaml")
DATA = REPO.parent / "shared/data/twitter-url"
VICTIMS = ("RayTrainWorker", "HardNegativeMiner")
"""Process titles Ray gives a train worker and the miner actor."""
ROLES = {"RayTrainWorker": "trainer", "HardNegativeMinerActor": "miner"}
"""Node-loss mode: the label of the node that holds each victim (its actor class)."""
NODE_CPUS = 3
"""Logical CPUs of each worker node in node-loss mode: the recipe's worker or miner (2) and
the tokenizing tasks beside it."""


class NodeLossCluster:
    """The node-loss mode's cluster: a head without CPUs and one worker node per role in
    :data:`ROLES`; :meth:`lose_node_of` loses the node holding a victim and starts its
    replacement."""

    def __init__(self, root: Path):
        self.root = root
        self.head = RayHead(root / "ray", num_cpus=0)
        self.nodes: dict[str, RayWorkerNode] = {}
        self.started = 0
        for role in sorted(set(ROLES.values())):
            self._add(role)

    def _add(self, role: str) -> None:
        self.started += 1
        node = RayWorkerNode(self.head, f"{role}{self.started}", num_cpus=NODE_CPUS, labels={"role": role})
        self.nodes[role] = node

    def overrides(self) -> list[str]:
        return [
            f"run.storage_path={self.root / 'shared-storage'}",
            *(f"{key}.label_selector.role={ROLES[actor]}" for key, actor in
              (("train", "RayTrainWorker"), ("mining", "HardNegativeMinerActor"))),
        ]  # fmt: skip

    def env(self) -> dict[str, str]:
        return {"RAY_ADDRESS": self.head.address, "RAY_API_SERVER_ADDRESS": self.head.dashboard}

    def lose_node_of(self, actor_class: str) -> str | None:
        """Lose the node that holds a live ``actor_class`` actor, then add a fresh node with its
        label. Returns the lost node's name (None: no such actor alive now)."""
        if not self.head.alive_on(actor_class):
            return None
        role = ROLES[actor_class]
        lost = self.nodes[role]
        lost.lose()
        self._add(role)
        return lost.name

    def stop(self) -> None:
        for node in self.nodes.values():
            node.stop()
        self.head.stop()


def recipe_overrides(run_dir: Path, seed: int, checkpoint_every: int, kills: int) -> list[str]:
    return [
        f"run.name=chaos-s{seed}", f"run.seed={seed}", f"run.output_dir={run_dir}", "mining.refresh=every_epoch",
        "eval.retrieval=[]", f"checkpoint.every_steps={checkpoint_every}", f"train.max_failures={kills + 3}",
        f"tracking.uri=sqlite:///{run_dir / 'mlruns.db'}",
        f"model.name_or_path={REPO / 'runs/recipe-data/all-MiniLM-L6-v2'}",
        # The job runs in run_dir: the recipe's relative data paths, made absolute.
        f"data.path={DATA / 'train.tsv'}", f"data.pool={DATA / 'train.tsv'}",
    ]  # fmt: skip


def kill_a_process(job: RunningJob, rng: random.Random) -> dict | None:
    """SIGKILL one of the job's train workers or its miner, drawn; None when none runs now."""
    title = rng.choice(VICTIMS)
    candidates = job.processes(title)
    if not candidates:
        return None
    victim = rng.choice(candidates)
    victim.kill()
    return {"victim": title, "pid": victim.pid}


def run_job(
    run_dir: Path,
    *,
    overrides: list[str],
    kills: int,
    rng: random.Random,
    gaps: tuple[float, float],
    cluster: NodeLossCluster | None = None,
) -> tuple[int, list[dict], float]:
    """One job; ``kills`` faults at seeded random moments (none when 0): a process SIGKILLed,
    or with ``cluster`` the node of a drawn victim lost (the job joins that cluster). Returns
    its exit status, the faults and its wall seconds."""
    run_dir.mkdir(parents=True, exist_ok=True)
    job = RunningJob(run_dir, overrides, config=RECIPE, env=cluster.env() if cluster else None)
    landed: list[dict] = []
    try:
        while job.running() and len(landed) < kills:
            time.sleep(rng.uniform(*gaps))
            if not job.running():
                break
            if cluster is None:
                fault = kill_a_process(job, rng)
            else:
                victim = rng.choice(sorted(ROLES))
                lost = cluster.lose_node_of(victim)
                fault = {"victim": victim, "node": lost} if lost else None
            if fault is None:
                continue
            landed.append({"after_s": round(time.monotonic() - job.started, 1), **fault})
            print(f"[chaos] fault {len(landed)}: {fault} at {landed[-1]['after_s']}s", flush=True)
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
    parser.add_argument(
        "--mode", choices=("process", "node-loss"), default="process",
        help="kill a train worker or the miner (process), or lose the whole node that holds one (node-loss)",
    )  # fmt: skip
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
        cluster = NodeLossCluster(root / f"{name}-cluster") if args.mode == "node-loss" else None
        try:
            status, landed, wall = run_job(
                run_dir, overrides=overrides + (cluster.overrides() if cluster else []), kills=kills,
                rng=rng, gaps=(args.min_gap, args.max_gap), cluster=cluster,
            )  # fmt: skip
        finally:
            if cluster is not None:
                cluster.stop()
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
    print(
        "\nFaults: "
        + "; ".join(
            f"{k['victim']}'s node {k['node']} lost" if "node" in k else f"{k['victim']} killed"
            for k in results["chaos"]["kills"]
        )
        + (" (at " + ", ".join(f"{k['after_s']} s" for k in results["chaos"]["kills"]) + ")")
    )
    print(
        f"\n{'PASS' if passed else 'FAIL'}: chaos - calm = {difference:+.3f} nDCG@10 (tolerance {args.tolerance})"
    )
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
