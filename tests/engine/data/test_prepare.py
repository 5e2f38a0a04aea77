import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from engine.data.sources.gsm8k import final_answer
from engine.data.sources.math_lighteval import last_boxed

REPO = Path(__file__).resolve().parents[3]


def prepare(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "engine.data.prepare", *map(str, args)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})},
    )


def read(path):
    return pq.read_table(path).to_pylist()


def check_schema(rows):
    for r in rows:
        assert set(r) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
        assert r["prompt"][0]["role"] == "user"
        assert r["reward_model"]["style"] == "rule"
        assert isinstance(r["reward_model"]["ground_truth"], str)


GSM8K_TRAIN = [
    {"question": "Tom has 1,200 apples.", "answer": "He has 1,200.\n#### 1,200"},
    {"question": "Ana has 3 pens and buys 4.", "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
    {"question": "Lee owes 5.", "answer": "#### -5"},
]
GSM8K_TEST = [{"question": "What is 2+2?", "answer": "2+2=4\n#### 4"}]


def test_gsm8k_from_local_jsonl(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in GSM8K_TRAIN))
    (src / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in GSM8K_TEST))
    (src / "train_socratic.jsonl").write_text("not json\n")  # another variant: ignored
    out = tmp_path / "out"
    res = prepare("gsm8k", "--local-dir", src, "--out", out)
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in out.iterdir()) == ["train.parquet", "val.parquet"]
    train, val = read(out / "train.parquet"), read(out / "val.parquet")
    check_schema(train + val)
    assert [r["reward_model"]["ground_truth"] for r in train] == ["1200", "7", "-5"]
    assert [r["reward_model"]["ground_truth"] for r in val] == ["4"]
    first = train[0]
    assert first["data_source"] == "openai/gsm8k"
    assert first["ability"] == "math"
    content = first["prompt"][0]["content"]
    assert content.startswith("Tom has 1,200 apples.")
    assert "step by step" in content and '"####"' in content
    assert first["extra_info"] == {
        "split": "train",
        "index": 0,
        "answer": GSM8K_TRAIN[0]["answer"],
        "question": GSM8K_TRAIN[0]["question"],
    }
    assert val[0]["extra_info"]["split"] == "test"


def test_gsm8k_tools_offers_python_in_the_prompt_and_scores_as_gsm8k(tmp_path):
    """The tool recipe's data: GSM8K's rows and ground truth, the prompt telling the model
    it may run Python (the code_interpreter tool the recipe's tools file declares)."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in GSM8K_TRAIN))
    (src / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in GSM8K_TEST))
    out = tmp_path / "out"
    res = prepare("gsm8k_tools", "--local-dir", src, "--out", out)
    assert res.returncode == 0, res.stderr
    train = read(out / "train.parquet")
    check_schema(train)
    assert [r["reward_model"]["ground_truth"] for r in train] == ["1200", "7", "-5"]
    assert {r["data_source"] for r in train} == {"openai/gsm8k"}  # GSM8K's scorer
    content = train[1]["prompt"][0]["content"]
    assert content.startswith("Ana has 3 pens and buys 4.")
    assert "code_interpreter" in content and '"####"' in content


def test_gsm8k_sft_is_conversations_with_the_worked_answer(tmp_path):
    """engine.sft's data: the RL rows' prompt, answered with GSM8K's own solution."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in GSM8K_TRAIN))
    (src / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in GSM8K_TEST))
    out = tmp_path / "out"
    res = prepare("gsm8k_sft", "--local-dir", src, "--out", out)
    assert res.returncode == 0, res.stderr
    user, assistant = read(out / "train.parquet")[1]["messages"]
    assert user["role"] == "user" and user["content"].startswith("Ana has 3 pens and buys 4.")
    assert assistant == {"role": "assistant", "content": GSM8K_TRAIN[1]["answer"]}


def test_gsm8k_from_hub_layout_parquet_with_size_limit(tmp_path):
    # A copy of the hub repository: main/ and socratic/ configs, sharded parquet files.
    for config in ("main", "socratic"):
        (tmp_path / config).mkdir()
        for split, rows in (("train", GSM8K_TRAIN), ("test", GSM8K_TEST)):
            if config == "socratic":
                rows = [{"question": "wrong", "answer": "#### 0"}]
            half = len(rows) // 2 or 1
            for k, shard in enumerate((rows[:half], rows[half:])):
                if shard:
                    name = f"{split}-0000{k}-of-00002.parquet"
                    pq.write_table(pa.Table.from_pylist(shard), tmp_path / config / name)
    out = tmp_path / "out"
    res = prepare("gsm8k", "--local-dir", tmp_path, "--out", out, "--train-size", 2)
    assert res.returncode == 0, res.stderr
    train = read(out / "train.parquet")
    assert [r["reward_model"]["ground_truth"] for r in train] == ["1200", "7"]
    assert [r["reward_model"]["ground_truth"] for r in read(out / "val.parquet")] == ["4"]


def test_math_from_local_parquet(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    train = [
        {
            "problem": "Simplify $\\frac{2}{4}$.",
            "solution": "We get $\\boxed{1}$ first, then $\\boxed{\\frac{1}{2}}$.",
            "level": "Level 1",
            "type": "Algebra",
        },
        {
            "problem": "Which set?",
            "solution": "It is $\\boxed{\\{1, 2\\}}$.",
            "level": "Level 2",
            "type": "Counting",
        },
        {"problem": "No box.", "solution": "The answer is 3.", "level": "Level 1", "type": "X"},
    ]
    test = [{"problem": "p", "solution": "$\\boxed{x^{2}+1}$", "level": "Level 5", "type": "T"}]
    pq.write_table(pa.Table.from_pylist(train), data / "train-00000-of-00001.parquet")
    pq.write_table(pa.Table.from_pylist(test), data / "test-00000-of-00001.parquet")
    out = tmp_path / "out"
    res = prepare("math", "--local-dir", tmp_path, "--out", out)
    assert res.returncode == 0, res.stderr
    assert "skipped 1 rows" in res.stderr
    rows = read(out / "train.parquet")
    check_schema(rows)
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["\\frac{1}{2}", "\\{1, 2\\}"]
    assert rows[0]["data_source"] == "DigitalLearningGmbH/MATH-lighteval"
    assert rows[0]["prompt"][0]["content"] == (
        "Simplify $\\frac{2}{4}$. Let's think step by step and output the final answer "
        "within \\boxed{}."
    )
    assert rows[0]["extra_info"] == {
        "split": "train",
        "index": 0,
        "level": "Level 1",
        "type": "Algebra",
    }
    assert read(out / "val.parquet")[0]["reward_model"]["ground_truth"] == "x^{2}+1"


def test_offline_without_local_dir_is_a_clear_error(tmp_path):
    start = time.monotonic()
    res = prepare("gsm8k", "--out", tmp_path / "out")
    assert time.monotonic() - start < 30
    assert res.returncode == 2
    assert "Traceback" not in res.stderr
    assert "openai/gsm8k" in res.stderr
    assert "Hugging Face Hub cannot be reached" in res.stderr
    assert "--local-dir" in res.stderr
    assert not (tmp_path / "out" / "train.parquet").exists()


def test_local_dir_without_the_split_files(tmp_path):
    (tmp_path / "readme.txt").write_text("x")
    res = prepare("math", "--local-dir", tmp_path, "--out", tmp_path / "out")
    assert res.returncode == 2
    assert "no 'train' split of DigitalLearningGmbH/MATH-lighteval" in res.stderr
    assert "Traceback" not in res.stderr


def test_local_file_missing_source_columns(tmp_path):
    (tmp_path / "train.jsonl").write_text(json.dumps({"question": "q"}) + "\n")
    res = prepare("gsm8k", "--local-dir", tmp_path, "--out", tmp_path / "out")
    assert res.returncode == 2
    assert "missing column(s) answer" in res.stderr


def test_usage_errors_exit_2(tmp_path):
    assert prepare("nosuch", "--out", tmp_path).returncode == 2
    assert prepare("gsm8k").returncode == 2  # --out is required


def test_synthetic(tmp_path):
    out = tmp_path / "syn"
    res = prepare("synthetic", "--out", out, "--train-size", 16, "--val-size", 4)
    assert res.returncode == 0, res.stderr
    train, val = read(out / "train.parquet"), read(out / "val.parquet")
    assert (len(train), len(val)) == (16, 4)
    check_schema(train + val)


def test_prepared_files_load_into_the_dataset(tmp_path, tiny_model_dir):
    from transformers import AutoTokenizer

    from engine.config import DataConfig
    from engine.data import RLDataset

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)

    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in GSM8K_TRAIN))
    (tmp_path / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in GSM8K_TEST))
    res = prepare("gsm8k", "--local-dir", tmp_path, "--out", tmp_path / "out")
    assert res.returncode == 0, res.stderr
    ds = RLDataset([str(tmp_path / "out" / "train.parquet")], tok, DataConfig())
    assert len(ds) == 3
    assert "Tom has 1,200 apples." in tok.decode(ds[0].prompt_ids)
    assert ds[0].ground_truth == "1200"
    assert ds[0].extra_info["index"] == 0


def test_last_boxed():
    assert last_boxed("a \\boxed{1} b \\boxed{\\frac{a}{b^{2}}} c") == "\\frac{a}{b^{2}}"
    assert last_boxed("$\\boxed{\\{x\\}}$") == "\\{x\\}"
    assert last_boxed("so \\boxed 5$.") == "5"
    assert last_boxed("\\fbox{7}") == "7"
    assert last_boxed("\\boxed{unbalanced") is None
    assert last_boxed("no box") is None


def test_final_answer():
    assert final_answer("blah\n#### 1,234,567") == "1234567"
    assert final_answer("#### 3.5 ") == "3.5"
    assert final_answer("no marker") is None
