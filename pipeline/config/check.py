"""The shape of a section's validation rules, shared by every section module and
:meth:`pipeline.config.schema.Config.validate`."""

from __future__ import annotations

Check = tuple[str, bool, str]
"""One validation rule of a section: ``(dotted key, holds, what the value must be)``;
:meth:`pipeline.config.schema.Config.validate` raises for the first that does not hold."""
