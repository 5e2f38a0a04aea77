import pyarrow.parquet as pq

from engine.data import synthetic
from engine.reward import get_scorer

COLUMNS = {"data_source", "prompt", "ability", "reward_model", "extra_info"}


def test_writes_train_and_val_in_verl_format(tmp_path):
    train, val = synthetic.write_synthetic_dataset(tmp_path, n_train=64, n_val=16, seed=0)
    assert (train, val) == (tmp_path / "train.parquet", tmp_path / "val.parquet")
    for path, split, n in ((train, "train", 64), (val, "val", 16)):
        table = pq.read_table(path)
        assert set(table.column_names) == COLUMNS
        rows = table.to_pylist()
        assert len(rows) == n
        row = rows[0]
        assert row["data_source"] == synthetic.DATA_SOURCE
        assert row["data_source"].startswith("synthetic/")
        assert row["prompt"][0]["role"] == "user"
        assert row["reward_model"]["style"] == "rule"
        assert [r["extra_info"]["index"] for r in rows] == list(range(n))
        assert {r["extra_info"]["split"] for r in rows} == {split}


def test_same_seed_same_data_other_seed_differs(tmp_path):
    a = synthetic.write_synthetic_dataset(tmp_path / "a", n_train=50, n_val=10, seed=7)
    b = synthetic.write_synthetic_dataset(tmp_path / "b", n_train=50, n_val=10, seed=7)
    c = synthetic.write_synthetic_dataset(tmp_path / "c", n_train=50, n_val=10, seed=8)
    for x, y in zip(a, b, strict=True):
        assert pq.read_table(x).to_pylist() == pq.read_table(y).to_pylist()
    assert pq.read_table(a[0]).to_pylist() != pq.read_table(c[0]).to_pylist()
    # train and val are drawn from different streams
    assert pq.read_table(a[0]).to_pylist()[:10] != pq.read_table(a[1]).to_pylist()


def test_answers_are_right_and_score_one():
    scorer = get_scorer(synthetic.DATA_SOURCE)
    for row in synthetic.make_rows(200, split="train", seed=0):
        truth = row["reward_model"]["ground_truth"]
        assert synthetic.solve(row["prompt"][0]["content"]) == truth
        assert scorer(truth, truth, row["extra_info"])["score"] == 1.0
