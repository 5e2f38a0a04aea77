import pytest

from engine.config import CustomRewardFunctionConfig
from engine.reward import (
    RewardError,
    countdown,
    get_scorer,
    gsm8k,
    known_data_sources,
    load_custom_function,
    load_from_config,
    math_answer,
    synthetic,
)


@pytest.mark.parametrize(
    ("source", "module"),
    [
        ("openai/gsm8k", gsm8k),
        ("gsm8k", gsm8k),
        ("DigitalLearningGmbH/MATH-lighteval", math_answer),
        ("lighteval/MATH", math_answer),
        ("math", math_answer),
        ("HuggingFaceH4/MATH-500", math_answer),
        ("math_dapo", math_answer),
        ("BytedTsinghua-SIA/DAPO-Math-17k", math_answer),
        ("countdown", countdown),
        ("synthetic/add", synthetic),
    ],
)
def test_builtin_sources(source, module):
    assert get_scorer(source) is module.compute_score
    assert source in known_data_sources()


def test_unknown_source_names_known_ones_and_the_fix():
    with pytest.raises(RewardError) as info:
        get_scorer("my/dataset")
    message = str(info.value)
    assert "'my/dataset'" in message
    assert "openai/gsm8k" in message
    assert "custom_reward_function.path" in message


def write(tmp_path, text, name="reward.py"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_load_custom_function(tmp_path):
    path = write(
        tmp_path,
        "def my_score(data_source, solution_str, ground_truth, extra_info):\n    return 0.5\n",
    )
    fn = load_custom_function(path, "my_score")
    assert fn("x", "y", "z", {}) == 0.5
    cfg = CustomRewardFunctionConfig(path=str(path), name="my_score")
    assert load_from_config(cfg)("x", "y", "z", None) == 0.5
    assert load_from_config(CustomRewardFunctionConfig()) is None


def test_custom_missing_file(tmp_path):
    with pytest.raises(RewardError, match="is not a file"):
        load_custom_function(tmp_path / "nope.py", "compute_score")


def test_custom_missing_function_lists_callables(tmp_path):
    path = write(tmp_path, "def score_a(*a):\n    return 1.0\n\nX = 3\n")
    with pytest.raises(RewardError, match=r"no function 'compute_score'.*score_a"):
        load_custom_function(path, "compute_score")


def test_custom_not_callable(tmp_path):
    path = write(tmp_path, "compute_score = 3\n")
    with pytest.raises(RewardError, match="not a function"):
        load_custom_function(path, "compute_score")


def test_custom_import_error(tmp_path):
    path = write(tmp_path, "import not_a_module_anywhere\n")
    with pytest.raises(RewardError, match="ModuleNotFoundError"):
        load_custom_function(path, "compute_score")


def test_pred_is_kept_as_text_and_not_as_a_metric():
    from engine.reward.types import to_result

    result = to_result({"score": 1.0, "acc": 1.0, "pred": 42, "format": 1.0})
    assert result.pred == "42"
    assert result.extras == {"format": 1.0}
    assert to_result({"score": 0.5}).pred is None
