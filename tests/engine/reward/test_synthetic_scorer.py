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
        ("the sum is 7", "7", 0.25, 0.0),  # right number, but not first: partial only
        ("the sum is 8", "7", 0.225, 0.0),
        ("77", "7", 0.0, 0.0),  # far off (|77 - 7| >= 10)
        ("3 then 7", "7", 0.3, 0.0),  # the leading number counts
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


def test_each_tier_pays_more_than_the_one_before():
    tiers = ["xyz abc", "xyz 3 abc", "3 abc", "4 abc"]  # nothing, later, first, right
    scores = [compute_score(text, "4")["score"] for text in tiers]
    assert scores == sorted(scores)
    assert len(set(scores)) == 4
