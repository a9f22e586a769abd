"""Screenshots of a finished run as a reviewer first meets it in MLflow's UI: its Overview,
Model metrics and Artifacts tabs (the refresh table open where the run mined), in headless
Chromium at 1440x900.

Serves the run's tracking store with ``mlflow ui`` on loopback (its own process, stopped at
the end) and drives Chromium through playwright::

    apt-get install chromium && pip install playwright        # once
    python -m bench.mlflow_screenshots --tracking-uri sqlite:///mlruns.db \\
        --experiment simcse-demo --run-name demo --out docs/img/mlflow --label demo

Writes ``<label>-overview.png``, ``<label>-model-metrics.png`` and ``<label>-artifacts.png``
under ``--out`` and prints a table of what each screen held. A check for people, not a test:
the images go into docs/mlflow.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from mlflow.tracking import MlflowClient

from pipeline.config.metric_catalogue import MINING_TABLE

VIEWPORT = {"width": 1440, "height": 900}
TABS = ("overview", "model-metrics", "artifacts")
"""The run page's tab routes, also the screenshots' names."""
SETTLE_MS = 3000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(tracking_uri: str, port: int, log: Path) -> subprocess.Popen:
    """``mlflow ui`` on loopback in its own process group (stopped by :func:`stop`)."""
    mlflow_cli = str(Path(sys.executable).with_name("mlflow"))
    proc = subprocess.Popen(
        [mlflow_cli, "ui", "--backend-store-uri", tracking_uri, "--host", "127.0.0.1", "--port", str(port)],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"mlflow ui exited ({proc.returncode}); see {log}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as reply:
                if reply.status == 200:
                    return proc
        except OSError:
            time.sleep(1)
    stop(proc)
    raise TimeoutError(f"mlflow ui not ready on port {port} after 120 s; see {log}")


def stop(proc: subprocess.Popen) -> None:
    """Stop the server this script started (its process group only)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def find_run(
    client: MlflowClient, experiment: str, run_name: str | None, run_id: str | None
) -> tuple[str, str]:
    if run_id:
        run = client.get_run(run_id)
        return run.info.experiment_id, run_id
    found = client.get_experiment_by_name(experiment)
    if found is None:
        raise SystemExit(f"no experiment {experiment!r} in the store")
    query = f"attributes.run_name = '{run_name}'" if run_name else ""
    runs = client.search_runs(
        [found.experiment_id], query, order_by=["attributes.start_time DESC"], max_results=1
    )
    if not runs:
        raise SystemExit(f"no run {run_name!r} in experiment {experiment!r}")
    return found.experiment_id, runs[0].info.run_id


def screenshot_run(
    base_url: str, experiment_id: str, run_id: str, *, out: Path, label: str, mined: bool
) -> list[tuple[str, str]]:
    """Write the screenshots; returns (file, what the screen was waited for) per screen."""
    from playwright.sync_api import sync_playwright

    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    ready = {
        "overview": "Description",
        "model-metrics": "Add chart",
        "artifacts": "diagnostic" if mined else "resolved_config.yaml",
    }
    shots = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        page = browser.new_page(viewport=VIEWPORT)
        for tab in TABS:
            route = f"{tab}/{MINING_TABLE}" if tab == "artifacts" and mined else tab
            # The run page in the UI's machine-learning mode, not its GenAI one.
            page.goto(
                f"{base_url}/#/experiments/{experiment_id}/runs/{run_id}/{route}?workflowType=machine_learning"
            )
            page.get_by_text(ready[tab]).first.wait_for(timeout=120_000)
            close = page.get_by_role("button", name="Close", exact=True)
            if close.count():  # the assistant side panel takes a third of the screen
                close.first.click()
            page.wait_for_timeout(SETTLE_MS)  # charts draw after their data arrives
            path = out / f"{label}-{tab}.png"
            page.screenshot(path=str(path))
            shots.append((path.name, ready[tab]))
        browser.close()
    return shots


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tracking-uri", required=True)
    parser.add_argument("--experiment", default="simcse-demo")
    parser.add_argument("--run-name")
    parser.add_argument("--run-id")
    parser.add_argument("--out", type=Path, default=Path("docs/img/mlflow"))
    parser.add_argument("--label", default="demo")
    args = parser.parse_args(argv)

    client = MlflowClient(tracking_uri=args.tracking_uri)
    experiment_id, run_id = find_run(client, args.experiment, args.run_name, args.run_id)
    mined = MINING_TABLE in {a.path for a in client.list_artifacts(run_id, MINING_TABLE.split("/")[0])}
    args.out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    server = serve(args.tracking_uri, port, Path(tempfile.gettempdir()) / f"mlflow-ui-{args.label}.log")
    try:
        shots = screenshot_run(
            f"http://127.0.0.1:{port}", experiment_id, run_id, out=args.out, label=args.label, mined=mined
        )
    finally:
        stop(server)
    run = client.get_run(run_id)
    print(
        f"run {run.info.run_name} ({run_id}): {len(run.data.params)} params, {len(run.data.metrics)} metrics"
    )
    print(f"| {'screenshot':<36} | waited for |")
    print(f"|{'-' * 38}|------------|")
    for name, title in shots:
        print(f"| {name:<36} | {title} |")


if __name__ == "__main__":
    main()
