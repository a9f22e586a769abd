"""Evaluation sets name their metric keys and table rows (``eval/sts_<name>_spearman``,
``eval/retrieval_<name>_ndcg_at_10``): one rule keeps those names distinct, for STS files and
retrieval sets alike."""

from __future__ import annotations

from typing import Protocol, TypeVar


class Named(Protocol):
    name: str


SetT = TypeVar("SetT", bound=Named)


def with_distinct_names(sets: list[SetT]) -> list[SetT]:
    """The sets, a repeated name getting a numeric suffix (``dev``, ``dev_2``), in place."""
    seen: dict[str, int] = {}
    for item in sets:
        count = seen.get(item.name, 0)
        seen[item.name] = count + 1
        if count:
            item.name = f"{item.name}_{count + 1}"
    return sets
