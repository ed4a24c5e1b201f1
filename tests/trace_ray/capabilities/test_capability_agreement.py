import pytest

from trace_ray.capabilities.agreement import agreement, cohens_kappa


def test_kappa_hand_computed():
    # 10 items: both LACKING 4, both PRESENT 3, disagree 3 (first LACKING / second PRESENT)
    first = ["LACKING"] * 7 + ["PRESENT"] * 3
    second = ["LACKING"] * 4 + ["PRESENT"] * 3 + ["PRESENT"] * 3
    # p_o = 0.7; first: L 0.7 P 0.3; second: L 0.4 P 0.6; p_e = 0.28 + 0.18 = 0.46; kappa = 0.24 / 0.54
    assert cohens_kappa(first, second) == pytest.approx(0.24 / 0.54)
    assert cohens_kappa(first, first) == pytest.approx(1.0)
    assert cohens_kappa(["NA"] * 4, ["NA"] * 4) is None  # chance agreement is certain: undefined
    assert cohens_kappa(["NA", "LACKING"], ["LACKING", "NA"]) == pytest.approx(-1.0)


def test_kappa_from_a_three_label_confusion_table():
    order = ["NA", "PRESENT", "LACKING"]
    table = [
        [2, 1, 0],  # rows: the first labeler, columns: the second, both in ``order``
        [0, 3, 1],
        [1, 0, 2],
    ]
    pairs = [(order[row], order[column]) for row in range(3) for column in range(3) for _ in range(table[row][column])]
    first, second = [a for a, _ in pairs], [b for _, b in pairs]
    # p_o = (2 + 3 + 2) / 10 = 0.7; margins first 3/4/3, second 3/4/3; p_e = (9 + 16 + 9) / 100 = 0.34
    # kappa = (0.7 - 0.34) / (1 - 0.34) = 0.36 / 0.66
    assert cohens_kappa(first, second) == pytest.approx(0.36 / 0.66)


def test_agreement_over_shared_capabilities_and_trajectories():
    rules = {"a": {"t1": "NA", "t2": "LACKING", "t3": "PRESENT"}, "only_rules": {"t1": "NA"}}
    llm = {"a": {"t2": "LACKING", "t3": "PRESENT", "t4": "NA"}, "only_llm": {"t1": "NA"}}
    assert agreement(rules, llm) == {"a": pytest.approx(1.0)}
    with pytest.raises(ValueError):
        cohens_kappa([], [])
