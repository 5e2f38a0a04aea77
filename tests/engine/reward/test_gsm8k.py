import pytest

from engine.reward import gsm8k


@pytest.mark.parametrize(
    ("response", "truth", "score"),
    [
        ("She has 3 + 4 = 7 apples.\n#### 7", "7", 1.0),
        ("#### 1,234", "1234", 1.0),
        ("#### $1,234.", "1234", 1.0),
        ("#### 72.0", "72", 1.0),
        ("#### -5", "-5", 1.0),
        ("#### 3 then #### 8", "8", 1.0),  # the last one counts
        ("#### 6", "7", 0.0),
        ("The answer is 7.", "7", 0.0),  # strict: no ####
        ("", "7", 0.0),
        ("#### 7", "Natalia sold 48/2 = 24 clips.\n#### 7", 1.0),  # full GSM8K answer
        ("#### 7", "$7", 1.0),
    ],
)
def test_strict(response, truth, score):
    assert gsm8k.compute_score(response, truth)["score"] == score


@pytest.mark.parametrize(
    ("response", "truth", "score"),
    [
        ("The answer is 7.", "7", 1.0),
        ("It costs $1,234.", "1234", 1.0),
        ("7 at first, then 9", "9", 1.0),
        ("7 at first, then 9", "7", 0.0),
        ("no numbers here", "7", 0.0),
    ],
)
def test_flexible(response, truth, score):
    assert gsm8k.compute_score(response, truth, method="flexible")["score"] == score


def test_format_score_and_acc():
    wrong = gsm8k.compute_score("#### 6", "7", format_score=0.1)
    assert wrong == {"score": 0.1, "acc": 0.0, "format": 1.0, "pred": "6"}
    assert gsm8k.compute_score("no answer", "7", format_score=0.1)["score"] == 0.0
    assert gsm8k.compute_score("#### 7", "7", format_score=0.1)["acc"] == 1.0


def test_unknown_method():
    with pytest.raises(ValueError, match="strict or flexible"):
        gsm8k.extract_answer("#### 1", "loose")


def test_normalize_number():
    assert gsm8k.normalize_number("$1,000.50") == "1000.5"
    assert gsm8k.normalize_number(" 42. ") == "42"
