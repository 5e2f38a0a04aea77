import pytest

from engine.reward.synthetic import compute_score


@pytest.mark.parametrize(
    ("response", "truth", "score", "acc"),
    [
        ("7", "7", 1.0, 1.0),
        (" 7", "7", 1.0, 1.0),
        ("7 and some text", "7", 1.0, 1.0),  # text after the answer is ignored
        ("8", "7", 0.45, 0.0),  # close: 0.5 * (1 - 1/10)
        ("2", "7", 0.25, 0.0),
        ("the sum is 7", "7", 0.5, 0.0),  # right number, but not first: partial only
        ("77", "7", 0.0, 0.0),  # far off (|77 - 7| >= 10)
        ("-3", "7", 0.0, 0.0),
        ("no digits at all", "7", 0.0, 0.0),
        ("", "0", 0.0, 0.0),
        ("0", "0", 1.0, 1.0),
    ],
)
def test_scores(response, truth, score, acc):
    result = compute_score(response, truth, {"split": "train", "index": 0})
    assert result["score"] == pytest.approx(score)
    assert result["acc"] == acc


def test_a_random_response_rarely_scores_but_a_digit_always_scores_something():
    assert compute_score("xyz 3 abc", "4")["score"] > 0
    assert compute_score("xyz abc", "4")["score"] == 0
