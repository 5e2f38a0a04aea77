"""Interactions: an environment that answers the model's turns. Its feedback goes back as
the user's next turn, masked out exactly like a tool's result; its score of each answer is
kept in order; the episode ends when it says so or at the turn limit. The interactions
file and the rows' interaction_kwargs are refused at start with the key and the fix."""

from __future__ import annotations

import pytest

from engine.agents.chat import ChatFormat
from engine.agents.interactions import (
    Feedback,
    InteractionError,
    RetryInteraction,
    interaction_kwargs_problems,
    load_interactions,
    parse_interactions,
)
from engine.agents.loop import AgentRunner, as_generation_output
from engine.agents.rows import agent_row_problems
from engine.agents.tools import get_tool_call_parser
from engine.agents.trajectory import ANSWERED, MAX_TURNS, AgentLimits
from engine.errors import ConfigError
from engine.models.tiny import build_tokenizer
from engine.types import SamplingParams
from tests.engine.agents.test_agent_loop import Script

RETRY = {
    "interaction": [
        {"name": "retry", "class_name": "retry", "config": {"data_source": "synthetic/add"}}
    ]
}
KWARGS = {"name": "retry", "ground_truth": "7"}


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def agent(tokenizer, interactions, max_turns=3):
    return AgentRunner(
        ChatFormat(tokenizer),
        get_tool_call_parser("hermes"),
        {},
        AgentLimits(max_turns=max_turns, max_response_tokens=400),
        interactions,
    )


def test_feedback_is_the_users_turn_masked_out_and_each_answer_is_scored(tokenizer):
    a = agent(tokenizer, parse_interactions(RETRY))
    prompt = a.chat.prompt_ids([{"role": "user", "content": "Add 3 and 4."}])
    script = Script(tokenizer, [["5", "7"]])
    (t,) = a.run(
        script,
        [prompt],
        SamplingParams(max_new_tokens=50),
        extra_info=[{"interaction_kwargs": KWARGS}],
    )

    eos = tokenizer.eos_token_id
    first, second = (
        [*tokenizer.encode("5", add_special_tokens=False), eos],
        [
            *tokenizer.encode("7", add_special_tokens=False),
            eos,
        ],
    )
    user = tokenizer.encode(
        f"\n<|im_start|>user\n{RetryInteraction.MESSAGE}<|im_end|>\n<|im_start|>assistant\n",
        add_special_tokens=False,
    )
    assert t.response_ids == first + user + second
    assert t.response_mask == [1] * len(first) + [0] * len(user) + [1] * len(second)
    assert (t.turns, t.ended, t.feedback_turns) == (2, ANSWERED, 1)
    # the synthetic scorer: 5 for 7 is a wrong leading number, 0.5 * (1 - 2/10)
    assert t.turn_scores == [pytest.approx(0.4), 1.0]
    out = as_generation_output([t], logprobs=False)
    assert out.turn_scores == [[pytest.approx(0.4), 1.0]]
    assert out.agent_stats[0]["feedback_turns"] == 1.0


def test_an_episode_the_interaction_never_ends_stops_at_the_turn_limit(tokenizer):
    a = agent(tokenizer, parse_interactions(RETRY), max_turns=2)
    prompt = a.chat.prompt_ids([{"role": "user", "content": "Add 3 and 4."}])
    rows = [["1", "2", "3"], ["7"]]  # always wrong; right at once
    t, u = a.run(
        Script(tokenizer, rows),
        [prompt, a.chat.prompt_ids([{"role": "user", "content": "Add 4 and 3."}])],
        SamplingParams(max_new_tokens=50),
        extra_info=[{"interaction_kwargs": KWARGS}] * 2,
    )
    assert (t.turns, t.ended, len(t.turn_scores)) == (2, MAX_TURNS, 2)
    assert (u.turns, u.ended, u.turn_scores) == (1, ANSWERED, [1.0])


def test_rows_without_an_interaction_end_at_their_answer(tokenizer):
    a = agent(tokenizer, parse_interactions(RETRY))
    prompt = a.chat.prompt_ids([{"role": "user", "content": "Add 3 and 4."}])
    (t,) = a.run(Script(tokenizer, [["5"]]), [prompt], SamplingParams(max_new_tokens=50))
    assert (t.turns, t.ended, t.turn_scores, t.interaction) == (1, ANSWERED, [], None)


def test_a_custom_interaction_from_a_file_and_verls_tuple(tokenizer, tmp_path):
    (tmp_path / "game.py").write_text(
        "class Guess:\n"
        "    def __init__(self, config):\n"
        "        self.hint = config.get('hint', 'higher')\n"
        "    def start(self, *, target):\n"
        "        return {'target': int(target), 'tries': 0}\n"
        "    def respond(self, state, reply):\n"
        "        state['tries'] += 1\n"
        "        n = int(reply.strip())\n"
        "        if n == state['target']:\n"
        "            return True, '', 1.0 / state['tries'], {}\n"
        "        return False, 'higher' if n < state['target'] else 'lower', 0.0\n"
    )
    (tmp_path / "env.yaml").write_text(
        "interaction:\n  - name: guess\n    class_name: game.py:Guess\n"
    )
    interactions = load_interactions(tmp_path / "env.yaml")
    a = agent(tokenizer, interactions, max_turns=4)
    prompt = a.chat.prompt_ids([{"role": "user", "content": "Guess my number."}])
    (t,) = a.run(
        Script(tokenizer, [["2", "9", "5"]]),
        [prompt],
        SamplingParams(max_new_tokens=50),
        extra_info=[
            {"interaction_kwargs": {"target": 5}}
        ],  # one interaction declared: the name may go
    )
    assert t.turn_scores == [0.0, 0.0, pytest.approx(1 / 3)]
    text = tokenizer.decode(t.response_ids)
    assert "user\nhigher" in text and "user\nlower" in text


def test_an_interaction_that_raises_stops_the_run_with_its_name(tokenizer):
    class Broken:
        def start(self, **kwargs):
            return None

        def respond(self, state, reply):
            raise ValueError("no board")

    a = agent(tokenizer, {"board": Broken()})
    prompt = a.chat.prompt_ids([{"role": "user", "content": "Play."}])
    with pytest.raises(
        InteractionError, match="interaction 'board': respond\\(\\) failed: ValueError: no board"
    ):
        a.run(
            Script(tokenizer, [["e4"]]),
            [prompt],
            SamplingParams(max_new_tokens=20),
            extra_info=[{"interaction_kwargs": {"name": "board"}}],
        )


def test_the_file_is_refused_with_each_problem(tmp_path):
    bad = {
        "interaction": [
            {"name": "a", "class_name": "retyr"},
            {"name": "b", "class_name": "verl.interactions.gsm8k_interaction.Gsm8kInteraction"},
            {"name": "c", "class_name": "retry", "config": {"data_source": "nope/none"}},
            {"name": "d", "class_name": "retry", "config": {"sources": 1}},
            {"name": "a", "class_name": "retry"},
        ]
    }
    with pytest.raises(ConfigError) as err:
        parse_interactions(bad, source="env.yaml")
    problems = err.value.problems
    assert any("interaction[0].class_name" in p and "retry" in p for p in problems)
    assert any("interaction[1]" in p and "file.py:Class" in p for p in problems)
    assert any("interaction[2]" in p and "nope/none" in p for p in problems)
    assert any("interaction[3].config" in p and "sources" in p for p in problems)
    assert any("interaction[4].name" in p and "twice" in p for p in problems)
    with pytest.raises(ConfigError, match="no such file"):
        load_interactions(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="'interaction:' list"):
        parse_interactions({"interactions": []})


def test_rows_name_a_declared_interaction():
    two = {"retry": object(), "game": object()}
    where = "train.parquet: row 3"
    missing = interaction_kwargs_problems({"interaction_kwargs": {"ground_truth": "1"}}, two, where)
    assert missing == [
        f"{where}: extra_info.interaction_kwargs.name is missing; name one of game, retry"
    ]
    unknown = interaction_kwargs_problems({"interaction_kwargs": {"name": "retyr"}}, two, where)
    assert "row 3" in unknown[0] and "'retyr'" in unknown[0] and "retry" in unknown[0]
    no_file = interaction_kwargs_problems({"interaction_kwargs": {"name": "retry"}}, {}, where)
    assert "interaction_config_path" in no_file[0]
    assert interaction_kwargs_problems({"interaction_kwargs": {"name": "game"}}, two, where) == []
    # the agent-row check runs it on each tool_agent row
    rows = [("f: row 0", None, {"interaction_kwargs": {"name": "nope"}})]
    assert agent_row_problems(rows, {}, ("single_turn", "tool_agent"), "tool_agent", two)


def test_feedback_takes_verls_tuple_and_refuses_other_values():
    from engine.agents.interactions import as_feedback

    assert as_feedback((False, "again", 0.5), "x") == Feedback(False, "again", 0.5)
    assert as_feedback((True, "", 1, {"m": 1}), "x") == Feedback(True, "", 1.0)
    with pytest.raises(InteractionError, match="interaction 'x'"):
        as_feedback("done", "x")
