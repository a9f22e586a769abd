"""The plain-text tables ``jobs/evaluate.py`` prints (STS files, retrieval sets)."""

from __future__ import annotations


def text_table(header: list[str], body: list[list[str]], title: str | None = None) -> str:
    """Left-aligned columns as wide as their widest cell, a rule under the header, the title
    (if any) on top."""
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
    lines = [title] if title else []
    lines.append("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in body]
    return "\n".join(lines)
