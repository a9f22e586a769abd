"""Config loading: defaults, YAML, --set overrides, and errors that name the key."""

from __future__ import annotations

import subprocess

import pytest
import yaml
from conftest import PYTHON, REPO, run_script_in_process

from bench.common import job_env
from pipeline.config.loading import load_config
from pipeline.core.errors import ConfigError


def test_demo_config_loads_with_overrides():
    cfg = load_config(
        REPO / "jobs/configs/demo.yaml",
        ["train.epochs=5", "train.lr=1e-4", "run.name=abc", "mining.refresh=never"],
    )
    assert cfg.train.epochs == 5 and cfg.train.lr == pytest.approx(1e-4)
    assert cfg.run.name == "abc" and cfg.mines is False
    assert cfg.model.pooler == "mean"
    flat = cfg.flat()
    assert flat["train.temperature"] == 0.05 and flat["data.generated.num_groups"] == 400


def test_defaults_follow_simcse():
    cfg = load_config(None)
    assert cfg.train.temperature == 0.05 and cfg.data.max_seq_len == 32 and cfg.model.dropout == 0.1
    assert cfg.model.pooler is None and cfg.model.mlp is None  # the folder's pooling; a head with cls


@pytest.mark.parametrize(
    "override,key",
    [
        ("train.temprature=0.1", "train.temprature"),
        ("trainer.epochs=1", "trainer"),
        ("train.epochs=two", "train.epochs"),
        ("train.epochs=1.5", "train.epochs"),
        ("train.gpus_per_worker=maybe", "train.gpus_per_worker"),
        ("train.temperature=0", "train.temperature"),
        ("train.temperature=-0.05", "train.temperature"),
        ("model.pooler=max", "model.pooler"),
        ("train.batch_size=5000", "train.batch_size"),
        ("train.num_workers=0", "train.num_workers"),
        ("model.dropout=1.5", "model.dropout"),
        ("train.compile=fast", "train.compile"),
        ("train.compile=true", "train.compile"),  # the mode is the value now
        ("run.name=a/b", "run.name"),
        ("train.label_selector=gpu", "train.label_selector"),  # a mapping of labels
        ("mining.label_selector.role=3", "mining.label_selector.role"),  # values are strings
        ("train.directions=[doc_to_query]", "train.directions"),  # InfoNCE's own term is kept
        ("train.directions=[query_to_doc,docs_to_query]", "train.directions"),
        ("train.directions=[query_to_doc,query_to_doc]", "train.directions"),
    ],
)
def test_bad_values_name_the_key(override, key):
    with pytest.raises(ConfigError) as info:
        load_config(REPO / "jobs/configs/demo.yaml", [override])
    assert key in str(info.value)


def test_yaml_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  epochs: 2\n  batch_sise: 8\n")
    with pytest.raises(ConfigError, match="train.batch_sise"):
        load_config(bad)
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml")
    bad.write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(bad)


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--set", "train.temperature=-1"], "train.temperature must be > 0"),
        (["--set", "train.bogus=1"], "unknown config key 'train.bogus'"),
        (
            ["--set", "mining.negative_mode=triplet"],
            "mining.negative_mode is no longer a config key: write `task: pairs`",
        ),
        (
            ["--set", "mining.debias=threshold"],
            "mining.debias is no longer a config key: in-batch debiasing was removed",
        ),
        (
            ["--set", "mining.batch_sampler=rwr"],
            "mining.batch_sampler must be one of random, knn (got 'rwr')",
        ),
        (["--set", "task=triplets"], "task must be one of corpus, pairs"),
        (["--set", "train.epochs=abc"], "train.epochs must be an integer"),
        (["--set", "eval.sts=/nonexistent/dev.csv"], "STS file not found: /nonexistent/dev.csv"),
        (["--set", "eval.sts=[1]"], "eval.sts[0] must be a string"),
        (["--set", "eval.whitening=true"], "eval.whitening is no longer a config key: training fits"),
        (["--set", "data.path=/nonexistent/corpus.txt"], "data.path: /nonexistent/corpus.txt does not exist"),
    ],
)
def test_cli_fails_fast_with_one_line(tmp_path, capfd, monkeypatch, args, needle):
    """jobs/train.py's main() here (each case as a process of its own would pay the imports
    again); the command itself: the next test."""
    proc = run_script_in_process(
        "jobs/train.py", ["--config", str(REPO / "jobs/configs/demo.yaml"), *args],
        cwd=tmp_path, capfd=capfd, monkeypatch=monkeypatch,
    )  # fmt: skip
    _assert_failed_fast(proc, tmp_path, needle)


def test_the_command_fails_fast_with_one_line(tmp_path):
    """The same as a user meets it: a process of its own, where a library's import-time
    warning would show too."""
    proc = subprocess.run(
        [PYTHON, str(REPO / "jobs/train.py"), "--config", str(REPO / "jobs/configs/demo.yaml"),
         "--set", "data.path=/nonexistent/corpus.txt"],
        cwd=tmp_path, env=job_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    _assert_failed_fast(proc, tmp_path, "data.path: /nonexistent/corpus.txt does not exist")


def _assert_failed_fast(proc: subprocess.CompletedProcess, tmp_path, needle: str) -> None:
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.strip() and "mlflow" not in line.lower()]
    assert lines == [f"error: {lines[0][7:]}"] and needle in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "runs").exists()  # nothing started, nothing written


def test_the_task_is_named_at_the_top_and_an_old_config_says_what_to_write(tmp_path):
    assert load_config(None).task == "corpus"
    pairs = load_config(None, ["task=pairs", "data.path=pairs.jsonl"])
    assert pairs.pairs and pairs.range_min == 0 and pairs.mines_before_training
    assert load_config(None).range_min == 10  # a corpus's nearest rows are mostly paraphrases
    old = tmp_path / "old.yaml"
    old.write_text("data:\n  path: pairs.jsonl\nmining:\n  negative_mode: triplet\n")
    with pytest.raises(ConfigError) as info:
        load_config(old)
    assert "task: pairs" in str(info.value) and "\n" not in str(info.value)
    # Keys of one task name the task they need.
    for override in ("mining.random_negatives=1", "mining.refresh=once"):
        with pytest.raises(ConfigError, match="needs task: pairs"):
            load_config(None, [override])
    with pytest.raises(ConfigError, match="task: pairs needs data.path"):
        load_config(None, ["task=pairs"])


REMOVED_DEBIAS = "in-batch debiasing was removed"
REMOVED_SAMPLERS = "the rwr, clusters and mixed samplers were removed"


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        ("debias", "threshold", REMOVED_DEBIAS),
        ("debias_threshold", 0.8, REMOVED_DEBIAS),
        ("debias_weight", 0.0, REMOVED_DEBIAS),
        ("restart_probability", 0.2, REMOVED_SAMPLERS),
        ("num_clusters", 40, REMOVED_SAMPLERS),
        ("clusters_per_batch", 4, REMOVED_SAMPLERS),
        ("mixed_share", 0.5, REMOVED_SAMPLERS),
        ("mixed_group_size", 4, REMOVED_SAMPLERS),
    ],
)
def test_an_old_config_with_a_removed_sampler_or_debias_key_says_to_delete_it(tmp_path, key, value, why):
    old = tmp_path / "old.yaml"
    old.write_text(f"mining:\n  batch_sampler: knn\n  {key}: {value}\n")
    with pytest.raises(ConfigError) as info:
        load_config(old)
    message = str(info.value)
    assert message.startswith(f"mining.{key} is no longer a config key: {why}") and "\n" not in message
    assert "docs/results.md" in message and message.endswith("delete the key")


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("train.use_gpu", True, "train.gpus_per_worker > 0"),
        ("train.peak_tflops", 989, "datasheet peak"),
        ("train.compile_mode", "max-autotune", "write the mode as train.compile"),
        ("train.length_group_batches", 8, "50 batches"),
        ("model.tiny", {"hidden_size": 32}, "one fixed shape"),
        ("mining.enabled", False, "mining.refresh: never"),
        ("mining.mode", "async", "mining.refresh: every_epoch_async"),
        ("mining.flat_max_rows", 2000000, "mining.index"),
        ("mining.nlist", 100, "mining.index"),
        ("mining.nprobe", 8, "mining.index"),
        ("mining.pq_m", 8, "mining.index"),
        ("mining.encode_batch_size", 1024, "the device decides it"),
        ("eval.batch_size", 256, "the device decides it"),
        ("mining.encode_num_cpus", 2, "mining.num_cpus"),
        ("mining.encode_num_gpus", 1, "mining.num_gpus"),
        ("mining.start_timeout_s", 1800, "train.placement_timeout_s"),
        ("mining.max_restarts", 5, "train.max_failures"),
        ("ray.progress_bars", True, "--debug"),
        ("ray.train_log_level", "INFO", "--debug"),
        ("ray.dashboard_host", "0.0.0.0", "ray start --head --dashboard-host"),
        ("ray.connect_timeout_s", 2, "30 s"),
        ("tracking.connect_timeout_s", 2, "15 s"),
        ("tracking.flush_every_s", 1, "5 s"),
        ("tracking.drain_timeout_s", 0, "300 s"),
        ("tracking.system_metrics_interval_s", 1, "10 s"),
        ("data.tokenize_batch_size", 4096, "fixed 1024 rows"),
        ("data.tokenize_actors", 4, "the cluster's CPUs"),
        ("data.generated.group_size", 4, "4 sentences"),
        ("data.generated.seed", 1, "fixed (seed 0)"),
        ("data.pool_text_column", "doc", "data.text_column"),
        ("eval.format", "stsb", "name and first line"),
        ("eval.whitening", True, "jobs/evaluate.py --whiten-on"),
        ("eval.whitening_dim", 256, "--whitening-dim"),
        ("eval.whitening_rows", 3072, "--whitening-rows"),
        ("eval.positive_threshold", 4.0, "0.8 x its file's gold scale"),
    ],
)
def test_an_old_config_with_a_key_the_hardware_or_a_measurement_decides_says_what_does(
    tmp_path, key, value, says
):
    """Written in a file as an old config carries it (every removed key also stops a --set:
    tests/config/test_config_surface.py)."""
    tree = value
    for part in reversed(key.split(".")):
        tree = {part: tree}
    old = tmp_path / "old.yaml"
    old.write_text(yaml.safe_dump(tree))
    with pytest.raises(ConfigError) as info:
        load_config(old)
    message = str(info.value)
    assert (
        message.startswith(f"{key} is no longer a config key: ") and says in message and "\n" not in message
    )


def test_compile_takes_its_mode_and_off_even_as_yaml_reads_it(tmp_path):
    assert load_config(None).train.compile == "off"
    # YAML 1.1 reads an unquoted off as false, in a file and in --set alike.
    assert load_config(None, ["train.compile=off"]).train.compile == "off"
    written = tmp_path / "compile.yaml"
    written.write_text("train:\n  compile: off\n")
    assert load_config(written).train.compile == "off"
    assert load_config(None, ["train.compile=reduce-overhead"]).train.compile == "reduce-overhead"
    with pytest.raises(ConfigError, match=r"^train\.compile must be one of off, default, reduce-overhead, "):
        load_config(None, ["train.compile=true"])  # the old switch: the message lists what to write


@pytest.mark.parametrize("sampler", ["rwr", "clusters", "mixed"])
def test_a_removed_sampler_names_the_samplers_there_are(tmp_path, sampler):
    old = tmp_path / "old.yaml"
    old.write_text(f"mining:\n  batch_sampler: {sampler}\n")
    with pytest.raises(ConfigError) as info:
        load_config(old)
    assert str(info.value) == f"mining.batch_sampler must be one of random, knn (got '{sampler}')"


def test_config_defaults_are_the_index_defaults():
    from pipeline.mining.hard_negatives import SearchSettings

    assert SearchSettings.from_config(load_config(None)) == SearchSettings()


def test_params_leave_out_what_a_setting_turns_off():
    from pipeline.config.params import RULES, params_in_effect

    demo = "jobs/configs/demo.yaml"
    cpu = params_in_effect(load_config(REPO / demo))
    off = params_in_effect(load_config(REPO / demo, ["mining.refresh=never"]))
    assert [k for k in off if k.startswith("mining.")] == ["mining.refresh"]
    # What is left is the config's own values, unchanged; what the task resolves, as resolved.
    demo_cfg = load_config(REPO / demo)
    flat = demo_cfg.flat()
    assert flat["mining.refresh"] is None and flat["mining.range_min"] is None
    assert cpu["mining.refresh"] == demo_cfg.refresh == "every_epoch" and cpu["mining.range_min"] == 10
    resolved = {"mining.refresh", "mining.range_min", "model.name_or_path"}
    assert all(flat[k] == v for k, v in cpu.items() if k not in resolved) and "mining.batch_sampler" in cpu
    assert cpu["model.name_or_path"] == "a tiny BERT (random weights)"  # never a null
    pairs_cfg = load_config(REPO / "jobs/configs/recipe-twitter-url.yaml")
    pairs = params_in_effect(pairs_cfg)
    # A headerless pairs_tsv file has no columns to name.
    assert pairs_cfg.data.format == "pairs_tsv" and "data.anchor_column" not in pairs
    assert "data.text_column" not in pairs
    jsonl = params_in_effect(load_config(None, ["task=pairs", "data.path=rows.jsonl", "data.format=jsonl"]))
    assert jsonl["data.anchor_column"] == "anchor" and "data.text_column" not in jsonl
    csv_pool = ["data.pool=pool.csv", "data.pool_format=csv"]
    assert "data.text_column" in params_in_effect(
        load_config(REPO / "jobs/configs/recipe-twitter-url.yaml", csv_pool)
    )
    assert "mining.batch_sampler" not in pairs  # pairs keep their rows in random batches
    assert "mining.max_staleness_steps" not in pairs  # refresh: once mines before epoch 1 only, and waits
    # A rule naming a key that does not exist would silently keep what it meant to leave out.
    for key, _ in RULES:
        assert any(k == key or (key.endswith(".") and k.startswith(key)) for k in flat), key


def test_params_are_what_shaped_the_model_with_no_null_and_at_most_40():
    """Issue 39: a reviewer reads the settings that change the model. Infrastructure
    (resources, timeouts, storage, logging, how files are read) is in resolved_config.yaml
    only; unset values, the generated data's knobs on a real file and evaluation knobs
    without an evaluation are left out."""
    from pipeline.config.params import INFRASTRUCTURE, params_in_effect

    demo = load_config(REPO / "jobs/configs/demo.yaml", ["eval.sts=[g.tsv]", "eval.select_by=sts_g_spearman"])
    recipe = load_config(
        REPO / "jobs/configs/recipe-twitter-url.yaml", ["eval.select_by=retrieval_dev_ndcg_at_10"]
    )
    for cfg, generated in ((demo, True), (recipe, False)):
        params = params_in_effect(cfg, generated_data=generated)
        # The job adds four data/ params (rows, texts, truncated and [UNK] shares).
        assert len(params) + 4 <= 40, sorted(params)
        assert all(v is not None and v != [] for v in params.values()), params
        infrastructure = [
            k for k in params if any(k == i or (i.endswith(".") and k.startswith(i)) for i in INFRASTRUCTURE)
        ]
        assert not infrastructure
        assert any(k.startswith("data.generated.") for k in params) is generated
    assert "eval.patience" not in params_in_effect(load_config(None))  # nothing evaluated


def test_label_selectors_load_key_by_key_or_whole_and_are_not_params():
    """``--set train.label_selector.<label>=<value>`` adds one label to the selector, a YAML
    mapping sets it whole; where a stage runs is no param of the model it trains."""
    from pipeline.config.params import params_in_effect

    cfg = load_config(
        REPO / "jobs/configs/demo.yaml",
        ["train.label_selector.ray.io/node-group=gpu", "mining.label_selector={role: miner, zone: '!spot'}"],
    )
    assert cfg.train.label_selector == {"ray.io/node-group": "gpu"}
    assert cfg.mining.label_selector == {"role": "miner", "zone": "!spot"}
    assert load_config(REPO / "jobs/configs/demo.yaml").train.label_selector == {}
    assert not [key for key in params_in_effect(cfg) if "label_selector" in key]
