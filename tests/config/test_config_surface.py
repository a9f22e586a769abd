"""The size of the configuration surface, and what an old config meets for a key that is gone."""

import pytest

from pipeline.config.loading import load_config
from pipeline.config.schema import REMOVED_KEYS, Config
from pipeline.core.errors import ConfigError

MOST_KEYS = 79
"""Issue 37's bound on the whole config (70), and issue 71's ``train.mlm_weight`` (SimCSE's
auxiliary objective, a loss option by request) and its teacher: ``mining.teacher.model``,
``mining.teacher.denoise_margin``, ``train.distill_weight`` and ``train.distill_loss``, the
levers its ablation turns, and ``mining.teacher.temperature``, the scale of a teacher's scores,
which a user's own cross-encoder sets (its default follows the kind; the teacher's kind and
pooling are its folder's, its text length and batch the run's); and ``train.mini_batch_size``,
activation memory traded for one more forward pass, which only the user can weigh (what else
shares the device, how large a batch and how many negatives they want), as sentence-transformers'
cached losses leave it to theirs; and ``train.hardness_strength``, the hardness weighting of
issue 71's table, which sentence-transformers' MNRL offers its users as ``hardness_strength``,
and ``train.directions``, the loss's terms (GTE's improved contrastive loss among them), which
it offers as ``directions``.
Knobs a measurement or the hardware decides are not keys."""


def test_the_whole_config_has_at_most_79_keys():
    keys = Config().flat()
    assert len(keys) <= MOST_KEYS, f"{len(keys)} config keys: {sorted(keys)}"


def test_no_removed_key_is_still_a_key():
    assert not set(REMOVED_KEYS) & set(Config().flat()), "a key is both live and listed as removed"


@pytest.mark.parametrize("key", sorted(REMOVED_KEYS))
def test_a_removed_key_stops_with_one_line_that_says_what_decides_it_now(key):
    with pytest.raises(ConfigError) as info:
        load_config(None, [f"{key}=1"])
    message = str(info.value)
    assert message.startswith(f"{key} is no longer a config key: "), message
    assert "\n" not in message and len(message) > len(f"{key} is no longer a config key: ") + 10


@pytest.mark.parametrize(
    ("task", "override", "owner"),
    [
        ("corpus", "data.anchor_column=query", "pairs"),
        ("corpus", "data.label_column=label", "pairs"),
        ("corpus", "train.hard_negative_weight=1.0", "pairs"),
        ("corpus", "train.hardness_strength=2.0", "pairs"),
        ("pairs", "mining.batch_sampler=knn", "corpus"),
    ],
)
def test_a_key_of_the_other_task_is_an_error_not_ignored(task, override, owner):
    with pytest.raises(ConfigError) as info:
        load_config(None, [f"task={task}", "data.path=rows.jsonl", override])
    key = override.split("=")[0]
    assert str(info.value) == f"{key} needs task: {owner} (this config's task is {task})"


def test_every_task_key_exists_and_the_params_leave_out_the_other_tasks_keys():
    from pipeline.config.params import params_in_effect
    from pipeline.config.schema import TASK_KEYS

    flat = Config().flat()
    assert all(key in flat for keys in TASK_KEYS.values() for key in keys)
    corpus = params_in_effect(
        load_config(None, ["train.epochs=2", "mining.batch_sampler=knn"])
    )  # the miner runs
    pairs_cfg = load_config(
        None, ["task=pairs", "data.path=rows.jsonl", "data.format=jsonl", "data.negative_column=neg"]
    )
    pairs = params_in_effect(pairs_cfg)
    assert not set(TASK_KEYS["pairs"]) & set(corpus) and set(TASK_KEYS["corpus"]) <= set(corpus)
    # Every pairs key that is set is a param (data.label_column and the teacher's keys are unset
    # here: no null is logged).
    set_pairs_keys = {k for k in TASK_KEYS["pairs"] if pairs_cfg.flat()[k] is not None}
    assert not set(TASK_KEYS["corpus"]) & set(pairs) and set_pairs_keys <= set(pairs)
    unset = {
        "data.label_column",
        "mining.teacher.model",
        "mining.teacher.denoise_margin",
        "mining.teacher.temperature",
    }
    assert set_pairs_keys == set(TASK_KEYS["pairs"]) - unset
