"""SimCSE's InfoNCE loss and the cross-worker gather that makes its negatives global.

``simcse_loss`` is a public contract (see README): other code and users call it directly.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from pipeline.config.train_section import DIRECTIONS_RULE, INFONCE_DIRECTIONS, valid_directions


def simcse_loss(
    anchors: torch.Tensor,
    positives: torch.Tensor,
    temperature: float = 0.05,
    *,
    hard_negatives: torch.Tensor | None = None,
    hard_negative_weight: float = 0.0,
    hardness_strength: float = 0.0,
    row_ids: torch.Tensor | None = None,
    hard_negative_mask: torch.Tensor | None = None,
    false_negative_mask: torch.Tensor | None = None,
    directions: tuple[str, ...] = INFONCE_DIRECTIONS,
) -> torch.Tensor:
    """InfoNCE over cosine similarities, as in SimCSE.

    Args:
        anchors: ``(n, d)`` embeddings of the first view (or the anchor sentence).
        positives: ``(n, d)``; ``positives[i]`` is the positive of ``anchors[i]``.
        temperature: softmax temperature (> 0); SimCSE uses 0.05.
        hard_negatives: optional ``(n, d)``, or ``(n, m, d)`` for m per row;
            ``hard_negatives[i]`` are row i's own hard negatives, and every row's hard
            negatives are also candidates for every other row.
        hard_negative_weight: added to the logits (after dividing by the temperature) of
            row i's own hard negatives, SimCSE's formulation; 0.0 adds no extra weight.
        hardness_strength: ``alpha`` of hardness weighting (Lan et al. 2025, Eq. 5, on a row's
            own hard negatives as EmbeddingGemma applies it; sentence-transformers'
            ``hardness_mode="hard_negatives"``): ``alpha * stop_grad(cos(a_i, h_ik))`` is added
            to the logit of each of row i's own hard negatives (after dividing by the
            temperature), so a harder one weighs more in the softmax; 0.0: off.
        row_ids: optional ``(n,)`` integer corpus ids. Candidate ``positives[j]`` with
            ``row_ids[j] == row_ids[i]`` and ``j != i`` is masked out of row i's softmax, so a
            sentence that occurs twice in a batch is never its own negative.
        hard_negative_mask: optional ``(n, m)`` bool, False where a row has no negative in
            that slot (rows may have different numbers); absent slots are no candidate for
            any row.
        false_negative_mask: optional ``(n, n)`` bool over the in-batch candidates: True at
            (i, j) when ``positives[j]`` is a known positive of row i, removed from row i's
            softmax; hard-negative candidates are then unaffected. Or ``(n, n + n*m)`` with
            ``hard_negatives``, also covering them (column ``n + j*m + k``: row j's k-th hard
            negative), e.g. another row's negative that is a known positive of row i (the
            pairs task: :func:`pipeline.training.triplet_step.known_positive_candidates`).
            The diagonal (each row's own positive) is ignored. A constant: no gradient flows
            through it.
        directions: which interaction terms share row i's softmax (``train.directions``:
            :data:`~pipeline.config.train_section.CONTRASTIVE_DIRECTIONS`, joint
            partition: sentence-transformers' ``MultipleNegativesRankingLoss`` with these
            ``directions`` and ``partition_mode="joint"``): ``query_to_doc``, always, the
            candidates above; ``doc_to_query``, ``cos(p_i, a_j)`` for all j (the symmetric
            term); ``query_to_query``, ``cos(a_i, a_j)``, j != i; ``doc_to_doc``,
            ``cos(p_i, p_j)``, j != i, and ``cos(p_i, h_jk)``, j != i. All four are GTE's
            improved contrastive loss (Li et al. 2023). In the added terms a pair the masks
            relate is no negative: in-batch j is row i's *partner* when ``positives[j]`` is
            masked out of row i's candidates above (a ``row_ids`` duplicate or a known
            positive); ``doc_to_query`` leaves out the anchors j whose partner row i is,
            ``query_to_query`` and ``doc_to_doc`` the rows partnered either way, and
            ``doc_to_doc`` the hard negatives flagged for row i. Hardness and SimCSE's weight
            apply to ``query_to_doc`` alone, as in sentence-transformers.

    Returns:
        Scalar tensor: the mean over the n rows of ``-log softmax(logits_i)[i]`` where
        ``logits_i = [cos(a_i, p_j) / t for all j] ++ [cos(a_i, h_jk) / t for all j, k]``,
        without the candidates flagged for row i and the ``row_ids``-duplicates of row i
        (never ``j == i``), followed by the other ``directions``' terms.

    Raises:
        ValueError: a non-positive temperature, mismatched shapes or directions that break
            :data:`~pipeline.config.train_section.DIRECTIONS_RULE`.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if not valid_directions(directions):
        raise ValueError(f"directions {DIRECTIONS_RULE}, got {directions}")
    if anchors.shape != positives.shape:
        raise ValueError(f"anchors {tuple(anchors.shape)} and positives {tuple(positives.shape)} differ")
    n = anchors.shape[0]
    a = F.normalize(anchors.float(), dim=-1)
    p = F.normalize(positives.float(), dim=-1)
    logits = a @ p.T / temperature
    if row_ids is not None:
        same = row_ids.view(-1, 1) == row_ids.view(1, -1)
        same.fill_diagonal_(False)
        logits = logits.masked_fill(same, float("-inf"))
    flat = None
    if hard_negatives is not None:
        negatives = hard_negatives.unsqueeze(1) if hard_negatives.dim() == 2 else hard_negatives
        if negatives.shape[0] != n or negatives.shape[-1] != anchors.shape[-1]:
            raise ValueError(
                f"hard_negatives {tuple(hard_negatives.shape)} must be (n, d) or (n, m, d) "
                f"for anchors {tuple(anchors.shape)}"
            )
        m = negatives.shape[1]
        flat = F.normalize(negatives.float().reshape(n * m, -1), dim=-1)
        negative_cosines = a @ flat.T  # column j*m + k: row j's k-th negative
        negative_logits = negative_cosines / temperature
        if hard_negative_weight or hardness_strength:
            own = _own_negatives(n, m, a.device)
            # A row's own negatives: SimCSE's constant weight, and the hardness weight, which
            # grows with the cosine so the harder negatives take more of the softmax; detached,
            # it reweights the candidates without a gradient of its own.
            bonus = hard_negative_weight + hardness_strength * negative_cosines.detach()
            negative_logits = negative_logits + bonus * own
        if hard_negative_mask is not None:
            absent = ~hard_negative_mask.reshape(1, n * m).to(torch.bool)
            negative_logits = negative_logits.masked_fill(absent, float("-inf"))
        logits = torch.cat([logits, negative_logits], dim=1)
    if false_negative_mask is not None:
        logits = _without_false_negatives(logits, false_negative_mask)
    if set(directions) != {"query_to_doc"}:
        # What the masks took out of row i's query_to_doc softmax is -inf there: in-batch
        # partners and flagged hard negatives, never row i's own positive.
        removed = torch.isinf(logits.detach())
        logits = torch.cat(
            [logits, *_other_directions(a, p, flat, removed, directions=directions, temperature=temperature)],
            dim=1,
        )
    targets = torch.arange(n, device=anchors.device)
    return F.cross_entropy(logits, targets)


def _other_directions(
    a: torch.Tensor,
    p: torch.Tensor,
    negatives: torch.Tensor | None,
    removed: torch.Tensor,
    *,
    directions: tuple[str, ...],
    temperature: float,
) -> list[torch.Tensor]:
    """The logits of :func:`simcse_loss`'s terms other than ``query_to_doc``, row i's in row i.

    ``a``, ``p``: ``(n, d)`` unit anchors and positives; ``negatives``: ``(n*m, d)`` unit hard
    negatives or None; ``removed``: ``(n, n + n*m)`` bool, True where ``query_to_doc`` left
    the candidate out of row i's softmax."""
    n = a.shape[0]
    eye = torch.eye(n, dtype=torch.bool, device=a.device)
    partner = removed[:, :n]
    either = partner | partner.T
    terms = []
    if "query_to_query" in directions:
        terms.append((a @ a.T).masked_fill(eye | either, float("-inf")))
    if "doc_to_query" in directions:
        # Row i's document against every anchor, its own included (sentence-transformers' joint
        # softmax counts the positive pair there too); an anchor that row i's document is a known
        # positive of is no negative of it.
        terms.append((p @ a.T).masked_fill(partner.T, float("-inf")))
    if "doc_to_doc" in directions:
        terms.append((p @ p.T).masked_fill(eye | either, float("-inf")))
        if negatives is not None:
            own = _own_negatives(n, negatives.shape[0] // n, a.device)
            # A row's own negatives belong to its query, as in sentence-transformers; absent and
            # flagged ones are no candidates here either.
            terms.append((p @ negatives.T).masked_fill(own | removed[:, n:], float("-inf")))
    return [term / temperature for term in terms]


def _own_negatives(n: int, m: int, device: torch.device) -> torch.Tensor:
    """``(n, n*m)`` bool: True where hard-negative column ``j*m + k`` is row i's own (j == i)."""
    return torch.arange(n * m, device=device) // m == torch.arange(n, device=device)[:, None]


def _without_false_negatives(logits: torch.Tensor, false_negative_mask: torch.Tensor) -> torch.Tensor:
    """``(n, c)`` logits (in-batch candidates first) with the flagged candidates removed; an
    ``(n, n)`` mask leaves the hard-negative columns after the first ``n`` alone. See
    :func:`simcse_loss`."""
    n, c = logits.shape
    if tuple(false_negative_mask.shape) not in ((n, n), (n, c)):
        want = f"({n}, {n})" + (f" or ({n}, {c})" if c != n else "")
        raise ValueError(f"false_negative_mask {tuple(false_negative_mask.shape)} must be {want}")
    flagged = false_negative_mask.detach().to(device=logits.device, dtype=torch.bool)
    if flagged.shape[1] < c:
        flagged = torch.nn.functional.pad(flagged, (0, c - flagged.shape[1]))
    # The positive is never a negative, whatever the mask says.
    flagged = flagged & ~torch.eye(n, c, dtype=torch.bool, device=logits.device)
    # masked_fill passes no gradient to the filled entries: a removed candidate gets none.
    return logits.masked_fill(flagged, float("-inf"))


def gather_across_workers(local: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """Concatenate every worker's rows in rank order, keeping the gradient of this worker's.

    ``all_gather`` carries no gradient, so the gathered copy of this worker's own rows is
    replaced with ``local`` itself. Every worker then computes the loss on the whole global
    batch; each backpropagates through its own rows only, and DDP's gradient averaging turns
    the sum into ``1/world_size`` of the single-process gradient (the caller scales the loss
    by the world size to undo that).

    Args:
        local: ``(sizes[rank], ...)`` this worker's rows.
        sizes: rows held by each rank; they may differ by a few rows when the global batch
            does not divide evenly.

    Returns:
        ``(sum(sizes), ...)`` tensor, rank 0's rows first.
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return local
    rank = dist.get_rank()
    if local.shape[0] != sizes[rank]:
        raise ValueError(f"rank {rank} holds {local.shape[0]} rows, expected {sizes[rank]}")
    longest = max(sizes)
    padded = local.detach()
    if padded.shape[0] < longest:
        pad = padded.new_zeros((longest - padded.shape[0], *padded.shape[1:]))
        padded = torch.cat([padded, pad])
    buffers = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(buffers, padded.contiguous())
    parts = [buf[:size] for buf, size in zip(buffers, sizes, strict=True)]
    parts[rank] = local
    return torch.cat(parts)


def mean_over_ranks(local_sum: torch.Tensor, count: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean of terms every rank holds a share of: ``local_sum`` this rank's sum of them,
    ``count`` how many it holds.

    Returns:
        ``(mean, to_backward)``: the sum over every rank divided by the count over every rank
        (the same on every rank; 0 where there are no terms), and this rank's sum divided by
        that count times the world size, whose DDP-averaged gradient is the mean's whatever
        each rank's count (a mean of per-rank means would weigh a rank's few terms like
        another's many).
    """
    totals = torch.stack([local_sum.detach(), count.float()])
    world = 1
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        world = dist.get_world_size()
        dist.all_reduce(totals)
    total_count = totals[1].clamp(min=1.0)
    return totals[0] / total_count, local_sum / total_count * world


def global_batch_simcse_loss(
    local_view1: torch.Tensor,
    local_view2: torch.Tensor,
    sizes: list[int],
    global_row_ids: torch.Tensor | None,
    temperature: float,
    *,
    directions: tuple[str, ...] = INFONCE_DIRECTIONS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Unsupervised SimCSE loss over the global batch of all DDP workers.

    Args:
        local_view1, local_view2: ``(sizes[rank], d)`` this worker's two dropout views.
        sizes: rows per rank of this global batch.
        global_row_ids: ``(sum(sizes),)`` corpus ids of the global batch, rank order.
        temperature: InfoNCE temperature.
        directions: :func:`simcse_loss`'s terms, the first view as the anchor.

    Returns:
        ``(loss, loss_to_backward)``: the global-batch loss (the same value on every rank),
        and that loss times the world size, whose DDP-averaged gradient equals the gradient
        of one process computing ``loss`` on the concatenated batch.
    """
    views = gather_across_workers(torch.stack([local_view1, local_view2], dim=1), sizes)
    loss = simcse_loss(
        views[:, 0], views[:, 1], temperature=temperature, row_ids=global_row_ids, directions=directions
    )
    return loss, loss * len(sizes)
