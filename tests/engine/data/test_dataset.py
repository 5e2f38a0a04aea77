import json
import logging

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine.config import DataConfig
from engine.data import DataError, PromptSample, RLDataset
from engine.data.dataset import truncate_ids


class CharTokenizer:
    """One token per character (its code point), so kept tokens can be checked by hand.

    The chat template renders ``<role>content|`` per message and ``@`` as the generation
    prompt.
    """

    chat_template = "fake"
    name_or_path = "char"

    def apply_chat_template(self, chats, *, tokenize, add_generation_prompt):
        assert tokenize is False and add_generation_prompt is True
        return ["".join(f"<{m['role']}>{m['content']}|" for m in chat) + "@" for chat in chats]

    def __call__(self, texts, *, add_special_tokens, return_attention_mask):
        return {"input_ids": [[ord(c) for c in text] for text in texts]}


def decode(ids):
    return "".join(chr(i) for i in ids)


def row(content, truth="1", source="test/src", **extra):
    r = {
        "data_source": source,
        "prompt": [{"role": "user", "content": content}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": truth},
    }
    r.update(extra)
    return r


def write_parquet(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def cfg(**kw):
    return DataConfig(**kw)


# ---------------------------------------------------------------------------
# reading


def test_parquet_with_real_chat_template(tmp_path, tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    path = write_parquet(
        tmp_path / "train.parquet",
        [
            row("Add 3 and 4.", truth="7", extra_info={"split": "train", "index": 0}),
            row("Add 1 and 1.", truth="2", extra_info={"split": "train", "index": 1}),
        ],
    )
    ds = RLDataset([path], tok, cfg())
    assert len(ds) == 2
    s = ds[1]
    assert isinstance(s, PromptSample)
    assert s.index == 1
    assert s.ground_truth == "2"
    assert s.data_source == "test/src"
    assert s.ability == "math"
    assert s.extra_info == {"split": "train", "index": 1}
    assert s.messages == [{"role": "user", "content": "Add 1 and 1."}]
    text = tok.decode(s.prompt_ids)
    assert "Add 1 and 1." in text
    assert text.startswith("<|im_start|>user\n")
    assert text.endswith("<|im_start|>assistant\n")  # the generation prompt
    # Special tokens are single ids, not their characters spelt out.
    assert s.prompt_ids[0] == tok.convert_tokens_to_ids("<|im_start|>")
    assert s.prompt_ids.count(tok.convert_tokens_to_ids("<|im_start|>")) == 2


def test_jsonl_and_several_files_in_order(tmp_path):
    a = write_parquet(tmp_path / "a.parquet", [row("p0", extra_info={"k": 0}), row("p1")])
    b = write_jsonl(tmp_path / "b.jsonl", [row("j0", truth=5), row("j1", truth=[1, 2])])
    ds = RLDataset([a, b], CharTokenizer(), cfg())
    assert len(ds) == 4
    assert [ds[i].messages[0]["content"] for i in range(4)] == ["p0", "p1", "j0", "j1"]
    assert [ds[i].index for i in range(4)] == [0, 1, 2, 3]
    assert ds[2].ground_truth == 5 and ds[3].ground_truth == [1, 2]
    assert ds[0].extra_info == {"k": 0}
    assert ds[2].extra_info == {}  # extra_info is optional
    assert decode(ds[2].prompt_ids) == "<user>j0|@"
    assert ds[-1].index == 3
    with pytest.raises(IndexError):
        ds[4]


def test_single_path_and_custom_prompt_key(tmp_path):
    r = row("x")
    r["question"] = r.pop("prompt")
    path = write_jsonl(tmp_path / "q.jsonl", [r])
    ds = RLDataset(path, CharTokenizer(), cfg(prompt_key="question"))
    assert decode(ds[0].prompt_ids) == "<user>x|@"
    with pytest.raises(DataError, match=r"missing column\(s\) prompt;.*data\.prompt_key"):
        RLDataset(path, CharTokenizer(), cfg())


def test_missing_column_names_file_column_and_present_columns(tmp_path):
    r = row("x")
    del r["reward_model"]
    path = write_parquet(tmp_path / "bad.parquet", [r])
    with pytest.raises(DataError) as err:
        RLDataset([path], CharTokenizer(), cfg())
    msg = str(err.value)
    assert "bad.parquet" in msg
    assert "missing column(s) reward_model" in msg
    assert "columns present: data_source, prompt, ability" in msg


def test_missing_file_and_unsupported_extension(tmp_path):
    good = write_jsonl(tmp_path / "good.jsonl", [row("x")])
    with pytest.raises(DataError, match=r"not found: .*nope\.parquet"):
        RLDataset([good, str(tmp_path / "nope.parquet")], CharTokenizer(), cfg())
    csv = tmp_path / "data.csv"
    csv.write_text("a,b\n")
    with pytest.raises(DataError, match=r"data\.csv: unsupported file type '\.csv'"):
        RLDataset([str(csv)], CharTokenizer(), cfg())


def test_bad_rows_are_reported(tmp_path):
    r = row("x")
    r["reward_model"] = "7"
    path = write_jsonl(tmp_path / "r.jsonl", [row("ok"), r])
    with pytest.raises(DataError, match=r"r\.jsonl: row 1: reward_model"):
        RLDataset([path], CharTokenizer(), cfg())
    r = row("x")
    r["prompt"] = "just text"
    path = write_jsonl(tmp_path / "p.jsonl", [r])
    with pytest.raises(DataError, match=r"p\.jsonl: row 0: column 'prompt' must be"):
        RLDataset([path], CharTokenizer(), cfg())


def test_tokenizer_without_chat_template_is_an_error(tmp_path):
    tok = CharTokenizer()
    tok.chat_template = None
    path = write_jsonl(tmp_path / "a.jsonl", [row("x")])
    with pytest.raises(DataError, match="no chat template"):
        RLDataset([path], tok, cfg())


# ---------------------------------------------------------------------------
# over-long prompts
# "<user>" + content + "|@" is 8 tokens plus the content.


@pytest.fixture
def long_file(tmp_path):
    return write_jsonl(
        tmp_path / "long.jsonl",
        [row("abc"), row("0123456789"), row("xy")],  # 11, 18 and 10 tokens
    )


def test_truncation_left_keeps_the_last_tokens(long_file):
    ds = RLDataset([long_file], CharTokenizer(), cfg(max_prompt_length=12, truncation="left"))
    assert decode(ds[1].prompt_ids) == "0123456789|@"
    assert decode(ds[0].prompt_ids) == "<user>abc|@"  # short prompts are untouched
    assert ds.num_overlong == 1
    assert ds.prompt_lengths().tolist() == [11, 12, 10]


def test_truncation_right_keeps_the_first_tokens(long_file):
    ds = RLDataset([long_file], CharTokenizer(), cfg(max_prompt_length=12, truncation="right"))
    assert decode(ds[1].prompt_ids) == "<user>012345"


def test_truncation_middle_keeps_both_ends(long_file):
    ds = RLDataset([long_file], CharTokenizer(), cfg(max_prompt_length=11, truncation="middle"))
    # ceil(11/2) = 6 tokens from the start, 5 from the end
    assert decode(ds[1].prompt_ids) == "<user>" + "789|@"
    ds = RLDataset([long_file], CharTokenizer(), cfg(max_prompt_length=10, truncation="middle"))
    assert decode(ds[1].prompt_ids) == "<user" + "789|@"


def test_truncate_ids_by_hand():
    ids = list(range(10))
    assert truncate_ids(ids, 4, "left") == [6, 7, 8, 9]
    assert truncate_ids(ids, 4, "right") == [0, 1, 2, 3]
    assert truncate_ids(ids, 4, "middle") == [0, 1, 8, 9]
    assert truncate_ids(ids, 5, "middle") == [0, 1, 2, 8, 9]
    assert truncate_ids(ids, 1, "middle") == [0]
    assert truncate_ids(ids, 10, "middle") == ids
    with pytest.raises(DataError):
        truncate_ids(ids, 4, "sideways")


def test_filter_drops_overlong_prompts_and_renumbers(long_file, caplog):
    with caplog.at_level(logging.WARNING):
        ds = RLDataset(
            [long_file],
            CharTokenizer(),
            cfg(max_prompt_length=11, filter_overlong_prompts=True, truncation="left"),
        )
    assert len(ds) == 2
    assert ds.num_filtered == 1
    assert [ds[i].messages[0]["content"] for i in range(2)] == ["abc", "xy"]
    assert [ds[i].index for i in range(2)] == [0, 1]
    assert decode(ds[1].prompt_ids) == "<user>xy|@"
    assert "dropped 1 of 3 prompts" in caplog.text


def test_error_mode_names_row_length_limit_and_keys(long_file):
    with pytest.raises(DataError) as err:
        RLDataset([long_file], CharTokenizer(), cfg(max_prompt_length=12))
    msg = str(err.value)
    assert "row 1 of" in msg and "long.jsonl" in msg
    assert "18 tokens" in msg
    assert "data.max_prompt_length=12" in msg
    assert "data.filter_overlong_prompts=true" in msg
    assert "data.truncation=left|right|middle" in msg


def test_empty_after_filtering_is_an_error(long_file):
    with pytest.raises(DataError, match="empty after dropping over-long prompts"):
        RLDataset(
            [long_file], CharTokenizer(), cfg(max_prompt_length=5, filter_overlong_prompts=True)
        )


def test_empty_file_is_an_error(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    with pytest.raises(DataError, match="missing column"):
        RLDataset([str(path)], CharTokenizer(), cfg())


def test_unset_message_fields_of_a_parquet_struct_are_dropped(tmp_path):
    # Parquet gives every message every field of the column's struct type, None where unset.
    with_name = row("b")
    with_name["prompt"] = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "b", "name": "ann"},
    ]
    path = write_parquet(tmp_path / "n.parquet", [row("a"), with_name])
    ds = RLDataset([path], CharTokenizer(), cfg())
    assert ds[0].messages == [{"role": "user", "content": "a"}]
    assert ds[1].messages[0] == {"role": "system", "content": "s"}
    assert ds[1].messages[1] == {"role": "user", "content": "b", "name": "ann"}


# ---------------------------------------------------------------------------
# verl's data keys


class ThinkingTokenizer(CharTokenizer):
    """Renders ``/think`` or ``/no_think`` after the prompt, as Qwen3's template does with
    its enable_thinking argument."""

    def apply_chat_template(self, chats, *, tokenize, add_generation_prompt, enable_thinking=True):
        rendered = super().apply_chat_template(
            chats, tokenize=tokenize, add_generation_prompt=add_generation_prompt
        )
        return [text + ("/think" if enable_thinking else "/no_think") for text in rendered]


def test_chat_template_arguments_reach_the_template(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", [row("x")])
    assert decode(RLDataset(path, ThinkingTokenizer(), cfg())[0].prompt_ids).endswith("/think")
    off = cfg(apply_chat_template_kwargs={"enable_thinking": False})
    assert decode(RLDataset(path, ThinkingTokenizer(), off)[0].prompt_ids).endswith("/no_think")


def test_max_samples_keeps_the_first_or_a_seeded_random_choice(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", [row(f"p{i}") for i in range(10)])
    first = RLDataset(path, CharTokenizer(), cfg(shuffle=False), max_samples=3)
    assert [s.messages[0]["content"] for s in map(first.__getitem__, range(3))] == [
        "p0",
        "p1",
        "p2",
    ]
    picked = RLDataset(path, CharTokenizer(), cfg(shuffle=True, seed=5), max_samples=4)
    again = RLDataset(path, CharTokenizer(), cfg(shuffle=True, seed=5), max_samples=4)
    contents = [picked[i].messages[0]["content"] for i in range(4)]
    assert len(picked) == 4 and len(set(contents)) == 4
    assert contents == [again[i].messages[0]["content"] for i in range(4)]
    assert len(RLDataset(path, CharTokenizer(), cfg(), max_samples=-1)) == 10


def test_rows_with_images_are_refused_not_trained_without_them(tmp_path):
    plain = write_parquet(tmp_path / "p.parquet", [row("x", images=[])])
    assert len(RLDataset(plain, CharTokenizer(), cfg())) == 1  # an empty column is fine
    media = write_jsonl(tmp_path / "m.jsonl", [row("x"), row("y", videos=["clip.mp4"])])
    with pytest.raises(DataError, match=r"row 1 has videos in column 'videos' \(data.video_key\)"):
        RLDataset(media, CharTokenizer(), cfg())
