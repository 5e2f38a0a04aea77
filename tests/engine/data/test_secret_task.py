"""The shipped tool task: rows in verl's layout with each row's secret only in the
tool's per-sample keywords, a scorer that reads only the model's last words, and warm-start
transcripts tokenized as the rollout builds trajectories, the loss on the model's turns."""

from __future__ import annotations

import pytest

from engine.data.secret import (
    DATA_SOURCE,
    HIGH,
    LOW,
    REPEAT,
    make_rows,
    tool_answer,
    tool_schema,
    write_secret_task,
)
from engine.reward.registry import get_scorer
from engine.reward.secret import compute_score


def test_each_row_keeps_its_secret_out_of_the_prompt():
    rows = make_rows(200, split="train", seed=0)
    assert rows == make_rows(200, split="train", seed=0)  # deterministic
    secrets = set()
    for row in rows:
        value = row["reward_model"]["ground_truth"]
        secrets.add(value)
        assert row["extra_info"]["tools_kwargs"] == {"secret": {"create_kwargs": {"value": value}}}
        assert row["agent_name"] == "tool_agent"
        assert value not in row["prompt"][0]["content"]
    assert secrets == {str(n) for n in range(LOW, HIGH + 1)}  # a guess is 1 in 10


def test_the_written_tools_file_declares_what_the_warm_start_shows(tmp_path):
    from engine.agents.tools import build_tools, load_tool_specs, tool_schemas
    from engine.agents.tools.sample import tool_kwargs_problems

    paths = write_secret_task(tmp_path, n_train=8, n_val=4)
    specs = load_tool_specs(paths["tools"])
    assert tool_schemas(specs) == [tool_schema()]
    tools = build_tools(specs)
    row = make_rows(1, split="val", seed=0)[0]
    assert tool_kwargs_problems(row["extra_info"], tools, "row 0") == []
    assert tools["secret"].sample_parameters == ({"value"}, {"value"})


@pytest.mark.parametrize(
    ("response", "score"),
    [
        ("7", 1.0),
        ("  7 \n", 1.0),
        ('<tool_call>{"name": "secret", "arguments": {}}</tool_call>\nuser\n'
         f"<tool_response>\n{tool_answer('7')}\n</tool_response>\nassistant\n7", 1.0),
        # the tool said it, the model did not answer: the tool's words do not count
        (f"<tool_call>...</tool_call>\nuser\n<tool_response>\n{tool_answer('7')}\n</tool_response>", 0.0),
        ("3", 0.0),
        ("17", 0.0),
        ("the secret is", 0.0),
        ("", 0.0),
    ],
)  # fmt: skip
def test_the_score_reads_only_the_last_words(response, score):
    assert compute_score(response, "7")["score"] == score
    assert get_scorer(DATA_SOURCE) is compute_score


def test_warm_start_transcripts_train_on_the_models_turns_only(tiny_model_dir):
    """A warm-start transcript as the SFT run tokenizes it: the rollout's own prompt (the
    chat template with the tool), the tool's reply as the rollout continues after a turn,
    and the loss on the call, the answer and their end-of-turn tokens alone."""
    from transformers import AutoTokenizer

    from engine.agents.chat import ChatFormat
    from engine.sft.conversation import ConversationTokenizer
    from engine.warmup.secret import CALL, transcript

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    chat = ChatFormat(tokenizer, [tool_schema()])
    eos = tokenizer.eos_token
    messages = transcript("What is the secret number?", 7, use_tool=True, guess=3)
    got = ConversationTokenizer(tokenizer)(messages, tools=[tool_schema()])
    trained = [t for t, m in zip(got.ids, got.loss_mask, strict=True) if m]
    assert tokenizer.decode(trained) == f"{CALL}{eos}7{eos}"
    call = tokenizer.encode(CALL + eos, add_special_tokens=False)
    reply = chat.continuation_ids([messages[2]])
    answer = tokenizer.encode(f"7{eos}", add_special_tokens=False)
    rollout = chat.prompt_ids(messages[:1]) + call + reply + answer
    assert got.ids[: len(rollout)] == rollout  # then the template's newline, no loss
    assert tool_answer("7") in tokenizer.decode(got.ids)
    assert tokenizer.decode(got.ids).count("7") >= REPEAT + 1
    guessed = ConversationTokenizer(tokenizer)(
        transcript("What is the secret number?", 7, use_tool=False, guess=3), tools=[tool_schema()]
    )
    assert CALL not in tokenizer.decode(guessed.ids)
    assert sum(guessed.loss_mask) == 2  # a digit and the end of the turn
