"""Where an iteration's groups come from: played now, or played ahead in a background thread while the trainer
updates (``grpo.max_staleness``).

After taking an iteration's batch, rank 0 launches the batches the next iterations will need (their seeds); one
thread plays them in order, each with the newest adapter version published when it starts, while the update runs.
The iteration that needs those seeds takes the played groups, or plays them itself when none were launched. With
depth k (``grpo.max_staleness``) at most k batches are launched ahead, so a batch started with version v after
iteration n's update began (v >= n - 1) is taken by iteration n + k at the latest, which trains version n + k - 1:
at most k versions older. A group with a rollout older than that all the same (a worker that served an old version)
is dropped and counted. With ``grpo.adapter_switch=turn`` each turn of an episode takes up the newest version
published as it starts, which only makes a rollout fresher. Depth 0 launches nothing: the synchronous loop, batch
for batch.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from trace_ray.config import GRPOConfig
from trace_ray.rollout_loop import EpisodeResult
from trace_ray.training.grpo_iteration import TrainState, batch_fits, collect_groups
from trace_ray.training.staleness import within_bound

Groups = list[list[EpisodeResult]]


@dataclass
class CollectedBatch:
    groups: Groups
    cursor: int  # train seeds consumed after these groups
    played_s: float  # seconds its groups took to play (ahead or now)
    waited_s: float  # seconds the trainer waited for them
    dropped: int  # rollouts dropped as too old


class BatchSource:
    """An iteration's groups for the trainer. ``play(seeds, version)`` plays one group per seed with adapter
    ``version``; ``newest()`` is the newest version the rollout workers serve; ``train_seed(i)``: the i-th train
    seed."""

    def __init__(
        self,
        grpo: GRPOConfig,
        train_seed: Callable[[int], int],
        play: Callable[[list[int], int], Groups],
        newest: Callable[[], int],
    ):
        self.grpo, self.train_seed, self._play, self._newest = grpo, train_seed, play, newest
        self._launched: dict[tuple[int, ...], Future] = {}  # seeds -> (groups, seconds played)
        self._queue: deque[tuple[tuple[int, ...], Future]] = deque()  # launched, not started: (seeds, result)
        self._wakeup = threading.Condition()
        self._closed = False
        self.launched_batches = 0  # batches launched ahead so far
        self._thread = None
        if grpo.max_staleness > 0:
            self._thread = threading.Thread(target=self._run, name="rollouts-ahead", daemon=True)
            self._thread.start()

    def collect(self, state: TrainState) -> CollectedBatch:
        """The groups of the iteration that trains version ``state.iteration`` (dynamic sampling: ``collect_groups``),
        then the next iterations' batches launched ahead."""
        trained, grpo = state.iteration, self.grpo
        played_s, dropped = 0.0, 0

        def take(seeds: list[int]) -> Groups:
            nonlocal played_s, dropped
            with self._wakeup:
                future = self._launched.pop(tuple(seeds), None)
            if future is not None:
                groups, seconds = future.result()
            else:
                started = time.perf_counter()
                groups = self._play(seeds, trained)
                seconds = time.perf_counter() - started
            played_s += seconds
            kept, stale = within_bound(groups, trained, grpo.max_staleness)
            dropped += stale
            return kept

        started = time.perf_counter()
        groups, cursor = collect_groups(grpo, state, self.train_seed, take)
        waited_s = time.perf_counter() - started
        self._launch_ahead(state, cursor, sum(len(group) for group in groups))
        return CollectedBatch(groups, cursor, played_s, waited_s, dropped)

    def _launch_ahead(self, state: TrainState, cursor: int, rollouts: int) -> None:
        """Launch the next ``grpo.max_staleness`` batches (the seeds after ``cursor``) that training may still take:
        within ``grpo.max_iterations`` (else ``grpo.iterations``) and ``grpo.max_rollouts``; ``rollouts``: those of
        the iteration being trained."""
        grpo = self.grpo
        last = grpo.max_iterations or grpo.iterations
        size = grpo.groups_per_batch
        for ahead in range(1, grpo.max_staleness + 1):
            spent = rollouts + (ahead - 1) * size * grpo.group_size
            if state.iteration + 1 + ahead > last or not batch_fits(grpo, state.history, extra=spent):
                return
            key = tuple(self.train_seed(cursor + (ahead - 1) * size + g) for g in range(size))
            with self._wakeup:
                if key not in self._launched:
                    self._launched[key] = Future()
                    self._queue.append((key, self._launched[key]))
                    self.launched_batches += 1
                    self._wakeup.notify()

    def discard(self) -> int:
        """Drop every batch launched ahead (the one playing is played to its end first); the rollouts dropped."""
        with self._wakeup:
            waiting = [self._launched.pop(key) for key, _ in self._queue]
            self._queue.clear()
            playing = list(self._launched.values())
            self._launched.clear()
        for future in waiting:
            future.cancel()
        dropped = 0
        for future in playing:
            try:
                groups, _ = future.result()
            except Exception:  # a batch that failed is dropped as well
                continue
            dropped += sum(len(group) for group in groups)
        return dropped

    def close(self) -> None:
        """Stop launching and wait for the batch playing, if any (the rollout service may then be closed)."""
        self.discard()
        with self._wakeup:
            self._closed = True
            self._wakeup.notify()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while True:
            with self._wakeup:
                while not self._queue and not self._closed:
                    self._wakeup.wait()
                if self._closed:
                    return
                key, future = self._queue.popleft()
                future.set_running_or_notify_cancel()
            started = time.perf_counter()
            try:
                groups = self._play(list(key), self._newest())
            except BaseException as error:  # the iteration that takes these seeds raises it
                future.set_exception(error)
                continue
            future.set_result((groups, time.perf_counter() - started))
