"""``data.custom_cls.path``/``name`` (verl's keys): a dataset class of your own, loaded
from its file and built with RLDataset's arguments; a missing file or class, or a class
that is not a dataset of this engine, refused naming the key."""

import textwrap

import pytest
from test_dataset import CharTokenizer, decode, row, write_parquet

from engine.config import DataConfig, load_config
from engine.config.data import CustomDatasetClass
from engine.data import DataError, RLDataset
from engine.data.custom import build_dataset, dataset_class

# A class of its own (not RLDataset's): each line of a text file is a prompt, its
# answer after "=". Records what it was built with.
LINES = """
    from engine.data import PromptSample

    BUILT = []


    class Lines:
        def __init__(self, files, tokenizer, cfg, tools=(), max_samples=-1):
            BUILT.append((files, tokenizer, cfg, tools, max_samples))
            self.rows = [
                line.split("=") for f in files for line in open(f).read().split()
            ]
            self.tokenizer = tokenizer

        def __len__(self):
            return len(self.rows)

        def __getitem__(self, index):
            question, answer = self.rows[index]
            ids = self.tokenizer([question], add_special_tokens=False,
                                 return_attention_mask=False)["input_ids"][0]
            return PromptSample(index, ids, [{"role": "user", "content": question}],
                                "lines", answer, "math")

        def agent_rows(self):
            for i in range(len(self)):
                yield f"row {i}", None, {}

        def data_sources(self):
            return {"lines"}
"""


def _write(tmp_path, body, name="mine.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def _cfg(path, name, **kw):
    return DataConfig(custom_cls=CustomDatasetClass(path, name), **kw)


def test_a_class_of_its_own_is_built_with_rldatasets_arguments(tmp_path):
    import sys

    data = tmp_path / "q.txt"
    data.write_text("2+2=4\n3*3=9\n")
    cfg = _cfg(_write(tmp_path, LINES), "Lines", max_prompt_length=8)
    tokenizer = CharTokenizer()
    dataset = build_dataset(cfg, [str(data)], tokenizer, [{"name": "t"}], max_samples=5)
    assert type(dataset).__name__ == "Lines"
    module = sys.modules[type(dataset).__module__]
    assert [([str(data)], tokenizer, cfg, [{"name": "t"}], 5)] == module.BUILT
    assert len(dataset) == 2 and dataset.data_sources() == {"lines"}
    second = dataset[1]
    assert decode(second.prompt_ids) == "3*3" and second.ground_truth == "9"


def test_a_subclass_of_rldataset(tmp_path):
    body = """
        from engine.data import RLDataset

        class Upper(RLDataset):
            def __getitem__(self, index):
                sample = super().__getitem__(index)
                sample.ground_truth = sample.ground_truth.upper()
                return sample
    """
    files = [write_parquet(tmp_path / "d.parquet", [row("hi", truth="abc"), row("yo")])]
    dataset = build_dataset(_cfg(_write(tmp_path, body), "Upper"), files, CharTokenizer())
    assert isinstance(dataset, RLDataset) and type(dataset).__name__ == "Upper"
    assert [dataset[i].ground_truth for i in range(2)] == ["ABC", "1"]
    assert decode(dataset[0].prompt_ids) == "<user>hi|@"


def test_unset_is_the_engines_own():
    assert dataset_class(DataConfig()) is RLDataset


@pytest.mark.parametrize(
    ("body", "name", "expected"),
    [
        (None, "Lines", "data.custom_cls.path '{missing}' is not a file"),
        (LINES, "Line", "has no class 'Line' (set data.custom_cls.name; callables in the file:"),
        ("def Lines(*a): pass\n", "Lines", "data.custom_cls.name='Lines' ({path}) is a function, not a class"),
        ("VALUE = 3\n", "VALUE", "data.custom_cls.name 'VALUE' in"),
        (
            "class Rows:\n    def __len__(self): return 1\n    def __getitem__(self, i): pass\n",
            "Rows",
            "data.custom_cls.name='Rows' ({path}) is not a dataset of this engine: it lacks"
            " agent_rows, data_sources",
        ),
        ("raise ImportError('no torch_npu')\n", "X", "importing data.custom_cls.path"),
    ],
)  # fmt: skip
def test_a_missing_file_or_class_or_not_a_dataset_names_the_key(tmp_path, body, name, expected):
    path = str(tmp_path / "missing.py") if body is None else _write(tmp_path, body)
    with pytest.raises(DataError) as err:
        dataset_class(_cfg(path, name))
    assert expected.format(path=path, missing=path) in str(err.value)


def _items(tmp_path, item):
    """A dataset class whose one item is ``item`` (a Python expression)."""
    body = LINES.replace(
        "        def __getitem__(self, index):",
        f"        def __getitem__(self, index):\n            return {item}\n\n        def _old(self, index):",
    )
    data = tmp_path / "q.txt"
    data.write_text("2+2=4\n")
    return _cfg(_write(tmp_path, body), "Lines", max_prompt_length=4), [str(data)]


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        # verl's RLHFDataset items: dicts of tensors
        ("{'input_ids': [1, 2]}", "item 0 is a dict; the engine reads engine.data.PromptSample"),
        (
            "PromptSample(3, [1], [], 's', '4', 'math')",
            "item 0 has index 3; give each its position",
        ),
        (
            "PromptSample(0, [1] * 5, [], 's', '4', 'math')",
            "item 0 has 5 prompt tokens; give 1 to data.max_prompt_length=4",
        ),
    ],
)
def test_each_item_is_checked_when_built(tmp_path, item, expected):
    cfg, files = _items(tmp_path, item)
    with pytest.raises(DataError) as err:
        build_dataset(cfg, files, CharTokenizer())
    assert f"data.custom_cls.name='Lines': {expected}" in str(err.value)


def test_verls_keys_load_and_name_needs_path():
    base = ["actor_rollout_ref.model.path=m", "data.train_files=t"]
    cfg = load_config([*base, "data.custom_cls.path=ds.py", "data.custom_cls.name=MyDataset"])
    assert (cfg.data.custom_cls.path, cfg.data.custom_cls.name) == ("ds.py", "MyDataset")
    from engine.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        load_config([*base, "data.custom_cls.path=ds.py"])
    assert "data.custom_cls.path='ds.py' needs data.custom_cls.name" in str(err.value)
    with pytest.raises(ConfigError) as err:
        load_config([*base, "data.custom_cls.name=X"])
    assert "data.custom_cls.name='X' needs data.custom_cls.path" in str(err.value)


def test_a_run_builds_its_data_with_the_class(tmp_path, tiny_model_dir, monkeypatch):
    """``run_training`` builds the datasets through it on the data thread, as it reads
    RLDataset's (engine.runtime.read_data, while Ray starts): its error stops the run
    before any worker builds its roles. Ray and the workers are stand-ins here."""
    from engine import runtime
    from engine.reward.manager import RewardManager

    seen: dict = {}

    class Workers:
        def start(self, cfg):
            seen["started"] = True

        def shutdown(self, grace_s: float = 10.0):
            seen["shut_down"] = True

    monkeypatch.setattr(runtime, "init_ray", lambda cfg: None)
    monkeypatch.setattr(runtime, "spawn_workers", lambda cfg: Workers())
    monkeypatch.setattr(RewardManager, "start", lambda self: None)
    body = """
        import threading

        class Refuses:
            def __init__(self, files, tokenizer, cfg, tools=(), max_samples=-1):
                raise ValueError(f"built for {files} with max_samples={max_samples}"
                                 f" on {threading.current_thread().name}")
            __len__ = __getitem__ = agent_rows = data_sources = lambda self, *a: None
    """
    cfg = load_config(
        [
            f"actor_rollout_ref.model.path={tiny_model_dir}",
            "data.train_files=train.parquet",
            "data.train_max_samples=7",
            f"data.custom_cls.path={_write(tmp_path, body)}",
            "data.custom_cls.name=Refuses",
            "trainer.device=cpu",
        ]
    )
    with pytest.raises(
        ValueError, match=r"built for \['train.parquet'\] with max_samples=7"
    ) as err:
        runtime.run_training(cfg)
    assert "on engine-data" in str(err.value)  # the data thread, not the main one
    assert seen == {"shut_down": True}  # spawned, never started
