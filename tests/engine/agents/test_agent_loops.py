"""Agent loops of one's own: declared in a file, picked per row by agent_name, driving
their episodes through the Episode API; the same trajectories whether the engine takes
turns batched (HF) or as they come (vLLM's stream); a loop's failure stops the run with
its name; the file refused at start with the key and the fix."""

from __future__ import annotations

import textwrap

import pytest

from engine.agents.chat import ChatFormat
from engine.agents.episode import AgentLoopError
from engine.agents.loop import AgentRunner
from engine.agents.loops import load_agent_loops, parse_agent_loops
from engine.agents.rows import agent_row_problems
from engine.agents.tools import get_tool_call_parser
from engine.agents.trajectory import ANSWERED, LENGTH, MAX_TURNS, AgentLimits
from engine.errors import ConfigError
from engine.models.tiny import build_tokenizer
from engine.types import SamplingParams
from tests.engine.agents.test_agent_loop import Script
from tests.engine.agents.test_streaming import StreamedScript

# Plans, is told to answer, answers; scores its own answer against the row's target.
PLAN_THEN_ANSWER = """
from engine.agents.episode import Episode


class PlanThenAnswer:
    CONFIG_KEYS = ("nudge",)

    def __init__(self, config):
        self.nudge = config.get("nudge", "Now answer.")

    async def run(self, episode: Episode) -> None:
        plan = await episode.generate()
        if plan is None or not plan.finished:
            return
        if not episode.add_messages([{"role": "user", "content": self.nudge}]):
            return
        answer = await episode.generate()
        if answer is not None:
            target = str(episode.extra_info["target"])
            episode.score(1.0 if answer.text.strip() == target else 0.0)
"""


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture
def loops(tmp_path):
    (tmp_path / "plan.py").write_text(PLAN_THEN_ANSWER)
    (tmp_path / "loops.yaml").write_text(
        "- name: plan_then_answer\n  _target_: plan.py:PlanThenAnswer\n"
        "  config: {nudge: Answer now.}\n"
    )
    return load_agent_loops(tmp_path / "loops.yaml")


def runner(tokenizer, loops=None, **limits):
    return AgentRunner(
        ChatFormat(tokenizer),
        get_tool_call_parser("hermes"),
        {},
        AgentLimits(**{"max_turns": 3, "max_response_tokens": 300, **limits}),
        loops=loops or {},
    )


def enc(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("served", ["batched", "streamed"])
def test_a_declared_loop_drives_its_rows_beside_the_built_in_ones(tokenizer, loops, served):
    r = runner(tokenizer, loops)
    prompts = [r.chat.prompt_ids([{"role": "user", "content": f"Q{i}"}]) for i in range(3)]
    script = Script(tokenizer, [["First, think.", "42"], ["First, think.", "41"], ["Hi."]])
    engine = script if served == "batched" else StreamedScript(script)
    a, b, c = r.run(
        engine,
        prompts,
        SamplingParams(max_new_tokens=60),
        agent_names=["plan_then_answer", "plan_then_answer", "single_turn"],
        extra_info=[{"target": 42}, {"target": 42}, {}],
    )
    eos = tokenizer.eos_token_id
    plan, answer = [*enc(tokenizer, "First, think."), eos], [*enc(tokenizer, "42"), eos]
    nudge = enc(tokenizer, "\n<|im_start|>user\nAnswer now.<|im_end|>\n<|im_start|>assistant\n")
    assert a.response_ids == plan + nudge + answer  # the file's config reached the loop
    assert a.response_mask == [1] * len(plan) + [0] * len(nudge) + [1] * len(answer)
    assert a.logprobs == [-0.5] * len(plan) + [0.0] * len(nudge) + [-0.5] * len(answer)
    assert (a.turns, a.ended, a.turn_scores) == (2, ANSWERED, [1.0])
    assert (b.turns, b.ended, b.turn_scores) == (2, ANSWERED, [0.0])
    assert (c.turns, c.ended, c.turn_scores) == (1, ANSWERED, [])


def test_a_loop_asks_for_fewer_tokens_and_the_limits_still_hold(tokenizer, tmp_path):
    (tmp_path / "short.py").write_text(
        textwrap.dedent(
            """
            class Short:
                def __init__(self, config):
                    self.seen = []

                async def run(self, episode):
                    turn = await episode.generate(max_new_tokens=2)
                    self.seen.append((turn.finished, episode.running))
                    while await episode.generate() is not None:
                        episode.add_messages([{"role": "user", "content": "more"}])
            """
        )
    )
    loops = parse_agent_loops(
        [{"name": "short", "class_name": "short.py:Short"}], base_dir=tmp_path
    )
    r = runner(tokenizer, loops, max_turns=3)
    prompts = [r.chat.prompt_ids([{"role": "user", "content": q}]) for q in ("A", "B")]
    script = Script(tokenizer, [["one two three four", "x", "y"], ["long answer here"]])
    short, whole = r.run(
        script, prompts, SamplingParams(max_new_tokens=60), agent_names=["short", "single_turn"]
    )
    # one batch for both first turns: the row that asked for 2 tokens got 2, unfinished,
    # and its episode went on
    assert len(script.requests[0].prompt_ids) == 2
    assert short.response_ids[:2] == enc(tokenizer, "one two three four")[:2]
    assert loops["short"].seen == [(False, True)]
    assert (short.turns, short.ended) == (3, MAX_TURNS)  # then the turn limit ended it
    assert (whole.turns, whole.ended) == (1, ANSWERED)


def test_a_loop_that_fails_stops_the_run_with_its_name_and_row(tokenizer):
    class Broken:
        async def run(self, episode):
            await episode.generate()
            raise KeyError("board")

    class Idle:
        async def run(self, episode):
            return None

    for loops, match in (
        ({"broken": Broken()}, "agent loop 'broken' failed on row 1: KeyError: 'board'"),
        ({"broken": Idle()}, "agent loop 'broken' returned without a model turn"),
    ):
        r = runner(tokenizer, loops)
        prompts = [r.chat.prompt_ids([{"role": "user", "content": q}]) for q in ("A", "B")]
        with pytest.raises(AgentLoopError, match=match):
            r.run(
                Script(tokenizer, [["a", "b", "c"], ["d"]]),
                prompts,
                SamplingParams(max_new_tokens=20),
                agent_names=["tool_agent", "broken"],
            )


def test_an_episode_ends_once_and_generate_says_so(tokenizer):
    seen = {}

    class Twice:
        async def run(self, episode):
            await episode.generate()
            episode.end(LENGTH)
            seen["after_end"] = await episode.generate()
            seen["running"] = episode.running
            with pytest.raises(AgentLoopError, match="end\\('done'\\)"):
                episode.end("done")

    r = runner(tokenizer, {"twice": Twice()})
    prompt = r.chat.prompt_ids([{"role": "user", "content": "A"}])
    script = Script(tokenizer, [["a", "b"]])
    (t,) = r.run(script, [prompt], SamplingParams(max_new_tokens=20), agent_names=["twice"])
    assert seen == {"after_end": None, "running": False}
    assert (t.turns, t.ended, len(script.requests)) == (1, LENGTH, 1)


def test_the_agent_loops_file_is_refused_with_each_problem(tmp_path):
    (tmp_path / "mine.py").write_text(
        "class NotALoop:\n    def __init__(self, config): pass\n    def run(self, episode): pass\n"
    )
    bad = [
        {"name": "tool_agent", "_target_": "mine.py:NotALoop"},
        {"name": "a", "_target_": "recipe.langgraph_agent.MathLoop"},
        {"name": "b", "_target_": "mine.py:NotALoop"},
        {"name": "c", "_target_": "mine.py:Missing"},
        {"name": "d", "_target_": "tool_agent", "config": {"turns": 2}},
    ]
    with pytest.raises(ConfigError) as err:
        parse_agent_loops(bad, source="loops.yaml", base_dir=tmp_path)
    problems = err.value.problems
    assert any("agent_loop[0].name" in p and "built-in" in p for p in problems)
    assert any("agent_loop[1]._target_" in p and "file.py:Class" in p for p in problems)
    assert any("agent_loop[2]._target_" in p and "async def run" in p for p in problems)
    assert any("agent_loop[3]._target_" in p and "Missing" in p for p in problems)
    assert any("agent_loop[4].config" in p and "turns" in p for p in problems)
    with pytest.raises(ConfigError, match="no such file"):
        load_agent_loops(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="non-empty list"):
        parse_agent_loops({"agent_loops": []})


def test_rows_name_a_built_in_or_declared_loop(loops):
    names = ("single_turn", "tool_agent", *loops)
    rows = [
        ("f: row 0", "plan_then_answer", {}),
        ("f: row 1", "plan_then_answr", {}),
        ("f: row 2", None, {}),
    ]
    problems = agent_row_problems(rows, {}, names, "plan_then_answer")
    assert len(problems) == 1
    assert "row 1" in problems[0] and "plan_then_answer" in problems[0]


def test_the_config_takes_a_declared_default_loop_only_with_the_file():
    from engine.config import load_config
    from tests.engine.test_config import REQUIRED

    key = "actor_rollout_ref.rollout.multi_turn"
    on = [*REQUIRED, f"{key}.enable=true", f"{key}.default_agent=plan_then_answer"]
    with pytest.raises(ConfigError, match="agent_loop_config_path") as err:
        load_config([*on, f"{key}.tool_config_path=tools.yaml"])
    assert any(f"{key}.default_agent" in p for p in err.value.problems)
    # with the file (and no tools file: a loop of one's own may need none), the name is
    # checked against the file when the engine starts
    cfg = load_config([*on, f"{key}.agent_loop_config_path=loops.yaml"])
    assert cfg.actor_rollout_ref.rollout.multi_turn.default_agent == "plan_then_answer"
