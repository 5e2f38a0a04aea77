"""Prompts with images in verl's layout (engine.data.images, RLDataset with a vision
model's processor): the image column's cells, <image> placeholders, pad tokens expanded
per merged patch, pixel values made when a row is read; and the shapes task's data."""

import io
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image
from transformers import AutoConfig, AutoTokenizer

from engine.config import DataConfig
from engine.data import DataError, RLDataset, shapes
from engine.models.processor import load_vision_processor
from engine.reward.shapes import compute_score


@pytest.fixture(scope="module")
def tokenizer(tiny_vl_model_dir):
    return AutoTokenizer.from_pretrained(tiny_vl_model_dir)


@pytest.fixture(scope="module")
def processor(tiny_vl_model_dir, tokenizer):
    return load_vision_processor(
        tiny_vl_model_dir, tokenizer, AutoConfig.from_pretrained(tiny_vl_model_dir)
    )


def png(size=(56, 56), colour=(200, 30, 30)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, colour).save(out, format="PNG")
    return out.getvalue()


def row(content, images=None, truth="red"):
    r = {
        "data_source": shapes.DATA_SOURCE,
        "prompt": [{"role": "user", "content": content}],
        "ability": "vision",
        "reward_model": {"style": "rule", "ground_truth": truth},
    }
    if images is not None:
        r["images"] = images
    return r


def write_parquet(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def test_verl_layout_expands_pads_and_makes_pixels(tmp_path, tokenizer, processor):
    path = write_parquet(
        tmp_path / "d.parquet",
        [
            row("<image>Which?", [{"bytes": png(), "path": None}]),
            row(
                "Left <image>, right <image>.", [{"bytes": png((28, 28))}, {"bytes": png((84, 56))}]
            ),
            row("No image."),  # a text row beside them: its cell is null
        ],
    )
    data = RLDataset(path, tokenizer, DataConfig(max_prompt_length=64), processor=processor)
    pad = processor.image_token_id
    one, two, text = data[0], data[1], data[2]
    assert one.prompt_ids.count(pad) == 4  # 56 x 56: 4 x 4 patches, merged 2 x 2
    assert one.images.image_grid_thw_N3.tolist() == [[1, 4, 4]]
    assert one.images.pixel_values_PD.shape == (16, 1176)
    assert one.images.positions_3P.shape == (3, len(one.prompt_ids))
    assert two.prompt_ids.count(pad) == 1 + 6  # 28 x 28: one merged patch; 84 x 56: 3 x 2
    assert two.images.image_grid_thw_N3.tolist() == [[1, 2, 2], [1, 4, 6]]
    assert text.images is None and pad not in text.prompt_ids
    assert one.messages == [{"role": "user", "content": "<image>Which?"}]  # the raw chat
    rendered = tokenizer.decode(one.prompt_ids)
    assert rendered.startswith("<|im_start|>user\n<|vision_start|>" + "<|image_pad|>" * 4)


def test_paths_and_jsonl(tmp_path, tokenizer, processor):
    (tmp_path / "a.png").write_bytes(png())
    rows = [
        row("<image>?", [str(tmp_path / "a.png")]),
        row("<image>?", [{"path": f"file://{tmp_path / 'a.png'}", "bytes": None}]),
    ]
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = RLDataset(str(path), tokenizer, DataConfig(), processor=processor)
    assert torch.equal(data[0].images.pixel_values_PD, data[1].images.pixel_values_PD)


def test_bad_image_rows_name_the_row(tmp_path, tokenizer, processor):
    cases = [
        (row("No placeholder.", [{"bytes": png()}]), "1 image\\(s\\) but 0 <image> placeholder"),
        (row("<image><image>", [{"bytes": png()}]), "1 image\\(s\\) but 2 <image>"),
        (row("<image>", [{"bytes": b"not a png"}]), "not a readable image"),
        (
            row("<image>", ["https://example.com/a.png"]),
            "image 'https://example.com/a.png' is a URL",
        ),
        (row("<image>", [str(tmp_path / "missing.png")]), "image file not found"),
    ]
    for i, (bad, message) in enumerate(cases):
        fine = row("fine") | {"images": None}  # the column's type is the bad row's
        path = write_parquet(tmp_path / f"{i}.parquet", [fine, bad])
        with pytest.raises(DataError, match=f"row 1: .*{message}"):
            RLDataset(path, tokenizer, DataConfig(), processor=processor)


def test_a_text_only_model_refuses_images(tmp_path, tokenizer):
    path = write_parquet(tmp_path / "d.parquet", [row("<image>?", [{"bytes": png()}])])
    with pytest.raises(DataError, match=r"row 0 has images in column 'images' \(data.image_key\)"):
        RLDataset(path, tokenizer, DataConfig())
    other = write_parquet(
        tmp_path / "o.parquet", [row("<image>?", [], truth="x") | {"pics": [{"bytes": png()}]}]
    )
    with pytest.raises(DataError, match="column 'pics'"):
        RLDataset(other, tokenizer, DataConfig(image_key="pics"))


def test_overlong_prompts_with_images_are_never_cut(tmp_path, tokenizer, processor):
    path = write_parquet(
        tmp_path / "d.parquet", [row("<image>" + " word" * 40, [{"bytes": png()}]), row("short")]
    )
    with pytest.raises(DataError, match="cutting them would cut an image"):
        RLDataset(
            path,
            tokenizer,
            DataConfig(max_prompt_length=20, truncation="left"),
            processor=processor,
        )
    kept = RLDataset(
        path,
        tokenizer,
        DataConfig(max_prompt_length=20, filter_overlong_prompts=True),
        processor=processor,
    )
    assert len(kept) == 1 and kept[0].images is None


def test_shapes_task_rows_and_scorer(tmp_path):
    train, _ = shapes.write_shapes_dataset(tmp_path, n_train=8, n_val=2)
    rows = pq.read_table(train).to_pylist()
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["red", "blue"] * 4
    assert all(r["prompt"][0]["content"].count("<image>") == len(r["images"]) == 1 for r in rows)
    for r in rows:  # the larger square's colour covers more of the image
        image = Image.open(io.BytesIO(r["images"][0]["bytes"])).convert("RGB")
        pixels = np.asarray(image)
        counts = {c: int((pixels == rgb).all(-1).sum()) for c, rgb in shapes.COLOURS.items()}
        assert max(counts, key=counts.get) == r["reward_model"]["ground_truth"]
    _, blank_val = shapes.write_shapes_dataset(tmp_path / "blank", n_train=2, n_val=2, blank=True)
    blank = Image.open(io.BytesIO(pq.read_table(blank_val).to_pylist()[0]["images"][0]["bytes"]))
    assert (np.asarray(blank.convert("RGB")) == 255).all()
    assert compute_score("red", "red") == {"score": 1.0, "acc": 1.0, "pred": "red"}
    assert compute_score(" Blue!", "red") == {"score": -1.0, "acc": 0.0, "pred": "blue"}
    assert compute_score("redblue", "red")["score"] == 1.0  # the colour it starts with
    assert compute_score("green", "red") == {"score": 0.0, "acc": 0.0}
