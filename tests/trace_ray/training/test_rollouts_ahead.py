"""Bounded staleness without Ray: which rollouts a batch may hold, and the batches played ahead of the update."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from tests.trace_ray.training.test_grpo_iteration import grpo, result
from trace_ray.training.groups import training_rows
from trace_ray.training.grpo_iteration import TrainState, collect_groups
from trace_ray.training.rollouts_ahead import BatchSource
from trace_ray.training.staleness import staleness_counts, within_bound


def sampled(seed: int, reward: float, version: int):
    return dataclasses.replace(result(seed, reward), adapter=("cap", version))


def test_a_group_with_any_rollout_past_the_bound_is_dropped_whole_and_counted():
    fresh = [sampled(1, 1.0, 4), sampled(1, 0.0, 3)]  # trained version 4: staleness 0 and 1
    stale = [sampled(2, 1.0, 4), sampled(2, 0.0, 2)]  # one rollout 2 versions old
    kept, dropped = within_bound([fresh, stale], trained_version=4, max_staleness=1)
    assert kept == [fresh] and dropped == 2
    assert within_bound([fresh, stale], 4, 2) == ([fresh, stale], 0)
    assert within_bound([fresh], 4, 0) == ([], 2)
    assert staleness_counts([fresh], 4, 2) == {"staleness_0": 1, "staleness_1": 1, "staleness_2": 0}


def test_a_rollout_that_took_up_newer_versions_between_turns_is_as_old_as_its_oldest_turn():
    switched = dataclasses.replace(sampled(1, 1.0, 2), turn_adapters=[("cap", 2), ("cap", 4)])
    fresh = dataclasses.replace(sampled(1, 0.0, 3), turn_adapters=[("cap", 3), ("cap", 3), ("cap", 4)])
    assert within_bound([[switched, fresh]], trained_version=4, max_staleness=1) == ([], 2)
    assert within_bound([[fresh, fresh]], 4, 1) == ([[fresh, fresh]], 0)
    assert staleness_counts([[switched, fresh]], 4, 2) == {"staleness_0": 0, "staleness_1": 1, "staleness_2": 1}


class Player:
    """Plays one group per seed with the version asked for; seed s gets unequal rewards when s % 3 != 0. Records
    (seeds, version) of every call."""

    def __init__(self, group_size: int = 2):
        self.group_size, self.calls = group_size, []

    def __call__(self, seeds: list[int], version: int):
        self.calls.append((list(seeds), version))
        return [[sampled(s, float(s % 3 != 0 and k == 0), version) for k in range(self.group_size)] for s in seeds]


class Published:
    """The newest adapter version the workers serve, and how often a batch played ahead has read it."""

    def __init__(self):
        self.version, self.reads, self.read = 0, 0, threading.Condition()

    def __call__(self) -> int:
        with self.read:
            self.reads += 1
            self.read.notify_all()
            return self.version


def train(source: BatchSource, published: Published, iterations: int, lag: int = 0):
    """Drive ``source`` as the trainer does: collect, update (which outlasts the start of the batches launched ahead:
    it waits until each has read the version to play), publish ``lag`` versions behind the one trained; the batches
    taken."""
    state, batches = TrainState(), []
    for iteration in range(1, iterations + 1):
        batch = source.collect(state)
        batches.append(batch)
        state.seed_cursor = batch.cursor
        with published.read:
            assert published.read.wait_for(lambda: published.reads == source.launched_batches, timeout=5)
        state.iteration = iteration
        state.history.append({"rollouts": sum(len(group) for group in batch.groups)})
        published.version = max(0, iteration - lag)
    source.close()
    return batches


def test_staleness_zero_takes_the_batches_of_the_synchronous_loop():
    settings = grpo(group_size=2, groups_per_batch=2, min_informative_groups=2, max_resample_batches=2, iterations=4)
    player, published = Player(), Published()
    source = BatchSource(settings, lambda i: 100 + i, player, published)
    batches = train(source, published, 4)
    reference, state, reference_batches = Player(), TrainState(), []
    for iteration in range(1, 5):  # today's loop: collect_groups with the version published last

        def play(seeds, version=iteration - 1):
            return reference(seeds, version)

        groups, state.seed_cursor = collect_groups(settings, state, lambda i: 100 + i, play)
        reference_batches.append(groups)
        state.iteration = iteration
    assert player.calls == reference.calls  # the same seeds, each with the version trained, nothing played ahead
    assert [batch.groups for batch in batches] == reference_batches
    assert [training_rows(b.groups, "std", 1e-6) for b in batches] == [
        training_rows(groups, "std", 1e-6) for groups in reference_batches
    ]  # so the same update


@pytest.mark.parametrize("depth", [1, 2])
def test_batches_played_ahead_overlap_the_update_within_the_bound(depth):
    settings = grpo(
        group_size=2,
        groups_per_batch=2,
        min_informative_groups=1,
        max_resample_batches=1,
        iterations=6,
        max_staleness=depth,
    )
    player, published = Player(), Published()
    source = BatchSource(settings, lambda i: 100 + i, player, published)
    batches = train(source, published, 6)
    staleness = [
        [iteration - rollout.adapter[1] for group in batch.groups for rollout in group]
        for iteration, batch in enumerate(batches)
    ]  # iteration i (from 0) trains version i
    assert all(0 <= s <= depth for batch in staleness for s in batch)
    assert max(s for batch in staleness for s in batch) == depth  # they did overlap the update
    assert all(batch.dropped == 0 for batch in batches)
    seeds = [rollout.seed for batch in batches for group in batch.groups for rollout in group[:1]]
    assert seeds == list(range(100, 100 + len(seeds)))  # consecutive train seeds, none played twice
    assert len(player.calls) == 6  # nothing launched past the last iteration


def test_a_batch_played_with_a_version_past_the_bound_never_enters_a_batch():
    # the workers lag two versions behind what was trained (say a sync that never arrived): every batch played ahead
    # is two versions old when taken, so it is dropped and its seeds' groups are gone; the iteration plays more now
    settings = grpo(
        group_size=2,
        groups_per_batch=1,
        min_informative_groups=1,
        max_resample_batches=3,
        iterations=5,
        max_staleness=1,
    )
    published = Published()
    source = BatchSource(settings, lambda i: 101 + i, Player(), published)
    batches = train(source, published, 5, lag=2)
    for iteration, batch in enumerate(batches):
        assert all(iteration - rollout.adapter[1] <= 1 for group in batch.groups for rollout in group)
        assert batch.groups  # re-collected with the version trained
    assert sum(batch.dropped for batch in batches) > 0


def test_discard_drops_what_was_launched_and_close_stops_the_thread():
    settings = grpo(group_size=2, groups_per_batch=2, iterations=9, max_staleness=2)
    release, player = threading.Event(), Player()

    def slow(seeds, version):
        release.wait(5)
        return player(seeds, version)

    source = BatchSource(settings, lambda i: i, slow, lambda: 0)
    state = TrainState()
    release.set()
    batch = source.collect(state)
    release.clear()
    assert len(source._launched) == 2
    threading.Timer(0.2, release.set).start()
    assert source.discard() == 2 * 2  # the batch playing ran to its end (2 groups of 2); the queued one was cancelled
    assert not source._launched and batch.cursor == 2
    source.close()
    assert not source._thread.is_alive()
