from trace_ray.metrics import summarize


def test_metrics_count_perfect_and_successes_per_family():
    rows = summarize([("a", 1.0, True), ("a", 0.5, False), ("b", 0.9, True), ("b", 0.0, False)])
    assert [(r.group, r.episodes, r.perfect, r.successes) for r in rows] == [
        ("a", 2, 1, 1),
        ("b", 2, 0, 1),
        ("overall", 4, 1, 2),
    ]
    assert rows[0].mean_similarity == 0.75 and rows[2].success_rate == 0.5
