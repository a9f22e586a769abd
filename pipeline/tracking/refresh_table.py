"""The run's per-refresh mining table, ``mining/refreshes.json``: every diagnostic of every
refresh, laid out to be read on one screen of MLflow's artifact view.

A refresh has some 25 diagnostics and a run a handful of refreshes, so the table is one row per
diagnostic and one column per refresh (a table of one row per refresh ran four screens wide).
Counts are kept exact; other values are rounded to 4 significant digits. The file is MLflow's
table format (``{"columns": [...], "data": [...]}``, with the ``mlflow.loggedArtifacts`` tag
that makes the UI draw it as a table), rewritten whole at each refresh from what the run
already holds, so a restarted miner keeps the rows its predecessor logged and an upload sent
twice adds nothing.
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path
from typing import Any

from mlflow.utils.mlflow_tags import MLFLOW_LOGGED_ARTIFACTS

from pipeline.config.metric_catalogue import CATALOGUE, MINING_TABLE, spec_for

_FOLDER, _FILE = MINING_TABLE.rsplit("/", 1)
SIGNIFICANT_DIGITS = 4
KEYS = ("step", "plan_version")
"""What names a refresh: its column header and its first two rows."""


def read_refresh_table(client: Any, run_id: str) -> list[dict[str, float]]:
    """The run's refreshes in step order: one dict per refresh, keyed like the miner's metrics
    without ``mining/`` (``total_s``, ``removed_known_positive`` ...) plus ``step``; a
    diagnostic a refresh did not have (``churn`` on the first) is left out of its dict. Empty
    when the run mined nothing."""
    if MINING_TABLE not in {a.path for a in client.list_artifacts(run_id, _FOLDER)}:
        return []
    with tempfile.TemporaryDirectory() as folder:
        table = json.loads(Path(client.download_artifacts(run_id, MINING_TABLE, folder)).read_text())
    refreshes: list[dict[str, float]] = [{} for _ in table["columns"][1:]]
    for name, *values in table["data"]:
        for refresh, value in zip(refreshes, values, strict=True):
            if value is not None:
                refresh[name] = float(value)
    return sorted(refreshes, key=lambda r: (r["step"], r["plan_version"]))


def add_refresh(client: Any, run_id: str, refresh: dict[str, float]) -> None:
    """Add one refresh (``step``, ``plan_version`` and its diagnostics) to the run's table; a
    refresh already there under the same step and version is replaced."""
    refreshes = {(r["step"], r["plan_version"]): r for r in read_refresh_table(client, run_id)}
    refreshes[(float(refresh["step"]), float(refresh["plan_version"]))] = refresh
    ordered = [refreshes[key] for key in sorted(refreshes)]
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / _FILE
        path.write_text(json.dumps(table_by_diagnostic(ordered), indent=1))
        client.log_artifact(run_id, str(path), _FOLDER)
    _mark_as_table(client, run_id)


def table_by_diagnostic(refreshes: list[dict[str, float]]) -> dict[str, list[Any]]:
    """MLflow's table format with one row per diagnostic and one column per refresh, headed by
    its version and step. ``step`` and ``plan_version`` come first, then the diagnostics in the
    metric catalogue's order (the charted ones, then the stage times, counts and similarities),
    so a reviewer reads the same rows in the same place in every run."""
    seen: list[str] = []
    for refresh in refreshes:
        seen += [name for name in refresh if name not in seen and name not in KEYS]
    names = [*KEYS, *sorted(seen, key=lambda name: (_catalogue_position(name), seen.index(name)))]
    columns = ["diagnostic"] + [f"v{int(r['plan_version'])} @ step {int(r['step'])}" for r in refreshes]
    data = [[name] + [_rounded(r.get(name)) for r in refreshes] for name in names]
    return {"columns": columns, "data": data}


def _catalogue_position(name: str) -> int:
    spec = spec_for(f"mining/{name}")
    return CATALOGUE.index(spec) if spec is not None else len(CATALOGUE)


def _rounded(value: float | None) -> float | int | None:
    if value is None or math.isnan(value):
        return None
    if float(value).is_integer():
        return int(value)
    return float(f"{value:.{SIGNIFICANT_DIGITS}g}")


def _mark_as_table(client: Any, run_id: str) -> None:
    """The tag MLflow's UI reads to draw a JSON artifact as a table (what ``log_table`` sets)."""
    logged = json.loads(client.get_run(run_id).data.tags.get(MLFLOW_LOGGED_ARTIFACTS, "[]"))
    entry = {"path": MINING_TABLE, "type": "table"}
    if entry not in logged:
        client.set_tag(run_id, MLFLOW_LOGGED_ARTIFACTS, json.dumps([*logged, entry]))
