"""Weight-space ensembling of fine-tuned models with the model they started from (WiSE-FT,
Wortsman et al. 2022, arXiv 2109.01903; FlagEmbedding's LM-Cocktail merges an embedding model
with its base the same way): each floating weight becomes ``(1 - w) * fine_tuned + w * start``
for each ``w`` of ``--start-weights``, and every merged model is scored on the retrieval sets.

A cheap probe, no training: each fine-tuned model is compared with itself merged, so the
difference is paired within one run and the seed spread of training does not enter it. Where
a merge lifts every model given (several seeds), it is a lever worth a key; one run alone
decides nothing.

    python -m bench.weight_merge --start runs/recipe-data/all-MiniLM-L6-v2 \\
        --models RUN1/model,RUN2/model --start-weights 0,0.1,0.2,0.3 \\
        --retrieval ../shared/data/twitter-url/dev-distractors --max-seq-len 32 \\
        [--results bench/results/twitter-url-weight-merge.jsonl]

Prints one row per (model, weight) and, for each weight, the mean and sample std over the
models of its nDCG@10 minus the unmerged model's (weight 0, scored in the same run). Model
folders are the pipeline's exports or any Hugging Face folder with ``model.safetensors``; the
two must share every weight's name and shape.
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from bench.common import argument_parser, read_json_lines

WEIGHTS_FILE = "model.safetensors"


def merged_state(
    fine_tuned: dict[str, torch.Tensor], start: dict[str, torch.Tensor], start_weight: float
) -> dict[str, torch.Tensor]:
    """``(1 - start_weight) * fine_tuned + start_weight * start`` for every floating tensor, in
    float32 and cast back to the fine-tuned tensor's dtype; integer buffers (BERT's
    ``position_ids``, which older transformers saved and newer ones do not) are the fine-tuned
    model's, or left out where it has none. Raises ``ValueError`` naming the first weight only
    one side has, or whose shapes differ."""
    if not 0.0 <= start_weight <= 1.0:
        raise ValueError(f"start weight {start_weight}: must be within [0, 1]")
    for name in sorted(set(fine_tuned) ^ set(start)):
        side, tensor = ("fine-tuned", fine_tuned[name]) if name in fine_tuned else ("start", start[name])
        if tensor.is_floating_point():
            raise ValueError(f"weight {name!r} is only in the {side} model: not the same architecture")
    merged = {}
    for name, tuned in fine_tuned.items():
        if not tuned.is_floating_point():
            merged[name] = tuned.clone()
            continue
        if tuned.shape != start[name].shape:
            raise ValueError(
                f"weight {name!r}: shape {tuple(tuned.shape)} against {tuple(start[name].shape)}"
            )
        blend = torch.lerp(tuned.float(), start[name].float(), start_weight)
        merged[name] = blend.to(tuned.dtype)
    return merged


def write_merged_dir(fine_tuned_dir: Path, start_dir: Path, start_weight: float, out_dir: Path) -> Path:
    """A copy of ``fine_tuned_dir`` (tokenizer, pooling, config) at ``out_dir`` whose
    ``model.safetensors`` holds :func:`merged_state`."""
    tuned_file, start_file = fine_tuned_dir / WEIGHTS_FILE, start_dir / WEIGHTS_FILE
    for path in (tuned_file, start_file):
        if not path.is_file():
            raise FileNotFoundError(f"no {WEIGHTS_FILE} in {path.parent}")
    shutil.copytree(fine_tuned_dir, out_dir)
    merged = merged_state(load_file(tuned_file), load_file(start_file), start_weight)
    save_file(merged, out_dir / WEIGHTS_FILE, metadata={"format": "pt"})
    return out_dir


def weight_deltas(rows: list[dict]) -> dict[float, tuple[float, float, int]]:
    """For each start weight, the mean, sample std (0 for one model) and count over models of
    ``ndcg_at_10`` minus the same model's at weight 0."""
    unmerged = {row["model"]: row["ndcg_at_10"] for row in rows if row["start_weight"] == 0.0}
    deltas: dict[float, list[float]] = {}
    for row in rows:
        if row["start_weight"] != 0.0 and row["model"] in unmerged:
            deltas.setdefault(row["start_weight"], []).append(row["ndcg_at_10"] - unmerged[row["model"]])
    return {
        weight: (statistics.fmean(d), statistics.stdev(d) if len(d) > 1 else 0.0, len(d))
        for weight, d in sorted(deltas.items())
    }


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(__spec__.name, __doc__, whole_doc=True)
    parser.add_argument("--start", required=True, type=Path, help="the model folder the runs started from")
    parser.add_argument("--models", required=True, help="comma-separated fine-tuned model folders")
    parser.add_argument("--start-weights", default="0,0.1,0.2,0.3", help="comma-separated w in [0, 1]")
    parser.add_argument("--retrieval", required=True, help="the BEIR folder (or pair file) scored")
    parser.add_argument(
        "--max-seq-len", type=int, default=None, help="tokens per text (default: the folder's)"
    )
    parser.add_argument(
        "--results",
        type=Path,
        default=None,
        help="JSON lines, one a (model, weight), appended; a (model, weight) already there for the "
        "same start and set is read, not scored again",
    )
    args = parser.parse_args(argv)
    weights = sorted({float(w) for w in args.start_weights.split(",")} | {0.0})
    models = [Path(m) for m in args.models.split(",") if m]

    # Deferred: --help answers before torch's evaluation stack is imported.
    from pipeline.evaluation.retrieval_scoring import evaluate_retrieval_model_dir
    from pipeline.model.folders import quiet_libraries

    quiet_libraries()
    done = {
        (row["model"], row["start_weight"]): row
        for row in (read_json_lines(args.results, missing_ok=True) if args.results else [])
        if row["start"] == str(args.start) and row["path"] == args.retrieval
    }
    rows = []
    print(f"{'model':<60} {'w':>5} {'nDCG@10':>8} {'MRR@10':>7} {'R@10':>6} {'R@100':>6}")
    for model in models:
        for weight in weights:
            row = done.get((str(model), weight))
            if row is None:
                with tempfile.TemporaryDirectory(prefix="weight-merge-") as tmp:
                    folder = (
                        model
                        if weight == 0.0
                        else write_merged_dir(model, args.start, weight, Path(tmp) / "m")
                    )
                    (score,) = evaluate_retrieval_model_dir(
                        folder, [args.retrieval], max_seq_len=args.max_seq_len
                    )
                row = {
                    "model": str(model),
                    "start": str(args.start),
                    "start_weight": weight,
                    **score.as_dict(),
                }
                if args.results:
                    with args.results.open("a") as out:
                        out.write(json.dumps(row) + "\n")
            rows.append(row)
            print(
                f"{str(model)[-60:]:<60} {weight:>5.2f} {row['ndcg_at_10']:>8.2f} {row['mrr_at_10']:>7.2f} "
                f"{row['recall_at_10']:>6.2f} {row['recall_at_100']:>6.2f}",
                flush=True,
            )
    print(f"\n{'w':>5} {'nDCG@10 minus unmerged, mean ± sd':>36} {'models':>7}")
    for weight, (mean, spread, count) in weight_deltas(rows).items():
        print(f"{weight:>5.2f} {f'{mean:+.2f} ± {spread:.2f}':>36} {count:>7}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
