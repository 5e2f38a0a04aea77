import pytest

from engine.reward import countdown

TRUTH = {"target": 24, "numbers": [3, 4, 2]}


@pytest.mark.parametrize(
    ("response", "score"),
    [
        ("<think>3*4 is 12</think><answer>(3 * 4) * 2</answer>", 1.0),
        ("<answer>3 + 4</answer> no, <answer>2*(4*3)</answer>", 1.0),  # the last tag
        ("<answer>3 + 4 + 2</answer>", 0.1),  # wrong value
        ("<answer>3 * 4 * 2 * 2</answer>", 0.1),  # a number used twice
        ("<answer>3 * 4</answer>", 0.1),  # a number unused
        ("<answer>12 * 2</answer>", 0.1),  # a number not given
        ("<answer>3 / (4 - 4) * 2</answer>", 0.1),  # division by zero: wrong, not a crash
        ("<answer>3 ** 4 - 2</answer>", 0.0),  # powers are not allowed
        ("<answer>-3 + 4 * 2</answer>", 0.0),  # nor unary minus
        ("<answer>3.0 * 4 * 2</answer>", 0.0),  # integers only
        ("<answer>(3 * 4</answer>", 0.0),  # syntax error
        ("(3 * 4) * 2", 0.0),  # no tag
        ("<answer></answer>", 0.0),
    ],
)
def test_scores(response, score):
    assert countdown.compute_score(response, TRUTH)["score"] == score


def test_fractional_intermediate_values_are_exact():
    truth = {"target": 24, "numbers": [8, 3, 8, 3]}
    assert countdown.compute_score("<answer>8 / (3 - 8 / 3)</answer>", truth)["acc"] == 1.0


def test_injection_is_never_executed(tmp_path, monkeypatch):
    marker = tmp_path / "pwned"
    monkeypatch.chdir(tmp_path)
    attacks = [
        "<answer>__import__('os').system('touch pwned')</answer>",
        "<answer>open('pwned', 'w')</answer>",
        "<answer>(lambda: 3)() * 4 * 2</answer>",
        "<answer>" + "(" * 400 + "3" + ")" * 400 + "</answer>",
    ]
    for attack in attacks:
        assert countdown.compute_score(attack, TRUTH)["score"] == 0.0
    assert not marker.exists()


def test_custom_format_score():
    assert (
        countdown.compute_score("<answer>3+4+2</answer>", TRUTH, format_score=0.0)["score"] == 0.0
    )
