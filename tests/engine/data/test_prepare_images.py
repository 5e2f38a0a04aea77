"""Preparations with images (engine.data.prepare): Geometry3K from its own files, offline,
into verl's layout (read back with a vision-language model's processor), and the
synthetic shapes task; Geometry3K's scorer."""

import io

import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image
from transformers import AutoConfig, AutoTokenizer

from engine.config import DataConfig
from engine.data import RLDataset
from engine.data.prepare import prepare
from engine.data.sources.geo3k import DATA_SOURCE, INSTRUCTION
from engine.models.processor import load_vision_processor
from engine.reward.registry import get_scorer


def png(size):
    out = io.BytesIO()
    Image.new("RGB", size, (255, 255, 255)).save(out, format="PNG")
    return {"bytes": out.getvalue(), "path": "diagram.png"}


def test_geo3k_from_local_files_reads_back_with_its_images(tmp_path, tiny_vl_model_dir):
    src = tmp_path / "geometry3k" / "data"
    src.mkdir(parents=True)
    train = [
        {"images": [png((56, 56))], "problem": "<image>Find x.", "answer": "3"},
        {"images": [png((84, 56))], "problem": "<image>Find y.", "answer": "2\\sqrt{3}"},
        {"images": [png((56, 56))], "problem": "No placeholder.", "answer": "1"},  # skipped
    ]
    test = [{"images": [png((28, 28))], "problem": "<image>Find z.", "answer": "45"}]
    for name, rows in (("train-00000-of-00001", train), ("test-00000-of-00001", test)):
        pq.write_table(pa.Table.from_pylist(rows), src / f"{name}.parquet")
    paths = prepare("geo3k", tmp_path / "out", local_dir=tmp_path / "geometry3k")
    rows = pq.read_table(paths["train"]).to_pylist()
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["3", "2\\sqrt{3}"]
    assert rows[0]["prompt"] == [{"role": "user", "content": f"<image>Find x. {INSTRUCTION}"}]
    assert rows[0]["images"] == [train[0]["images"][0]] and rows[0]["data_source"] == DATA_SOURCE
    tokenizer = AutoTokenizer.from_pretrained(tiny_vl_model_dir)
    processor = load_vision_processor(
        tiny_vl_model_dir, tokenizer, AutoConfig.from_pretrained(tiny_vl_model_dir)
    )
    data = RLDataset(str(paths["train"]), tokenizer, DataConfig(), processor=processor)
    assert [data[i].images.image_grid_thw_N3.tolist() for i in range(2)] == [
        [[1, 4, 4]],
        [[1, 4, 6]],
    ]
    val = RLDataset(str(paths["val"]), tokenizer, DataConfig(), processor=processor)
    assert val[0].prompt_ids.count(processor.image_token_id) == 1


def test_shapes_is_a_preparation(tmp_path):
    paths = prepare("shapes", tmp_path, train_size=4, val_size=2)
    assert [len(pq.read_table(paths[s])) for s in ("train", "val")] == [4, 2]


def test_geo3k_scorer_pays_the_answer_and_the_format():
    score = get_scorer(DATA_SOURCE)
    assert score("<think>angles</think> so \\boxed{3}", "3")["score"] == 1.0
    assert score("it is \\boxed{3.0}", "3")["score"] == 0.9
    assert score("<think>hmm</think> \\boxed{4}", "3")["score"] == 0.1
    assert score("no answer", "3")["score"] == 0.0
