"""Conversations as token ids and the SFT loss mask (engine.sft.conversation), written out
by hand: only the assistant's tokens carry the loss, through its end-of-turn token, in
every turn; tool calls and tool replies; templates that re-render earlier turns; the
files (engine.sft.dataset) and the batches the engines take (engine.sft.batches)."""

import json

import pytest

from engine.config.sft_sections import SFTDataConfig
from engine.data.dataset import DataError
from engine.sft.batches import evenly, token_batch
from engine.sft.conversation import Conversation, ConversationError, ConversationTokenizer
from engine.sft.dataset import ConversationDataset


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def by_hand(tokenizer, segments):
    """The ids and mask of (text, carries the loss) segments, each encoded alone."""
    ids, mask = [], []
    for text, loss in segments:
        encoded = tokenizer.encode(text, add_special_tokens=False)
        ids += encoded
        mask += [loss] * len(encoded)
    return ids, mask


MULTI_TURN = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "4"},
]


def test_only_the_assistants_turns_carry_the_loss(tokenizer):
    got = ConversationTokenizer(tokenizer)(MULTI_TURN)
    ids, mask = by_hand(
        tokenizer,
        [
            ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n", 0),
            ("<|im_start|>assistant\n", 0),  # the generation prompt: the prompt's
            ("Hello!<|im_end|>", 1),  # the turn, through its end-of-turn token
            ("\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n", 0),
            ("4<|im_end|>", 1),
            ("\n", 0),  # after the end of turn: the template's, not the model's
        ],
    )
    assert (got.ids, got.loss_mask) == (ids, mask)
    # the whole conversation as the template renders it, tokenized at once: the same ids
    whole = tokenizer.apply_chat_template(MULTI_TURN, tokenize=False)
    assert got.ids == tokenizer.encode(whole, add_special_tokens=False)
    # the prompt before the first turn is the rollout's prompt, id for id
    prompt = tokenizer.apply_chat_template(
        MULTI_TURN[:2], tokenize=False, add_generation_prompt=True
    )
    first = got.loss_mask.index(1)
    assert got.ids[:first] == tokenizer.encode(prompt, add_special_tokens=False)


def test_tool_calls_and_tool_replies(tokenizer):
    """A tool call written in the turn's text is the model's; the tool's reply is not; the
    tools shown to the template are the prompt's."""
    tool = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
    call = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 2}}</tool_call>'
    messages = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": call},
        {"role": "tool", "content": "4"},
        {"role": "assistant", "content": "It is 4."},
    ]
    got = ConversationTokenizer(tokenizer)(messages, tools=[tool])
    trained = tokenizer.decode([t for t, m in zip(got.ids, got.loss_mask, strict=True) if m])
    assert trained == f"{call}<|im_end|>It is 4.<|im_end|>"
    text = tokenizer.decode(got.ids)
    assert "<tools>" in text and "<tool_response>\n4\n</tool_response>" in text


# A template that renders a message's structured tool_calls (Qwen2.5's way, shortened)
STRUCTURED = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ c.function | tojson }}</tool_call>"
    "{% endfor %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_structured_tool_calls_are_the_assistants(tokenizer):
    tokenizer = tokenizer.__class__.from_pretrained(tokenizer.name_or_path)
    tokenizer.chat_template = STRUCTURED
    call = {"type": "function", "function": {"name": "add", "arguments": {"a": 1}}}
    messages = [
        {"role": "user", "content": "1+?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "2"},
        {"role": "assistant", "content": "2"},
    ]
    got = ConversationTokenizer(tokenizer)(messages)
    trained = tokenizer.decode([t for t, m in zip(got.ids, got.loss_mask, strict=True) if m])
    assert (
        trained
        == '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call><|im_end|>2<|im_end|>'
    )


# Like Qwen3's: an assistant turn shows its reasoning only while it is the last turn
REASONING = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.role == 'assistant' and loop.last %}<think>{{ m.reasoning }}</think>{% endif %}"
    "{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_a_template_that_rerenders_earlier_turns_is_refused_unless_asked(tokenizer):
    tokenizer = tokenizer.__class__.from_pretrained(tokenizer.name_or_path)
    tokenizer.chat_template = REASONING
    messages = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b", "reasoning": "r1"},
        {"role": "user", "content": "c"},
        {"role": "assistant", "content": "d", "reasoning": "r2"},
    ]
    with pytest.raises(ConversationError, match="ignore_input_ids_mismatch"):
        ConversationTokenizer(tokenizer)(messages)
    got = ConversationTokenizer(tokenizer, ignore_mismatch=True)(messages)
    # each turn as it was rendered when it was the last: both keep their reasoning
    trained = tokenizer.decode([t for t, m in zip(got.ids, got.loss_mask, strict=True) if m])
    assert trained == "<think>r1</think>b<|im_end|><think>r2</think>d<|im_end|>"
    assert tokenizer.decode(got.ids).count("<|im_start|>user\nc") == 1  # nothing twice


def test_a_conversation_without_the_assistant_is_refused(tokenizer):
    with pytest.raises(ConversationError, match="no assistant turn"):
        ConversationTokenizer(tokenizer)([{"role": "user", "content": "hi"}])


def test_a_batch_starts_its_responses_at_the_first_loss_token(tokenizer):
    conversations = [
        Conversation([5, 6, 7, 8, 9], [0, 0, 1, 0, 1]),
        Conversation([5, 6, 7], [0, 1, 1]),
    ]
    tokens = token_batch(conversations, pad_token_id=0)
    assert tokens.input_ids_BS.tolist() == [[5, 6, 7, 8, 9], [0, 5, 6, 7, 0]]
    assert tokens.response_mask_BR.tolist() == [[1, 0, 1], [1, 1, 0]]
    padded = evenly(conversations[:1], 2)  # a copy that counts nothing
    assert len(padded) == 2 and padded[1].ids == conversations[0].ids
    assert sum(padded[1].loss_mask) == 0


def write_rows(path, rows):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def test_files_tools_and_truncation(tokenizer, tmp_path):
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    chat = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a b c d"}]
    path = write_rows(
        tmp_path / "d.parquet",
        [{"messages": chat, "tools": json.dumps([tool])}, {"messages": chat, "tools": None}],
    )
    data = ConversationDataset([path], tokenizer, SFTDataConfig())
    assert len(data) == 2 and "<tools>" in tokenizer.decode(data[0].ids)
    assert "<tools>" not in tokenizer.decode(data[1].ids)
    n = len(data[1])
    with pytest.raises(DataError, match=r"row 0 is \d+ tokens, over data\.max_length"):
        ConversationDataset([path], tokenizer, SFTDataConfig(max_length=n - 1))
    left = ConversationDataset([path], tokenizer, SFTDataConfig(max_length=4, truncation="left"))
    assert left[1].ids == data[1].ids[-4:] and left.truncated == 2
    right = ConversationDataset([path], tokenizer, SFTDataConfig(max_length=4, truncation="right"))
    assert right[1].ids == data[1].ids[:4]
    assert len(ConversationDataset([path], tokenizer, SFTDataConfig(), max_samples=1)) == 1
    with pytest.raises(DataError, match="missing column"):
        ConversationDataset([path], tokenizer, SFTDataConfig(messages_key="chat"))
