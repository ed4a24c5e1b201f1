import threading
import time

from trace_ray.training.training_log import TrainingLog, read_metrics


def test_metrics_read_while_training_rewrites_them_are_always_a_whole_version(tmp_path):
    log = TrainingLog(tmp_path)
    log.write([{"iteration": 1, "reward_mean": 0.0}])
    stop = threading.Event()

    def rewrite() -> None:
        history = []
        while not stop.is_set():
            # a growing history, so that consecutive versions of the file differ in size
            history.append({"iteration": len(history) + 1, "reward_mean": 0.5, "note": "x" * (len(history) % 40)})
            log.write(history[-30:])

    writer = threading.Thread(target=rewrite)
    writer.start()
    reads = []
    try:
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            reads.append(read_metrics(tmp_path))
    finally:
        stop.set()
        writer.join()
    log.finish([])
    assert len(reads) > 100
    assert all(rows and rows[-1]["iteration"] >= len(rows) for rows in reads)
