import threading

import pytest

from engine.reward import math_answer


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),
        ("\\boxed{\\frac{a^{2}}{\\sqrt{b}}}", "\\frac{a^{2}}{\\sqrt{b}}"),  # nested braces
        ("first \\boxed{1}, finally \\boxed{2}", "2"),
        ("\\fbox{7}", "7"),
        ("$\\boxed 5$", "5"),
        ("\\boxed{3", None),  # never closed
        ("Reasoning...\nAnswer: 42", "42"),
        ("answer: $\\frac{3}{4}$.", "\\frac{3}{4}"),
        ("nothing here", None),
    ],
)
def test_extract_answer(text, expected):
    assert math_answer.extract_answer(text) == expected


@pytest.mark.parametrize(
    ("response", "truth"),
    [
        ("\\boxed{\\frac{1}{2}}", "0.5"),
        ("\\boxed{\\frac12}", "\\frac{1}{2}"),
        ("\\boxed{1/2}", "\\dfrac{1}{2}"),
        ("\\boxed{\\{2, 1\\}}", "\\{1,2\\}"),
        ("\\boxed{[0, 1)}", "[0,1)"),
        ("\\boxed{2x + x^2}", "x^2+2x"),
        ("\\boxed{3.0}", "3"),
        ("Answer: 42", "42"),
        ("\\boxed{7}", "\\boxed{7}"),  # a boxed ground truth
    ],
)
def test_equivalent_forms_score_one(response, truth):
    result = math_answer.compute_score(response, truth)
    assert {k: result[k] for k in ("score", "acc", "format")} == {
        "score": 1.0,
        "acc": 1.0,
        "format": 1.0,
    }
    assert result["pred"]  # the extracted answer, for majority voting


def test_pred_is_the_normalised_answer():
    # Spelling variants of one answer vote together in maj@k.
    first = math_answer.compute_score("\\boxed{\\dfrac{1}{2}}", "0.5")["pred"]
    second = math_answer.compute_score("\\boxed{\\frac{1}{2}}", "0.5")["pred"]
    assert first == second
    assert "pred" not in math_answer.compute_score("no box here", "0.5")


@pytest.mark.parametrize(
    ("response", "truth", "fmt"),
    [
        ("\\boxed{\\frac{1}{3}}", "0.5", 1.0),
        ("\\boxed{[0, 1]}", "[0,1)", 1.0),
        ("the answer is one half", "0.5", 0.0),
    ],
)
def test_wrong_or_missing_scores_zero(response, truth, fmt):
    result = math_answer.compute_score(response, truth)
    assert result["score"] == 0.0
    assert result["format"] == fmt


def test_string_fallback_when_unparseable():
    assert math_answer.compute_score("\\boxed{\\text{Tuesday}}", "Tuesday")["score"] == 1.0
    assert math_answer.compute_score("\\boxed{Monday}", "Tuesday")["score"] == 0.0


def test_works_outside_the_main_thread():
    results = []
    thread = threading.Thread(
        target=lambda: results.append(math_answer.compute_score("\\boxed{\\frac12}", "0.5"))
    )
    thread.start()
    thread.join()
    assert [r["score"] for r in results] == [1.0]
