"""The multi-turn agent loop: the model's tokens kept as sampled, the environment's
tokens masked out, exact to the token, on the tiny model's real tokenizer and chat
template and the real calculator tool. The generator is a script of turns (what a model
would sample), so every mask and length below is computed by hand."""

from __future__ import annotations

import pytest

from engine.agents.chat import ChatFormat
from engine.agents.loop import AgentRunner
from engine.agents.tools import build_tools, get_tool_call_parser, parse_tool_specs, tool_schemas
from engine.agents.trajectory import ANSWERED, LENGTH, MAX_TURNS, AgentLimits
from engine.errors import ConfigError
from engine.models.tiny import build_tokenizer
from engine.types import GenerationOutput, GenerationRequest, SamplingParams


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module")
def specs():
    return parse_tool_specs({"tools": [{"name": "calculator"}]})


class Script:
    """A rollout engine that answers each request's rows with the next scripted turn of
    that row's conversation (text, tokenized, ended with the end-of-turn token unless
    ``cut``), and records what it was asked."""

    def __init__(self, tokenizer, turns_per_row: list[list[str]], cut: set[tuple[int, int]] = ()):
        self.tok, self.turns, self.cut = tokenizer, turns_per_row, set(cut)
        self.requests: list[GenerationRequest] = []
        self.asked: dict[int, int] = {}
        self.rows: dict[tuple[int, ...], int] = {}

    def generate(self, request: GenerationRequest) -> GenerationOutput:
        self.requests.append(request)
        ids, finished, logprobs = [], [], []
        for prompt in request.prompt_ids:
            row = self._row(prompt)
            turn = self.asked.get(row, 0)
            self.asked[row] = turn + 1
            tokens = self.tok.encode(self.turns[row][turn], add_special_tokens=False)
            done = (row, turn) not in self.cut
            if done:
                tokens = [*tokens, self.tok.eos_token_id]
            tokens = tokens[: request.sampling.max_new_tokens]
            ids.append(tokens)
            finished.append(done and tokens[-1] == self.tok.eos_token_id)
            logprobs.append([-0.5 - row] * len(tokens))
        return GenerationOutput(ids, finished, logprobs)

    def _row(self, prompt: list[int]) -> int:
        for start, row in self.rows.items():
            if tuple(prompt[: len(start)]) == start:
                return row
        row = len(self.rows)
        self.rows[tuple(prompt)] = row
        return row


def _agent(tokenizer, specs, **limits) -> AgentRunner:
    return AgentRunner(
        ChatFormat(tokenizer, tool_schemas(specs)),
        get_tool_call_parser("hermes"),
        build_tools(specs),
        AgentLimits(**limits),
    )


CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "17*23"}}</tool_call>'


def test_a_two_turn_trajectory_masks_exactly_the_tool_tokens(tokenizer, specs):
    agent = _agent(tokenizer, specs)
    prompt = agent.chat.prompt_ids([{"role": "user", "content": "What is 17*23?"}])
    script = Script(tokenizer, [[CALL, "The answer is 391."]])
    (t,) = agent.run(script, [prompt], SamplingParams(max_new_tokens=200))

    eos = tokenizer.eos_token_id
    first = [*tokenizer.encode(CALL, add_special_tokens=False), eos]
    tool = tokenizer.encode(
        "\n<|im_start|>user\n<tool_response>\n391\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n",
        add_special_tokens=False,
    )
    second = [*tokenizer.encode("The answer is 391.", add_special_tokens=False), eos]
    assert t.prompt_ids == prompt
    assert t.response_ids == first + tool + second
    assert t.response_mask == [1] * len(first) + [0] * len(tool) + [1] * len(second)
    assert t.logprobs == [-0.5] * len(first) + [0.0] * len(tool) + [-0.5] * len(second)
    assert (t.turns, t.ended, t.finished) == (2, ANSWERED, True)
    assert (t.tool_calls, t.tool_errors, t.tool_timeouts) == (1, 0, 0)
    # the second turn was asked with the model's own tokens and the tool's, as they are
    assert script.requests[1].prompt_ids == [prompt + first + tool]
    # the whole trajectory decodes as the chat template renders the conversation
    conversation = [
        {"role": "user", "content": "What is 17*23?"},
        {"role": "assistant", "content": CALL},
        {"role": "tool", "content": "391"},
        {"role": "assistant", "content": "The answer is 391."},
    ]
    rendered = tokenizer.apply_chat_template(
        conversation, tools=tool_schemas(specs), tokenize=False
    )
    assert tokenizer.decode(t.prompt_ids + t.response_ids) + "\n" == rendered


def test_rows_run_together_and_end_each_for_its_own_reason(tokenizer, specs):
    agent = _agent(tokenizer, specs, max_turns=2, max_response_tokens=400)
    prompts = [agent.chat.prompt_ids([{"role": "user", "content": f"go {i}"}]) for i in "abcd"]
    bad = '<tool_call>{"name": "calculator", "arguments": {"expression": "1+"}</tool_call>'
    script = Script(
        tokenizer,
        [
            ["no tools needed"],  # answers at once
            [CALL, CALL],  # calls twice: the turn limit
            [bad, "sorry"],  # a malformed call: told, then answers
            ["this turn is cut"],  # no end-of-turn token: cut
        ],
        cut={(3, 0)},
    )
    answered, limited, malformed, cut = agent.run(script, prompts, SamplingParams())
    assert (answered.ended, answered.turns, answered.tool_calls) == (ANSWERED, 1, 0)
    assert set(answered.response_mask) == {1}
    assert (limited.ended, limited.turns, limited.tool_calls) == (MAX_TURNS, 2, 1)
    assert (malformed.ended, malformed.turns, malformed.tool_errors) == (ANSWERED, 2, 1)
    assert (cut.ended, cut.turns, cut.finished) == (LENGTH, 1, False)
    # two requests: every row in the first, then only the two that called a tool
    assert [len(r.prompt_ids) for r in script.requests] == [4, 2]


def test_the_token_budget_cuts_a_turn_and_refuses_a_tool_result_that_does_not_fit(tokenizer, specs):
    prompt = [1, 2, 3]
    call = [*tokenizer.encode(CALL, add_special_tokens=False), tokenizer.eos_token_id]
    # room for the call and part of the tool's answer: the trajectory ends there
    agent = _agent(tokenizer, specs, max_response_tokens=len(call) + 3)
    (t,) = agent.run(Script(tokenizer, [[CALL, "x"]]), [prompt], SamplingParams())
    assert (t.ended, t.response_ids, t.response_mask) == (LENGTH, call, [1] * len(call))
    # a budget smaller than the first turn: the turn is cut, and the engine was asked
    # for no more than the budget
    agent = _agent(tokenizer, specs, max_response_tokens=5)
    script = Script(tokenizer, [[CALL]])
    (t,) = agent.run(script, [prompt], SamplingParams(max_new_tokens=512))
    assert (t.ended, len(t.response_ids)) == (LENGTH, 5)
    assert script.requests[0].sampling.max_new_tokens == 5


def test_a_chat_template_that_cannot_continue_a_conversation_is_refused(tokenizer):
    class Shuffled:
        eos_token = tokenizer.eos_token

        def apply_chat_template(self, messages, **_):
            return "".join(m["content"] for m in reversed(messages)) + self.eos_token

    with pytest.raises(ConfigError, match="does not render the messages after an assistant turn"):
        ChatFormat(Shuffled())


def test_single_turn_rows_beside_tool_rows_read_no_calls(tokenizer, specs):
    """A dataset's agent_name column mixes loops: a single_turn row that writes a tool
    call is answered as without tools (one turn, nothing run)."""
    agent = _agent(tokenizer, specs)
    prompts = [agent.chat.prompt_ids([{"role": "user", "content": f"q {i}"}]) for i in "ab"]
    script = Script(tokenizer, [[CALL], [CALL, "391"]])
    one, tool = agent.run(
        script, prompts, SamplingParams(), agent_names=["single_turn", "tool_agent"]
    )
    assert (one.ended, one.turns, one.tool_calls, set(one.response_mask)) == (ANSWERED, 1, 0, {1})
    assert (tool.ended, tool.turns, tool.tool_calls) == (ANSWERED, 2, 1)


def test_the_output_and_metrics_of_a_batch_of_trajectories(tokenizer, specs):
    from engine.agents.loop import as_generation_output
    from engine.agents.metrics import agent_metrics
    from engine.types import TokenBatch

    agent = _agent(tokenizer, specs)
    prompts = [agent.chat.prompt_ids([{"role": "user", "content": f"q {i}"}]) for i in "ab"]
    trajectories = agent.run(Script(tokenizer, [[CALL, "391"], ["no"]]), prompts, SamplingParams())
    out = as_generation_output(trajectories, logprobs=True)
    assert out.finished == [True, True] and out.response_mask[1] == [1] * len(out.response_ids[1])
    tokens = TokenBatch.from_ragged(prompts, out.response_ids, 0, out.response_mask)
    # the losses' mask is the agent's, padded with 0; the model attends to every token
    row = tokens.response_mask_BR[0, : len(out.response_ids[0])].tolist()
    assert row == [float(m) for m in out.response_mask[0]]
    assert tokens.attention_mask_BS[0, -tokens.response_length :].sum() == len(out.response_ids[0])
    m = agent_metrics(out.agent_stats, out.response_mask)
    model_tokens = sum(map(sum, out.response_mask))
    assert m["agent/turns_mean"] == 1.5 and m["agent/turns_max"] == 2.0
    assert m["agent/tool_calls_mean"] == 0.5 and m["agent/tool_call_rate"] == 0.5
    assert m["agent/response_tokens_per_turn"] == model_tokens / 3
    assert (m["agent/tool_errors"], m["agent/tool_timeouts"]) == (0, 0)
    assert as_generation_output(trajectories, logprobs=False).logprobs is None


# ---------------------------------------------------------------- issue 30: the loop's edges


class Counting:
    """The calculator, counting what it really ran."""

    def __init__(self, specs):
        self.runs = 0
        self.inner = build_tools(specs)["calculator"]
        self.name, self.schema = self.inner.name, self.inner.schema

    async def call(self, arguments, sample=None):
        self.runs += 1
        return await self.inner.call(arguments)


def _counting_agent(tokenizer, specs, **limits):
    tool = Counting(specs)
    agent = AgentRunner(
        ChatFormat(tokenizer, tool_schemas(specs)),
        get_tool_call_parser("hermes"),
        {"calculator": tool},
        AgentLimits(**limits),
    )
    return agent, tool


def test_a_call_in_a_turn_that_fills_the_budget_is_not_run(tokenizer, specs):
    """A finished turn that exactly fills the budget leaves no room for any result: its
    call must not run (it ran, and its result was thrown away)."""
    call = [*tokenizer.encode(CALL, add_special_tokens=False), tokenizer.eos_token_id]
    agent, tool = _counting_agent(tokenizer, specs, max_response_tokens=len(call))
    (t,) = agent.run(Script(tokenizer, [[CALL, "x"]]), [[1, 2, 3]], SamplingParams())
    assert (t.ended, t.response_ids) == (LENGTH, call)
    assert tool.runs == 0 and t.tool_calls == 0


def test_tool_calls_count_exactly_the_calls_that_ran(tokenizer, specs):
    unknown = '<tool_call>{"name": "calculater", "arguments": {"expression": "1"}}</tool_call>'
    bad = '<tool_call>{"name": "calculator", "arguments": {"expr": "1"}}</tool_call>'
    agent, tool = _counting_agent(tokenizer, specs)
    prompt = agent.chat.prompt_ids([{"role": "user", "content": "go"}])
    (t,) = agent.run(
        Script(tokenizer, [[CALL + unknown + bad + CALL, "done"]]), [prompt], SamplingParams()
    )
    assert tool.runs == 2
    assert (t.tool_calls, t.tool_errors) == (2, 2)


def test_calls_written_with_special_tokens_are_read(tokenizer, specs):
    """A tokenizer that marks <tool_call> special: the turn's text keeps the tags (it was
    decoded with the special tokens skipped, and every call was lost without a word)."""
    from engine.models.tiny import build_tokenizer

    special = build_tokenizer()
    special.add_special_tokens({"additional_special_tokens": ["<tool_call>", "</tool_call>"]})
    assert special.convert_tokens_to_ids("<tool_call>") in special.encode(CALL)
    agent, tool = _counting_agent(special, specs)
    prompt = agent.chat.prompt_ids([{"role": "user", "content": "17*23?"}])
    (t,) = agent.run(Script(special, [[CALL, "391"]]), [prompt], SamplingParams())
    assert tool.runs == 1 and (t.turns, t.tool_calls, t.ended) == (2, 1, ANSWERED)


def test_max_user_turns_bounds_the_environments_turns(tokenizer, specs):
    agent, tool = _counting_agent(tokenizer, specs, max_turns=4, max_user_turns=1)
    prompt = agent.chat.prompt_ids([{"role": "user", "content": "go"}])
    (t,) = agent.run(Script(tokenizer, [[CALL, CALL, "x"]]), [prompt], SamplingParams())
    # one tool result came back; the second turn's call was not run: no turn to answer it
    assert (t.turns, t.ended, tool.runs, t.tool_calls) == (2, MAX_TURNS, 1, 1)


QWEN3_LIKE = (
    # A ChatML template that, as Qwen3's published one does, renders the assistant turn
    # after the last user query differently when it is the last message (with an empty
    # think block): a conversation is then not a prefix of its continuation.
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' and loop.last %}"
    "{{- '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content"
    " + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def test_a_template_that_renders_the_last_assistant_turn_apart_is_accepted(specs):
    from engine.models.tiny import build_tokenizer

    qwen3 = build_tokenizer()
    qwen3.chat_template = QWEN3_LIKE
    agent, tool = _counting_agent(qwen3, specs)
    prompt = agent.chat.prompt_ids([{"role": "user", "content": "17*23?"}])
    (t,) = agent.run(Script(qwen3, [[CALL, "391"]]), [prompt], SamplingParams())
    tool_part = qwen3.encode(
        "\n<|im_start|>user\n<tool_response>\n391\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n",
        add_special_tokens=False,
    )
    first = [*qwen3.encode(CALL, add_special_tokens=False), qwen3.eos_token_id]
    assert t.response_ids[len(first) : len(first) + len(tool_part)] == tool_part
    assert tool.runs == 1 and t.ended == ANSWERED


def test_max_user_turns_is_a_config_key_with_its_rule(tmp_path):
    from engine.config.load import load_config

    key = "actor_rollout_ref.rollout.multi_turn"
    tools = tmp_path / "tools.yaml"
    tools.write_text("tools:\n  - name: calculator\n")
    base = [
        "data.train_files=x.parquet",
        "actor_rollout_ref.model.path=m",
        f"{key}.enable=true",
        f"{key}.tool_config_path={tools}",
    ]
    assert load_config(base).actor_rollout_ref.rollout.multi_turn.max_user_turns is None
    assert (
        load_config(
            [*base, f"{key}.max_user_turns=3"]
        ).actor_rollout_ref.rollout.multi_turn.max_user_turns
        == 3
    )
    with pytest.raises(ConfigError, match=f"{key}.max_user_turns must be a positive integer"):
        load_config([*base, f"{key}.max_user_turns=0"])
