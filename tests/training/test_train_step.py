"""The importable train step (pipeline/training/step.py) on one process, against hand computations.

The unsupervised step must be InfoNCE over the two dropout views of the rows (a sentence
that occurs twice is not its own negative); the triplet step must use exactly the given and
mined negatives that are present; and the config picks the step.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_losses import _numpy_infonce

from pipeline.config.loading import load_config
from pipeline.data.tokenized import TokenizedCorpus
from pipeline.data.triplets import Triplets
from pipeline.model.accel import native_bf16
from pipeline.model.encoder import load_sentence_encoder
from pipeline.model.folders import load_tokenizer
from pipeline.training.global_batch import GlobalBatch
from pipeline.training.losses import simcse_loss
from pipeline.training.step import OptimizerStep, make_train_step
from pipeline.training.triplet_step import TripletStep
from pipeline.training.unsupervised_step import UnsupervisedStep, two_views

CPU = torch.device("cpu")
TRIPLET = ["task=pairs", "data.path=rows.jsonl"]


@pytest.fixture(scope="module")
def corpus(tiny_model_dir, tokenized_corpus):
    table, _ = tokenized_corpus
    return TokenizedCorpus(table, load_tokenizer(tiny_model_dir).pad_token_id)


@pytest.fixture
def model(tiny_model_dir):
    return load_sentence_encoder(tiny_model_dir, pooler="mean", dropout=0.1)


def _embed(model, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(ids), torch.from_numpy(mask)).numpy().astype(np.float64)


def test_unsupervised_step_is_infonce_over_two_dropout_views(model, corpus):
    step = make_train_step(load_config(None, ["train.temperature=0.05"]), corpus, None, CPU, bf16=False)
    rows = np.array([5, 17, 5, 40, 99, 3])  # row 5 twice: the same sentence, not its own negative
    model.train()
    torch.manual_seed(1)
    loss, to_backward = step(model, GlobalBatch(rows, [len(rows)], 0), np.random.default_rng(0))
    assert to_backward.requires_grad and to_backward.item() == loss.item()  # one worker: no scaling

    # By hand: the rows twice in one forward pass, the same dropout masks (same seed, same
    # input), then InfoNCE over cosine similarities in float64.
    ids, mask = corpus.batch(rows)
    torch.manual_seed(1)
    embeddings = _embed(model, np.concatenate([ids, ids]), np.concatenate([mask, mask]))
    view1, view2 = embeddings[: len(rows)], embeddings[len(rows) :]
    assert not np.allclose(view1, view2)  # dropout made two different views
    a = view1 / np.linalg.norm(view1, axis=1, keepdims=True)
    p = view2 / np.linalg.norm(view2, axis=1, keepdims=True)
    logits = a @ p.T / 0.05
    row_ids = corpus.ids[rows]
    same = (row_ids[:, None] == row_ids[None, :]) & ~np.eye(len(rows), dtype=bool)
    logits[same] = -np.inf
    top = logits.max(axis=1)
    log_softmax = logits - (top + np.log(np.exp(logits - top[:, None]).sum(axis=1)))[:, None]
    assert loss.item() == pytest.approx(-np.diag(log_softmax).mean(), rel=1e-5)
    assert loss.item() == pytest.approx(_numpy_infonce(view1, view2, 0.05, ids=row_ids), rel=1e-5)


def test_unsupervised_step_takes_the_configs_directions_with_the_first_view_as_anchor(model, corpus):
    """``train.directions`` in the corpus task: the symmetric term over the two views, a
    duplicated sentence still no negative of itself (the loss is checked against
    sentence-transformers and a written-out reference in test_losses)."""
    override = ["train.temperature=0.05", "train.directions=[query_to_doc,doc_to_query]"]
    step = make_train_step(load_config(None, override), corpus, None, CPU, bf16=False)
    rows = np.array([5, 17, 5, 40, 99, 3])
    model.train()
    torch.manual_seed(1)
    loss, _ = step(model, GlobalBatch(rows, [len(rows)], 0), np.random.default_rng(0))
    ids, mask = corpus.batch(rows)
    torch.manual_seed(1)
    embeddings = torch.tensor(_embed(model, np.concatenate([ids, ids]), np.concatenate([mask, mask])))
    views, row_ids = embeddings.split(len(rows)), torch.from_numpy(corpus.ids[rows])
    symmetric = simcse_loss(*views, 0.05, row_ids=row_ids, directions=("query_to_doc", "doc_to_query"))
    assert loss.item() == pytest.approx(symmetric.item(), rel=1e-5)
    assert loss.item() != pytest.approx(simcse_loss(*views, 0.05, row_ids=row_ids).item(), rel=1e-3)


def test_unsupervised_step_repeats_words_in_the_second_view(model, corpus):
    step = UnsupervisedStep(corpus, temperature=0.05, dup_rate=0.32, device=CPU, bf16=False)
    rows = np.arange(8)
    model.train()
    torch.manual_seed(2)
    loss, _ = step(model, GlobalBatch(rows, [len(rows)], 0), np.random.default_rng(7))

    ids, mask = two_views(corpus, rows, 0.32, np.random.default_rng(7))
    n = len(rows)
    assert mask[n:].sum() > mask[:n].sum()  # the second view is longer: words were repeated
    torch.manual_seed(2)
    embeddings = torch.from_numpy(_embed(model, ids, mask))
    expected = simcse_loss(embeddings[:n], embeddings[n:], 0.05, row_ids=torch.from_numpy(corpus.ids[rows]))
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)


def test_triplet_step_uses_exactly_the_present_given_and_mined_negatives(model, corpus):
    cfg = load_config(None, [*TRIPLET, "train.temperature=0.05", "train.hard_negative_weight=0.5"])
    # Rows 0 and 3 share a positive text: neither is the other's negative.
    triplets = Triplets(
        anchor=np.array([0, 1, 2, 3]), positive=np.array([4, 5, 6, 4]), negative=np.array([7, -1, 8, -1])
    )
    mined = np.array([[9, -1], [-1, -1], [10, 11], [12, -1]])
    step = make_train_step(cfg, corpus, triplets, CPU, bf16=False)
    model.eval()  # no dropout: each text has one embedding, however it is batched
    rows = np.arange(4)
    loss, _ = step(model, GlobalBatch(rows, [4], 0, mined), np.random.default_rng(0))

    def embed_one(text: int) -> np.ndarray:
        ids, mask = corpus.batch(np.array([text]))  # alone: no padding
        return _embed(model, ids, mask)[0]

    slots = np.concatenate([triplets.negative[:, None], mined], axis=1)
    present = slots >= 0
    negatives = np.zeros((4, 3, model.encoder.config.hidden_size))
    for i, k in zip(*np.nonzero(present), strict=True):
        negatives[i, k] = embed_one(slots[i, k])
    anchors = np.stack([embed_one(t) for t in triplets.anchor])
    positives = np.stack([embed_one(t) for t in triplets.positive])
    expected = _numpy_infonce(
        anchors, positives, 0.05, h=negatives, w=0.5, ids=corpus.ids[triplets.positive], present=present
    )
    assert loss.item() == pytest.approx(expected, rel=1e-4)

    # Absent slots are no candidates: all-absent mined negatives change nothing.
    without_mined, _ = step(model, GlobalBatch(rows, [4], 0, None), np.random.default_rng(0))
    all_absent, _ = step(model, GlobalBatch(rows, [4], 0, np.full((4, 2), -1)), np.random.default_rng(0))
    assert all_absent.item() == pytest.approx(without_mined.item(), rel=1e-6)
    assert abs(without_mined.item() - loss.item()) > 1e-3


@pytest.mark.parametrize(
    ("override", "loss_settings"),
    [
        ("train.hardness_strength=2.0", {"hardness_strength": 2.0}),
        (
            "train.directions=[query_to_doc,query_to_query,doc_to_query,doc_to_doc]",
            {"directions": ("query_to_doc", "query_to_query", "doc_to_query", "doc_to_doc")},
        ),
    ],
)
def test_triplet_step_passes_the_loss_settings_through(model, corpus, override, loss_settings):
    """``train.hardness_strength`` and ``train.directions`` reach the loss: the step's loss is
    :func:`simcse_loss` (checked against sentence-transformers' MNRL in test_losses) with that
    setting on each text's own embedding, and not the loss without it."""
    base = [*TRIPLET, "train.temperature=0.05"]
    triplets = Triplets(
        anchor=np.array([0, 1, 2]), positive=np.array([4, 5, 6]), negative=np.array([-1, -1, -1])
    )
    mined = np.array([[9, 8], [10, -1], [11, 12]])
    model.eval()
    batch = GlobalBatch(np.arange(3), [3], 0, mined)
    weighted, _ = make_train_step(load_config(None, [*base, override]), corpus, triplets, CPU,
                                  bf16=False)(model, batch, None)  # fmt: skip
    plain, _ = make_train_step(load_config(None, base), corpus, triplets, CPU, bf16=False)(model, batch, None)

    def embedded(texts: np.ndarray) -> torch.Tensor:
        rows = [
            _embed(model, *corpus.batch(np.array([t])))[0]
            if t >= 0
            else np.zeros(model.encoder.config.hidden_size)
            for t in texts.ravel()
        ]
        return torch.tensor(np.stack(rows), dtype=torch.float32).reshape(*texts.shape, -1)

    slots = np.concatenate([triplets.negative[:, None], mined], axis=1)
    expected = simcse_loss(
        embedded(triplets.anchor), embedded(triplets.positive), 0.05, hard_negatives=embedded(slots),
        hard_negative_mask=torch.from_numpy(slots >= 0), **loss_settings,
    )  # fmt: skip
    assert weighted.item() == pytest.approx(expected.item(), rel=1e-4)
    assert abs(weighted.item() - plain.item()) > 1e-4


def test_triplet_step_pads_anchors_apart_from_positives_and_negatives(model, corpus):
    """Short queries are not padded to the longest document (sentence-transformers pads each
    column on its own): the encoder sees the anchors at their own longest width."""
    cfg = load_config(None, TRIPLET)
    by_length = np.argsort(corpus.lengths, kind="stable")
    short, long = by_length[:4], by_length[-8:]
    assert corpus.lengths[short].max() < corpus.lengths[long].min()
    triplets = Triplets(anchor=short, positive=long[:4], negative=np.array([long[4], -1, long[5], -1]))
    widths: list[tuple[int, int]] = []

    def recording(input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        widths.append(tuple(input_ids.shape))
        return model(input_ids, mask)

    step = make_train_step(cfg, corpus, triplets, CPU)
    step(recording, GlobalBatch(np.arange(4), [4], 0, np.array([[long[6]], [-1], [-1], [long[7]]])))
    documents = np.concatenate([long[:4], long[[4, 6, 5, 7]]])
    assert widths == [
        (4, int(corpus.lengths[short].max())),
        (len(documents), int(corpus.lengths[documents].max())),
    ]


@pytest.mark.parametrize("task", ["corpus", "pairs"])
def test_steps_run_the_forward_pass_in_bf16_where_the_cpu_computes_it_natively(model, corpus, task):
    """bf16 autocast moves a batch's loss by bf16 rounding, not more, and leaves the loss and
    the gradients fp32; the job's default (``bf16=None``) is bf16 exactly where the device
    computes it natively (this test runs on CPUs with and without)."""
    triplets = Triplets(
        anchor=np.array([0, 1, 2]), positive=np.array([3, 4, 5]), negative=np.array([6, -1, 7])
    )
    cfg = load_config(None, TRIPLET if task == "pairs" else [])
    dtypes: list[torch.dtype] = []
    hook = model.encoder.encoder.layer[0].attention.self.query.register_forward_hook(
        lambda _module, _inputs, output: dtypes.append(output.dtype)
    )
    model.eval()
    losses, seen = {}, {}
    for bf16 in (False, True, None):
        step = make_train_step(cfg, corpus, triplets if task == "pairs" else None, CPU, bf16=bf16)
        dtypes.clear()
        model.zero_grad()
        loss, to_backward = step(model, GlobalBatch(np.arange(3), [3], 0), np.random.default_rng(0))
        to_backward.backward()
        assert loss.dtype == torch.float32
        assert all(p.grad.dtype == torch.float32 for p in model.parameters() if p.requires_grad)
        losses[bf16], seen[bf16] = loss.item(), set(dtypes)
    hook.remove()
    assert seen[False] == {torch.float32} and seen[True] == {torch.bfloat16}
    assert seen[None] == seen[native_bf16(CPU)]
    assert losses[True] == pytest.approx(losses[False], rel=0.05) and losses[True] != losses[False]


def test_the_config_picks_the_step(corpus):
    triplets = Triplets(anchor=np.array([0, 1]), positive=np.array([2, 3]), negative=np.array([-1, 4]))

    unsupervised = make_train_step(
        load_config(None, ["train.temperature=0.1", "train.dup_rate=0.2"]), corpus, None, CPU
    )
    assert isinstance(unsupervised, UnsupervisedStep)
    assert (unsupervised.temperature, unsupervised.dup_rate) == (0.1, 0.2)

    cfg = load_config(None, [*TRIPLET, "train.temperature=0.1", "train.hard_negative_weight=0.5"])
    triplet = make_train_step(cfg, corpus, triplets, CPU)
    assert isinstance(triplet, TripletStep)
    assert (triplet.temperature, triplet.hard_negative_weight) == (0.1, 0.5)
    assert triplet.triplets is triplets

    with pytest.raises(ValueError, match="needs the triplet rows"):
        make_train_step(cfg, corpus, None, CPU)
    with pytest.raises(ValueError, match="task: corpus"):
        make_train_step(load_config(None, []), corpus, triplets, CPU)


def test_optimizer_step_clips_the_fresh_gradient_then_steps_optimizer_and_schedule():
    """Gradients from an earlier step are dropped, the new one is clipped to the norm before
    SGD applies it, and the schedule moves once per step."""
    weight = torch.nn.Parameter(torch.zeros(2))
    model = torch.nn.Module()
    model.weight = weight
    optimizer = torch.optim.SGD([weight], lr=1.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    step = OptimizerStep(model, optimizer, scheduler, max_grad_norm=1.0)
    weight.grad = torch.full((2,), 100.0)  # stale: must not add to the next gradient
    step((weight * torch.tensor([3.0, 4.0])).sum())  # gradient (3, 4): norm 5, clipped to 1
    torch.testing.assert_close(weight.detach(), torch.tensor([-0.6, -0.8]))
    assert scheduler.get_last_lr() == [0.5]


class _RecordedMetrics:
    """Rank 0's metric logger, as far as a train step uses it."""

    def __init__(self):
        self.logged: list[dict] = []

    def log(self, metrics: dict, step: int) -> None:
        self.logged.append(metrics)

    def flush(self) -> None:
        pass


def _single_worker(cfg, model, corpus, state, *, logger, peak_tflops):
    """A rank-0 SimCSEWorker of one, outside Ray: plain SGD at a constant rate, no miner,
    evaluator or checkpoint store."""
    from pipeline.training.worker import SimCSEWorker
    from pipeline.training.worker_setup import WorkerParts

    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    return SimCSEWorker(
        WorkerParts(
            cfg=cfg, rank=0, world=1, model=model, ddp_model=model, train_step=make_train_step(cfg, corpus, None, CPU),
            optimizer=optimizer, scheduler=scheduler, state=state, share=corpus, device=CPU,
            refresher=None, evaluator=None, checkpoints=None, logger=logger, peak_tflops=peak_tflops,
        )
    )  # fmt: skip


def test_worker_logs_tokens_per_second_and_mfu_of_the_rows_it_encoded(model, corpus):
    """train/tokens_per_s counts both views' real tokens (from the corpus's own lengths), and
    train/mfu is the model FLOPs of those tokens at the batch's width over the device's peak."""
    from pipeline.batching.samplers import random_plan
    from pipeline.model.flops import EncoderFlops
    from pipeline.training.state import TrainState

    cfg = load_config(None, ["train.batch_size=8"])
    plan = random_plan(len(corpus.lengths), 8, seed=3)
    metrics = _RecordedMetrics()
    worker = _single_worker(
        cfg, model, corpus, TrainState(plan=plan.share(world=1, rank=0)), logger=metrics, peak_tflops=0.5
    )
    worker.train_batch(0)
    (logged,) = metrics.logged
    rows = plan.batch(0)
    tokens = 2 * int(corpus.lengths[rows].sum())
    seconds = len(rows) / logged["train/sentences_per_s"]
    assert logged["train/tokens_per_s"] * seconds == pytest.approx(tokens, rel=1e-9)
    flops = EncoderFlops.of(model).training_flops(tokens, int(corpus.lengths[rows].max()))
    assert logged["train/mfu"] * 0.5e12 * seconds == pytest.approx(flops, rel=1e-9)

    worker.peak_tflops = None  # what a worker on a device without a known peak gets (a CPU)
    worker.train_batch(1)
    assert "train/mfu" not in metrics.logged[-1] and metrics.logged[-1]["train/tokens_per_s"] > 0


def test_a_mid_epoch_checkpoint_counts_in_neither_the_epoch_seconds_nor_the_progress_rate(model, corpus):
    """On a GPU machine BERT-base's mid-epoch checkpoint took 30 s, and the progress line after
    it printed 0 sentences/s: the epoch's timer had restarted before the checkpoint ran. The
    checkpoint must carry the epoch's seconds up to it, and both timers go on from its end."""
    import time

    from pipeline.batching.samplers import random_plan
    from pipeline.training.state import TrainState

    cfg = load_config(None, ["train.batch_size=8", "checkpoint.every_steps=2"])
    state = TrainState(plan=random_plan(len(corpus.lengths), 8, seed=3).share(world=1, rank=0))
    worker = _single_worker(cfg, model, corpus, state, logger=None, peak_tflops=None)
    worker.start_segment(0)  # what run_epoch does at the epoch's start
    epoch_start = worker.segment_start
    worker.train_batch(0)
    worker.train_batch(1)
    saved: dict[str, float] = {}

    def checkpoint(epoch: float, augment_rng) -> None:  # stands in for the Ray Train report
        saved["epoch_seconds"] = state.epoch_seconds
        saved["ended"] = time.perf_counter()

    worker.checkpoint = checkpoint
    worker.maybe_checkpoint(0)
    assert "ended" in saved, "step 2 of checkpoint.every_steps=2 did not checkpoint"
    assert 0 < saved["epoch_seconds"] <= saved["ended"] - epoch_start
    assert state.epoch_seconds == saved["epoch_seconds"]  # the checkpoint's own time not added
    assert worker.segment_start >= saved["ended"] and worker.progress.last >= saved["ended"]
    assert worker.segment_first_batch == 2


@pytest.mark.parametrize("pairs, unit", [(False, "sentences"), (True, "rows")])
def test_progress_line_rate_counts_only_the_steps_since_its_timer_restarted(capsys, monkeypatch, pairs, unit):
    """A mid-epoch checkpoint restarts the progress timer (checkpoint time is not training
    time); the rate printed after it must count only the steps since then. A pairs row is
    2 + k texts, so its rate is named rows, not sentences."""
    import re
    import time

    import pipeline.training.worker_reports as reports
    from pipeline.batching.samplers import random_plan
    from pipeline.training.state import TrainState

    monkeypatch.setattr(reports, "PROGRESS_EVERY_S", -1.0)
    state = TrainState(plan=random_plan(400, 8, seed=3))
    state.batches_done, state.loss_sum = 30, 30.0
    # The epoch started at batch 0; a checkpoint at batch 10 restarted the timer 2 s ago.
    reports.ProgressLine(epochs=1, batch_size=8, pairs=pairs).maybe_print(
        0, state, 10, time.perf_counter() - 2.0
    )
    rate = float(re.search(rf"([\d.]+) {unit}/s$", capsys.readouterr().out.strip()).group(1))
    assert rate == pytest.approx(20 * 8 / 2.0, rel=0.05)  # not 30 steps' worth


def test_epoch_line_says_what_the_refresh_changed_and_when_the_model_barely_moved():
    """Issue 38 item 4: each adopted refresh's line gives the share of negatives it replaced
    (``mining/churn``), and says so when the model has barely moved since the last mining."""
    import pipeline.training.worker_reports as reports
    from pipeline.batching.samplers import random_plan
    from pipeline.training.refresh_policy import Boundary

    plan, next_plan = random_plan(64, 8, seed=1), random_plan(64, 8, seed=2, version=2)
    pairs = reports.ProgressLine(epochs=3, batch_size=8, pairs=True)
    moved = pairs.epoch_line(
        0, 0.5, plan=plan, seconds=1.0, next_plan=next_plan, boundary=Boundary(churn=0.49)
    )
    assert moved.endswith("; the refresh changed 49% of the rows' mined negatives")
    still = pairs.epoch_line(
        0, 0.5, plan=plan, seconds=1.0, next_plan=next_plan, boundary=Boundary(churn=0.01)
    )
    assert "changed 1% of the rows' mined negatives (the model barely moved" in still
    corpus = reports.ProgressLine(epochs=3, batch_size=8)
    assert corpus.epoch_line(
        0, 0.5, plan=plan, seconds=1.0, next_plan=next_plan, boundary=Boundary(churn=0.3)
    ).endswith("; the refresh changed 30% of the plan's batches")
    # The first mining has nothing to compare with: no note.
    assert "refresh changed" not in pairs.epoch_line(
        0, 0.5, plan=plan, seconds=1.0, next_plan=next_plan, boundary=Boundary()
    )


@pytest.mark.parametrize("kind", ["kl", "margin_mse"])
@pytest.mark.parametrize("teacher_temperature", [None, 2.0])
def test_triplet_step_adds_the_weighted_distillation_of_the_teachers_scores(
    model, corpus, kind, teacher_temperature
):
    """InfoNCE + ``train.distill_weight`` x the distillation term, computed here in numpy from
    each text's own embedding: the student's cosines of each anchor with its positive and its
    present mined negatives against the teacher's scores of the same pairs, read as logits at
    ``mining.teacher.temperature`` (unset: the student's)."""
    base = [*TRIPLET, "train.temperature=0.05", "mining.teacher.model=teacher"]
    if teacher_temperature is not None:
        base.append(f"mining.teacher.temperature={teacher_temperature}")
    t_teacher = teacher_temperature or 0.05
    triplets = Triplets(
        anchor=np.array([0, 1, 2]), positive=np.array([4, 5, 6]), negative=np.array([7, -1, -1])
    )
    mined = np.array([[9, -1], [10, 11], [-1, -1]])
    teacher = np.array([[0.9, 0.4, np.nan], [0.8, 0.7, 0.1], [0.6, np.nan, np.nan]], dtype=np.float32)
    weighted = make_train_step(
        load_config(None, [*base, "train.distill_weight=2.0", f"train.distill_loss={kind}"]), corpus, triplets, CPU,
        bf16=False,
    )  # fmt: skip
    plain = make_train_step(load_config(None, base), corpus, triplets, CPU, bf16=False)
    model.eval()
    rows = np.arange(3)
    batch = GlobalBatch(rows, [3], 0, mined, teacher)
    loss, to_backward = weighted(model, batch, None)
    infonce, _ = plain(model, batch, None)  # no weight: the teacher's scores are not read
    assert to_backward.item() == pytest.approx(loss.item(), rel=1e-6)  # one worker: no scaling

    def unit(text: int) -> np.ndarray:
        ids, mask = corpus.batch(np.array([text]))
        vector = _embed(model, ids, mask)[0]
        return vector / np.linalg.norm(vector)

    terms = []
    for i, row in enumerate(rows):
        anchor = unit(triplets.anchor[row])
        slots = [triplets.positive[row], *[t for t in mined[row] if t >= 0]]
        student = np.array([anchor @ unit(t) for t in slots])
        scores = teacher[i, : len(slots)].astype(np.float64)
        if len(slots) == 1:
            continue  # no negative: no term (kl: the row is not counted; margin_mse: no margin)
        if kind == "kl":
            p = np.exp(scores / t_teacher) / np.exp(scores / t_teacher).sum()
            log_q = student / 0.05 - np.log(np.exp(student / 0.05).sum())
            terms.append((p * (np.log(p) - log_q)).sum())
        else:  # the teacher's margins on the student's scale
            margins = (scores[0] - scores[1:]) * 0.05 / t_teacher
            terms += list(((student[0] - student[1:]) - margins) ** 2)
    assert loss.item() == pytest.approx(infonce.item() + 2.0 * np.mean(terms), rel=1e-4)
    assert abs(loss.item() - infonce.item()) > 1e-6
