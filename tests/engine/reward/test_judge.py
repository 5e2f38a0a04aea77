"""The generative reward model (an LLM judge): its verdict parser on hand-written
verdicts, its prompt template, the refusals before start, the split with the rule
functions per data source, and the judge generating on a tiny causal LM on CPU (hf)."""

import pytest
import torch

from engine.config import JudgeConfig, load_config
from engine.errors import ConfigError
from engine.reward.judge import JudgeRewards
from engine.reward.manager import RewardManager
from engine.reward.types import ScoreRequest
from engine.reward.verdict import VerdictParser, fill_template, question_text
from engine.types import GenerationOutput


def parse(text, **judge):
    return VerdictParser(JudgeConfig(**judge))(text)


# -- the verdict parser ---------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "reward"),
    [
        ("The answer is right.\nScore: 10", 1.0),
        ("score: 0", 0.0),
        ("SCORE=7.5", 0.75),
        ("Final: \\boxed{4}", 0.4),
        # several matches: the last decides (a judge names its answer last)
        ("A 2 would be too harsh; Score: 3 at first... no. Score: 8", 0.8),
        ("\\boxed{1} then Score: 6", 0.6),
        # the reasoning before </think> is not searched
        ("<think>Score: 1? maybe</think>The response is fine. Score: 9", 0.9),
    ],
)
def test_score_verdicts(text, reward):
    verdict = parse(text)
    assert verdict.parsed
    assert verdict.reward == pytest.approx(reward)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "I cannot grade this.",
        "Score: eleven",
        "Score: 11",  # off the 0-10 scale: not clamped to the top
        "Score: -1",
        "<think>Score: 5</think>no verdict after thinking",
    ],
)
def test_unparsed_score_verdicts_score_the_configured_value(text):
    verdict = parse(text, unparsed_score=-0.5)
    assert not verdict.parsed
    assert verdict.reward == -0.5


def test_a_custom_range_and_pattern():
    judge = dict(pattern=r"rating\s*\[\[(\d+)\]\]", score_range=[1.0, 5.0])
    assert parse("Rating [[5]]", **judge).reward == 1.0
    assert parse("rating [[1]]", **judge).reward == 0.0
    assert parse("rating [[3]] and then rating [[2]]", **judge).reward == pytest.approx(0.25)
    assert not parse("Score: 3", **judge).parsed


@pytest.mark.parametrize(
    ("text", "reward"),
    [
        ("Yes", 1.0),
        ("NO.", 0.0),
        ("The final answer matches, so: yes", 1.0),
        ("Yes it looks right at first, but the units are wrong. No", 0.0),
        ("<think>no, wait, yes</think> Verdict: yes", 1.0),
    ],
)
def test_yes_no_verdicts(text, reward):
    verdict = parse(text, verdict="yes_no")
    assert verdict.parsed and verdict.reward == reward


@pytest.mark.parametrize("text", ["Maybe.", "yesterday and nobody", "Score: 7"])
def test_unparsed_yes_no_verdicts(text):
    assert not parse(text, verdict="yes_no").parsed


def test_a_yes_no_pattern_that_captures_another_word_is_unparsed():
    judge = dict(verdict="yes_no", pattern=r"verdict:\s*(\w+)")
    assert parse("Verdict: YES", **judge).reward == 1.0
    assert not parse("Verdict: correct", **judge).parsed


def test_the_template_replaces_only_its_placeholders_once():
    template = "Q: {prompt}\nA: {response}\nRef: {ground_truth}\nAnswer as \\boxed{{N}}."
    text = fill_template(template, "2+2?", "it is {prompt}", "4")
    assert text == "Q: 2+2?\nA: it is {prompt}\nRef: 4\nAnswer as \\boxed{{N}}."
    chat = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "text", "text": "the question"}]},
    ]
    assert question_text(chat) == "the question"
    assert question_text([]) == ""


# -- refusals before start -----------------------------------------------------


def _cfg(model_path, *extra):
    return load_config(
        [
            "actor_rollout_ref.model.path=x",
            "data.train_files=x",
            "reward_model.num_workers=1",
            "reward_model.enable=true",
            "reward_model.style=generative",
            f"reward_model.model.path={model_path}",
            *extra,
        ]
    )


def _problems(model_path, *extra):
    with pytest.raises(ConfigError) as info:
        _cfg(model_path, *extra)
    return "\n".join(info.value.problems)


def test_a_sequence_classifier_is_refused_as_the_judge(tmp_path):
    from engine.models.tiny import build_tiny_reward_model

    rm_dir = build_tiny_reward_model(tmp_path / "rm")
    text = _problems(rm_dir)
    assert "reward_model.model.path" in text and "not a causal LM" in text
    assert "reward_model.style=discriminative" in text  # the fix


@pytest.mark.parametrize(
    ("extra", "key", "fix"),
    [
        (["reward_model.judge.prompt_template='Grade: {prompt}'"], "prompt_template", "{response}"),
        (["reward_model.judge.pattern='(a)(b)'"], "reward_model.judge.pattern", "(?:...)"),
        (["reward_model.judge.pattern='no group'"], "reward_model.judge.pattern", "exactly one"),
        (["reward_model.judge.pattern='(unclosed'"], "reward_model.judge.pattern", "fix it"),
        (["reward_model.judge.score_range=[10,0]"], "reward_model.judge.score_range", "lo < hi"),
        (["reward_model.judge.score_range=[1]"], "reward_model.judge.score_range", "[lo, hi]"),
        (
            ["actor_rollout_ref.rollout.name=sglang"],
            "actor_rollout_ref.rollout.name=sglang",
            "use rollout.name hf or vllm",
        ),
        (["reward_model.judge.verdict=likert"], "reward_model.judge.verdict", "score"),
        (["reward_model.judge.max_prompt_length=8"], "max_prompt_length", "raise it"),
        (["reward_model.style=judge"], "reward_model.style", "generative"),
    ],
)
def test_bad_judge_settings_are_refused_naming_the_key_and_the_fix(tiny_model_dir, extra, key, fix):
    text = _problems(tiny_model_dir, *extra)
    assert key in text and fix in text


def test_a_template_file_without_the_response_is_refused(tiny_model_dir, tmp_path):
    template = tmp_path / "judge.txt"
    template.write_text("Grade {prompt}")
    text = _problems(tiny_model_dir, f"reward_model.judge.prompt_template_path={template}")
    assert "prompt_template_path's file has no {response}" in text
    missing = _problems(tiny_model_dir, f"reward_model.judge.prompt_template_path={tmp_path}/x")
    assert "is not a file" in missing


def test_a_judge_without_a_chat_template_is_refused_unless_raw_prompts(tmp_path):
    from transformers import AutoTokenizer

    from engine.models.tiny import build_tiny_judge
    from engine.reward.judge import load_judge_tokenizer

    judge = build_tiny_judge(tmp_path / "judge")
    tokenizer = AutoTokenizer.from_pretrained(judge)
    tokenizer.chat_template = None
    tokenizer.save_pretrained(judge)
    (judge / "chat_template.jinja").unlink(missing_ok=True)
    with pytest.raises(ConfigError, match=r"reward_model\.judge\.apply_chat_template=false"):
        load_judge_tokenizer(_cfg(judge).reward_model)
    load_judge_tokenizer(_cfg(judge, "reward_model.judge.apply_chat_template=false").reward_model)


# -- the controller's part: prompts out, verdicts in, the rules for the rest ---------


class FakeJudge:
    """Answers each prompt with the next of ``verdicts`` (token ids of the text)."""

    def __init__(self, tokenizer, verdicts):
        self.tokenizer = tokenizer
        self.verdicts = list(verdicts)
        self.prompts = []

    def __call__(self, request):
        self.prompts += request.prompt_ids
        texts = [self.verdicts.pop(0) for _ in request.prompt_ids]
        ids = [self.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
        return GenerationOutput(response_ids=ids, finished=[True] * len(ids))


def test_judged_sources_get_the_verdicts_and_the_others_their_rule(tiny_model_dir):
    from transformers import AutoTokenizer

    cfg = _cfg(
        tiny_model_dir,
        "reward_model.data_sources=[prefs]",
        "data.max_response_length=64",
        "reward_model.judge.max_prompt_length=200",
    )
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    judge = JudgeRewards(cfg.reward_model, ranks=2)
    requests = [
        ScoreRequest("prefs", "a fine answer", "42"),
        ScoreRequest("synthetic/add", "7", "7"),
        ScoreRequest("prefs", "word " * 300, "42"),  # over max_prompt_length: not judged
        ScoreRequest("prefs", "unsure", None),
        ScoreRequest("prefs", "ok", "1"),
    ]
    messages = [[{"role": "user", "content": f"question {i}"}] for i in range(5)]
    fake = FakeJudge(tokenizer, ["Score: 9", "I refuse", "Score: 2", "pad"])
    with RewardManager(cfg.reward_model, cfg.custom_reward_function, 512) as rules:
        results = judge.score(requests, [[]] * 5, [[]] * 5, messages, rules, fake)
    assert [r.score for r in results] == [pytest.approx(0.9), 1.0, 0.0, 0.0, pytest.approx(0.2)]
    assert [r.extras.get("judge_unparsed") for r in results] == [0.0, None, 1.0, 1.0, 0.0]
    # three prompts judged, padded to four for the two ranks; each prompt is the template
    # filled with the question, the response and the ground truth, through the chat template
    assert len(fake.prompts) == 4
    first = tokenizer.decode(fake.prompts[0])
    assert "question 0" in first and "a fine answer" in first and "42" in first
    assert first.startswith("<|im_start|>user") and first.endswith("<|im_start|>assistant\n")
    assert judge.take_metrics() == {
        "reward_model/judge_unparsed": 1.0,
        "reward_model/judge_overlong": 1.0,
        "reward_model/judge_truncated": 0.0,
        "reward_model/judge_response_length/mean": pytest.approx(
            sum(len(tokenizer(t)["input_ids"]) for t in ["Score: 9", "I refuse", "Score: 2"]) / 3
        ),
    }
    assert judge.take_metrics()["reward_model/judge_unparsed"] == 0.0  # counted once


def test_the_hf_judge_generates_its_verdicts_on_cpu(tmp_path):
    """The judge role on a tiny causal LM (hf): the verdicts come from the judge's own
    weights, greedily, whatever the policy model is."""
    from engine.device import DEVICES
    from engine.models.tiny import build_tiny_judge
    from engine.reward.judge import judge_sampling
    from engine.reward.verdict import JudgePrompts
    from engine.types import GenerationRequest
    from engine.workers.judge import JudgeWorker

    judge_dir = build_tiny_judge(tmp_path / "judge", verdict="Verdict: yes")
    cfg = _cfg(
        judge_dir,
        "reward_model.judge.verdict=yes_no",
        "reward_model.micro_batch_size_per_gpu=2",
        "reward_model.judge.max_new_tokens=12",
    )
    worker = JudgeWorker(cfg, DEVICES["cpu"], tokenizer=None, colocated={})
    judge = JudgeRewards(cfg.reward_model, ranks=1)
    prompts = JudgePrompts(cfg.reward_model.judge, judge.tokenizer)
    texts = [prompts.text([{"role": "user", "content": q}], "5", "5") for q in ("2+3?", "1+4?")]
    texts.append(prompts.text([], "a much longer response " * 5, None))
    torch.manual_seed(0)
    output = worker.generate(
        GenerationRequest(prompts.token_ids(texts), judge_sampling(cfg.reward_model))
    )
    decoded = judge.tokenizer.batch_decode(output.response_ids, skip_special_tokens=True)
    assert decoded == ["Verdict: yes"] * 3
    assert output.finished == [True] * 3
    assert [judge.parse(t).reward for t in decoded] == [1.0] * 3
