"""Per-iteration training metrics: ``metrics.parquet``, TensorBoard event files and a reward curve."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from trace_ray.artifacts import atomic_path

CURVE_FIELDS = ("reward_mean", "success_rate")
CLOCK_FIELDS = ("started_at", "finished_at")  # wall-clock times: in the Parquet file, not plotted


class TrainingLog:
    """Writes into the adapter's folder: ``metrics.parquet`` (rewritten whole, atomically), ``tensorboard/``."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._writer = None
        self._logged = 0

    def write(self, history: list[dict[str, Any]]) -> None:
        if not history:
            return
        with atomic_path(self.folder / "metrics.parquet") as scratch:
            pq.write_table(pa.Table.from_pylist(history), scratch)
        if self._writer is None:
            from tensorboardX import SummaryWriter

            self._writer = SummaryWriter(str(self.folder / "tensorboard"))
        for metrics in history[self._logged :]:
            for key, value in metrics.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and key not in CLOCK_FIELDS:
                    self._writer.add_scalar(f"grpo/{key}", value, metrics["iteration"])
        self._writer.flush()
        self._logged = len(history)

    def finish(self, history: list[dict[str, Any]]) -> None:
        if self._writer is not None:
            self._writer.close()
        if history:
            plot_reward_curve(history, self.folder / "reward_curve.png")


def read_metrics(folder: Path) -> list[dict[str, Any]]:
    """The metrics of every finished iteration in ``folder/metrics.parquet`` (none before the first).

    Read through one open handle: the file is replaced whole while training runs, and reading it by path would take
    its size from one version and its bytes from the next.
    """
    path = Path(folder) / "metrics.parquet"
    if not path.is_file():
        return []
    with open(path, "rb") as stream:
        return pq.read_table(stream).to_pylist()


def rollouts_spent(folder: Path) -> int:
    """The GRPO rollouts an adapter was trained with, dynamic sampling's extra batches included."""
    return sum(row["rollouts"] for row in read_metrics(folder))


def plot_reward_curve(history: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    iterations = [row["iteration"] for row in history]
    figure, axis = plt.subplots(figsize=(6, 3.5))
    for key in CURVE_FIELDS:
        axis.plot(iterations, [row[key] for row in history], marker="o", label=key.replace("_", " "))
    axis.set_xlabel("iteration")
    axis.set_ylim(-0.02, 1.02)
    axis.legend()
    axis.grid(alpha=0.3)
    figure.tight_layout()
    with atomic_path(path) as scratch:
        figure.savefig(scratch, format="png", dpi=100)
    plt.close(figure)
