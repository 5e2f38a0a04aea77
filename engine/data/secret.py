"""The shipped tool task: the answer is a secret that only a tool knows.

Each prompt asks for the secret digit; each row holds its own (0 to 9) in
``extra_info.tools_kwargs``, which the tool ``secret`` reveals when the model calls it.
Without the tool a model can only guess (1 in 10); with it, it copies the digit from the
tool's answer. So the reward rises only if the model calls the tool and reads its result:
a tool that returned the wrong secret, or a rollout that lost its result, would leave it
at chance. The files are verl's: parquet rows with ``agent_name`` and ``tools_kwargs``, and
a tools file naming a custom tool (``secret_tool.py``, copied beside it).

    python -m engine.data.prepare secret --out data/secret   # train/val parquet + tools
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

DATA_SOURCE = "synthetic/secret"
ABILITY = "tool_use"
TOOL = "secret"
LOW, HIGH = 0, 9  # one digit: a guess is right 1 time in 10
# The tool says the digit 8 times: a tiny model from random weights learns to copy a
# repeated token in about 200 steps of the warm start; a lone one took 500 to over 1,000
# steps, varying with the seed (engine.warmup.secret).
REPEAT = 8
QUESTIONS = (
    "What is the secret number?",
    "Tell me the secret number.",
    "Which number is the secret?",
)
TOOLS_FILE = "tools.yaml"
TOOL_DESCRIPTION = "Tell the secret number of this question."
TOOLS_YAML = f"""\
# The secret task's tool (engine/data/secret.py): a custom function whose value comes
# from each row's extra_info.tools_kwargs.secret
tools:
  - name: {TOOL}
    path: secret_tool.py
    function: secret
    description: {TOOL_DESCRIPTION}
    parameters: {{type: object, properties: {{}}}}
"""


def tool_answer(value: str) -> str:
    """What the tool says: the row's secret, repeated."""
    return " ".join([value] * REPEAT)


def tool_schema() -> dict[str, Any]:
    """What the model sees of the tool (the tools file's schema)."""
    return {
        "type": "function",
        "function": {
            "name": TOOL,
            "description": TOOL_DESCRIPTION,
            "parameters": {"type": "object", "properties": {}},
        },
    }


def make_rows(n: int, *, split: str, seed: int) -> list[dict[str, Any]]:
    """``n`` rows in verl's format, deterministic in (split, seed)."""
    rng = random.Random(f"{DATA_SOURCE}:{split}:{seed}")
    rows = []
    for index in range(n):
        question = QUESTIONS[rng.randrange(len(QUESTIONS))]
        value = str(rng.randint(LOW, HIGH))
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": question}],
                "ability": ABILITY,
                "reward_model": {"style": "rule", "ground_truth": value},
                "agent_name": "tool_agent",
                "extra_info": {
                    "split": split,
                    "index": index,
                    "tools_kwargs": {TOOL: {"create_kwargs": {"value": value}}},
                },
            }
        )
    return rows


def write_secret_task(
    out_dir: str | Path, *, n_train: int = 2048, n_val: int = 128, seed: int = 0
) -> dict[str, Path]:
    """``train.parquet``, ``val.parquet``, ``tools.yaml`` and ``secret_tool.py`` under
    ``out_dir``; their paths by name (train, val, tools)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, n in (("train", n_train), ("val", n_val)):
        paths[split] = out / f"{split}.parquet"
        pq.write_table(pa.Table.from_pylist(make_rows(n, split=split, seed=seed)), paths[split])
    shutil.copyfile(Path(__file__).with_name("secret_tool.py"), out / "secret_tool.py")
    paths["tools"] = out / TOOLS_FILE
    paths["tools"].write_text(TOOLS_YAML)
    return paths
