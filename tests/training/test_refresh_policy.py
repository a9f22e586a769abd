"""The refresh rules on their own: when rank 0 submits a refresh and what each epoch boundary
does with it. Pure: no Ray, no torch.distributed, times passed in."""

from __future__ import annotations

import dataclasses

import pytest

from pipeline.config.loading import load_config
from pipeline.core.errors import UnrecoverableError
from pipeline.training.refresh_policy import BoundaryAction, RefreshPolicy, RefreshSettings

NUM_BATCHES = 10


def _settings(**changes) -> RefreshSettings:
    base = RefreshSettings(
        epochs=3, lead_steps=3, waits=False, timeout_s=60.0, max_restarts=2, seed=42, enabled=True
    )
    return dataclasses.replace(base, **changes)


SYNC = {"lead_steps": 0, "waits": True}
"""``mining.refresh: every_epoch``: submitted after the epoch's last step, waited for."""


def _policy(rank: int = 0, **changes) -> RefreshPolicy:
    return RefreshPolicy(_settings(**changes), rank)


def _never_called(ticket):
    raise AssertionError(f"finished({ticket!r}) asked where the policy must not ask it")


def _first_submit_step(policy: RefreshPolicy, epoch: int, num_batches: int = NUM_BATCHES) -> int | None:
    """The first ``steps_done`` (0 included, as the worker asks before the epoch's first step)
    at which the policy submits, or None."""
    for steps_done in range(num_batches + 1):
        if policy.submits_after_step(epoch, steps_done, num_batches):
            return steps_done
    return None


def test_settings_are_read_from_the_config_once():
    cfg = load_config(
        None,
        [
            "train.epochs=4", "run.seed=7", "mining.refresh=every_epoch_async", "mining.max_staleness_steps=5",
            "mining.timeout_s=12.5", "train.max_failures=2",
        ],
    )  # fmt: skip
    assert RefreshSettings.from_config(cfg) == RefreshSettings(
        epochs=4, lead_steps=5, waits=False, timeout_s=12.5, max_restarts=2, seed=7, enabled=True,
        at_boundaries=True, before_training=False,
    )  # fmt: skip
    sync = RefreshSettings.from_config(
        load_config(None, ["mining.refresh=every_epoch", "mining.max_staleness_steps=5"])
    )
    assert (sync.lead_steps, sync.waits) == (0, True)  # the staleness setting is async's alone


@pytest.mark.parametrize(
    ("mode", "refresh", "before", "boundaries"),
    [
        ("pairs", "every_epoch", True, True),
        ("pairs", "once", True, False),
        ("pairs", "never", False, False),
        ("corpus", "every_epoch", False, True),
        ("corpus", "never", False, False),
    ],
)
def test_refresh_modes_decide_when_the_miner_is_asked(mode, refresh, before, boundaries):
    cfg = load_config(
        None,
        [
            "train.epochs=3",
            "data.path=pairs.tsv",
            f"task={mode}",
            f"mining.refresh={refresh}",
        ],
    )
    policy = RefreshPolicy(RefreshSettings.from_config(cfg), rank=0)
    assert policy.mines_before_training(step=0) is before
    assert not policy.mines_before_training(step=5)  # a resumed run carries its plan
    assert [policy.asks_miner(epoch) for epoch in range(3)] == [boundaries, boundaries, False]
    # The actor is started exactly when something will ask it, even for a single epoch.
    assert cfg.runs_miner is (before or boundaries)
    single = load_config(
        None, ["train.epochs=1", "data.path=pairs.tsv", f"task={mode}", f"mining.refresh={refresh}"]
    )
    assert single.runs_miner is before


def test_unset_refresh_follows_the_measurements():
    """Pairs mine once (refreshing measured level with it, docs/results.md); a corpus refreshes
    its k-NN batches every epoch and runs no miner for random batches."""

    def resolved(*overrides: str) -> str:
        return load_config(None, ["data.path=pairs.tsv", *overrides]).refresh

    assert resolved("task=pairs") == "once"
    assert resolved("task=corpus", "mining.batch_sampler=knn") == "every_epoch"
    assert resolved("task=corpus", "mining.batch_sampler=random") == "never"
    assert resolved("task=pairs", "mining.refresh=every_epoch") == "every_epoch"


def test_refresh_once_is_for_pair_mode_only():
    from pipeline.core.errors import ConfigError

    with pytest.raises(ConfigError, match="mining.refresh"):
        load_config(None, ["mining.refresh=once"])


def test_async_submits_exactly_when_max_staleness_steps_remain_and_once_per_epoch():
    policy = _policy()
    assert _first_submit_step(policy, epoch=0) == NUM_BATCHES - 3
    policy.submitted(0, "ref-1", step=7, now=100.0)
    assert policy.pending is not None and policy.pending.snapshot_step == 7
    assert _first_submit_step(policy, epoch=0) is None  # one under way
    policy.adopted(step=10)
    assert _first_submit_step(policy, epoch=0) is None  # this epoch had its refresh
    assert _first_submit_step(policy, epoch=1) == NUM_BATCHES - 3


def test_async_staleness_longer_than_the_epoch_submits_before_its_first_step():
    policy = _policy(lead_steps=NUM_BATCHES + 5)
    assert _first_submit_step(policy, epoch=0) == 0


def test_a_run_resumed_past_the_submit_point_submits_at_once():
    # A fresh process (nothing pending, nothing submitted) resumed at batch 9 of 10.
    policy = _policy()
    assert policy.submits_after_step(0, steps_done=9, num_batches=NUM_BATCHES)


def test_sync_submits_after_the_last_step_and_waits_at_the_boundary():
    policy = _policy(**SYNC)
    assert _first_submit_step(policy, epoch=0) == NUM_BATCHES  # by the same rule as async, lead 0
    policy.submitted(0, "ref-1", step=10, now=0.0)
    # However long the miner takes, sync waits: neither late nor timed out here.
    assert policy.boundary_action(now=1e9, finished=_never_called) is BoundaryAction.WAIT
    assert policy.adopted(step=10) == 0  # mined from the boundary's own weights
    assert policy.pending is None


def test_sync_boundary_waits_even_with_nothing_submitted():
    # Resumed from a checkpoint written before the refresh came back: the boundary asks again.
    policy = _policy(**SYNC)
    assert policy.boundary_action(now=0.0, finished=_never_called) is BoundaryAction.WAIT
    assert policy.adopted(step=20) == 0


def test_no_refresh_after_the_last_epoch():
    for mode in ({}, SYNC):
        policy = _policy(**mode, epochs=3)
        assert policy.asks_miner(1)
        assert not policy.asks_miner(2)
        assert _first_submit_step(policy, epoch=2) is None


def test_only_rank_0_submits_but_every_rank_knows_the_boundary_asks():
    for mode in ({}, SYNC):
        policy = _policy(rank=1, **mode)
        assert policy.asks_miner(0)
        assert _first_submit_step(policy, epoch=0) is None


def test_mining_disabled_never_asks_the_miner():
    for mode in ({}, SYNC):
        policy = _policy(**mode, enabled=False)
        assert not any(policy.asks_miner(epoch) for epoch in range(3))
        assert _first_submit_step(policy, epoch=0) is None


def test_async_finished_refresh_is_adopted_with_its_staleness():
    policy = _policy()
    policy.submitted(0, "ref-1", step=7, now=100.0)
    asked = []
    action = policy.boundary_action(now=101.0, finished=lambda ticket: asked.append(ticket) or True)
    assert action is BoundaryAction.ADOPT and asked == ["ref-1"]
    assert policy.adopted(step=10) == 3
    assert policy.pending is None


def test_async_late_boundary_keeps_the_plan_and_adopts_it_next_boundary_with_larger_staleness():
    policy = _policy(epochs=4)
    policy.submitted(0, "ref-1", step=7, now=100.0)
    assert policy.boundary_action(now=110.0, finished=lambda _: False) is BoundaryAction.LATE
    assert policy.pending is not None  # still under way: kept for the next boundary
    # Epoch 1 trains on the kept plan; no second refresh while the first is under way.
    assert _first_submit_step(policy, epoch=1) is None
    assert policy.boundary_action(now=120.0, finished=lambda _: True) is BoundaryAction.ADOPT
    assert policy.adopted(step=20) == 13  # snapshot at step 7, adopted at step 20
    assert _first_submit_step(policy, epoch=2) == NUM_BATCHES - 3  # adopted: the next epoch refreshes again


def test_async_refresh_pending_longer_than_timeout_fails_naming_the_setting():
    policy = _policy(timeout_s=30.0)
    policy.submitted(0, "ref-1", step=7, now=100.0)
    assert policy.boundary_action(now=130.0, finished=lambda _: False) is BoundaryAction.LATE  # not over yet
    with pytest.raises(
        UnrecoverableError, match=r"^the miner did not return a plan within mining\.timeout_s=30s$"
    ):
        policy.boundary_action(now=130.5, finished=lambda _: False)


def test_async_timeout_does_not_apply_to_a_finished_refresh():
    policy = _policy(timeout_s=30.0)
    policy.submitted(0, "ref-1", step=7, now=100.0)
    assert policy.boundary_action(now=500.0, finished=lambda _: True) is BoundaryAction.ADOPT


def test_async_boundary_with_nothing_submitted_reshuffles_without_asking():
    policy = _policy()
    assert policy.boundary_action(now=0.0, finished=_never_called) is BoundaryAction.RESHUFFLE


def test_a_resubmitted_refresh_replaces_the_pending_one():
    # After a miner failure the refresh is submitted again from newer weights.
    policy = _policy()
    policy.submitted(0, "ref-1", step=7, now=100.0)
    policy.submitted(0, "ref-2", step=10, now=150.0)
    assert policy.pending is not None and policy.pending.ticket == "ref-2"
    assert policy.boundary_action(now=175.0, finished=lambda _: False) is BoundaryAction.LATE  # fresh clock
    assert policy.adopted(step=20) == 10


def test_reshuffle_seed_is_run_seed_plus_next_epoch():
    policy = _policy(seed=42)
    assert [policy.reshuffle_seed(epoch) for epoch in range(3)] == [43, 44, 45]


def test_the_async_boundary_seam_reads_ready_and_late_in_order_and_names_a_bad_word():
    from pipeline.core.seams import ASYNC_BOUNDARIES_ENV, scripted_boundaries

    assert scripted_boundaries(None) == [] and scripted_boundaries("") == []
    assert scripted_boundaries("ready, late,ready") == ["ready", "late", "ready"]
    with pytest.raises(ValueError, match=rf"^{ASYNC_BOUNDARIES_ENV}: expected ready or late, got soon$"):
        scripted_boundaries("ready,soon")
