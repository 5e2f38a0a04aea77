"""A recipe's tools file (a relative multi_turn.tool_config_path) reaches the job: read
from the recipe's folder with its custom tools' code, shipped in the job's directory by
every backend, and loaded there by the engine; and what is refused, before anything
runs."""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import time
from pathlib import Path

import pytest
import yaml

from rlctl import api
from rlctl.backends.local import EXIT_CODE, LocalBackend
from rlctl.backends.skypilot import SkyPilotBackend, SkyPilotOptions
from rlctl.backends.slurm import Shell, SlurmBackend
from rlctl.errors import RlctlError
from rlctl.job.prepared import Rendered
from rlctl.job.spec import build_spec
from rlctl.recipe.load import load_recipe
from rlctl.recipe.shipped import TOOLS_KEY

RECIPE = """\
name: tools-demo
algorithm: grpo
model: rlctl:tiny
data: {{prepare: synthetic}}
hardware: {{accelerators: "cpu:2"}}
engine:
  data.max_prompt_length: 64
  data.max_response_length: 96
  data.train_batch_size: 8
  actor_rollout_ref.rollout.multi_turn.enable: true
  actor_rollout_ref.rollout.multi_turn.tool_config_path: {tools}
"""
TOOLS = """\
tools:
  - name: calculator
  - name: lookup
    path: lib/notes.py
    description: Look up the notes on a topic.
    parameters: {type: object, properties: {topic: {type: string}}, required: [topic]}
  - class_name: lib/notes.py:shout
    tool_schema:
      type: function
      function:
        name: shout
        description: Say it louder.
        parameters: {type: object, properties: {text: {type: string}}, required: [text]}
"""
NOTES = """\
def lookup(topic: str) -> str:
    return f"notes on {topic}"


def shout(text: str) -> str:
    return text.upper()
"""


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def write_recipe(folder: Path, tools: str = "tools/demo.yaml") -> Path:
    """A recipe in ``folder`` with a tools file beside it and a custom tool below that."""
    (folder / "tools" / "lib").mkdir(parents=True)
    (folder / "tools" / "demo.yaml").write_text(TOOLS)
    (folder / "tools" / "lib" / "notes.py").write_text(NOTES)
    recipe = folder / "recipe.yaml"
    recipe.write_text(RECIPE.format(tools=tools))
    return recipe


def tools_path(engine_yaml: str) -> str:
    return yaml.safe_load(engine_yaml)["actor_rollout_ref"]["rollout"]["multi_turn"][
        "tool_config_path"
    ]


def call(tools: dict, name: str, **arguments) -> str:
    return asyncio.run(tools[name].call(arguments)).text


def test_the_tools_file_ships_with_a_local_job_and_loads_there(home, tmp_path, monkeypatch):
    """Rendered, submitted (the real runner, with a run.sh that only ends), then the
    launcher's copies deleted: the engine loads the tools from the job's directory,
    custom code included."""
    from engine.agents.tools import build_tools, load_tool_specs

    recipe = load_recipe(write_recipe(tmp_path / "mine"))
    prepared = api.prepare(recipe, "local", job_id="t-1")
    root = Path(prepared.spec.paths.root)
    assert sorted(f.name for f in prepared.spec.files) == ["tools/demo.yaml", "tools/lib/notes.py"]
    assert prepared.files["tools/demo.yaml"] == TOOLS  # rlctl plan shows them
    assert tools_path(prepared.files["engine.yaml"]) == f"{root}/tools/demo.yaml"

    blank = Rendered({**prepared.files, "run.sh": ""}, prepared.software)  # runs nothing
    handle = LocalBackend().submit(
        type("Job", (), {"id": "t-1"})(), dataclasses.replace(prepared, rendered=blank), {}
    )
    deadline = time.monotonic() + 30
    while not (root / EXIT_CODE).exists():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert handle["root"] == str(root)
    shutil.rmtree(tmp_path / "mine")  # nothing is read from the launcher's copy any more

    specs = load_tool_specs(tools_path((root / "engine.yaml").read_text()))
    assert [s.name for s in specs] == ["calculator", "lookup", "shout"]
    assert {s.path for s in specs} == {None, str(root / "tools" / "lib" / "notes.py")}
    tools = build_tools(specs)
    assert call(tools, "lookup", topic="tools") == "notes on tools"
    assert call(tools, "shout", text="hi") == "HI"
    assert call(tools, "calculator", expression="6 * 7") == "42"


def test_slurm_stages_the_files_in_the_shared_job_directory(home, tmp_path):
    recipe = load_recipe(write_recipe(tmp_path / "mine"))
    backend = SlurmBackend(job_root=str(tmp_path / "shared"))
    spec = build_spec(recipe, api.plan_recipe(recipe), backend.paths("t-1", recipe.checkpoints))
    files = backend.render("t-1", spec).files
    root = Path(spec.paths.root)
    assert tools_path(files["engine.yaml"]) == f"{root}/tools/demo.yaml"
    backend._stage(Shell(None), str(root), files)  # the submit's staging, on this host
    assert (root / "tools" / "demo.yaml").read_text() == TOOLS
    assert (root / "tools" / "lib" / "notes.py").read_text() == NOTES


def test_skypilot_mounts_the_files_on_every_node(home, tmp_path):
    recipe = load_recipe(write_recipe(tmp_path / "mine"))
    backend = SkyPilotBackend(SkyPilotOptions(cloud="gcp"))
    spec = build_spec(recipe, api.plan_recipe(recipe), backend.paths("t-1", recipe.checkpoints))
    task = backend.build_task("t-1", spec)
    config = task.to_yaml_config()
    local = home / "jobs" / "t-1" / "tools"
    assert config["file_mounts"][f"{spec.paths.root}/tools/demo.yaml"] == str(local / "demo.yaml")
    assert config["file_mounts"][f"{spec.paths.root}/tools/lib/notes.py"] == str(
        local / "lib" / "notes.py"
    )
    assert f"tool_config_path: {spec.paths.root}/tools/demo.yaml\n" in config["run"]
    pytest.importorskip("sky", reason="skypilot is not installed")
    backend.sky_task(
        "t-1", spec, task, {}
    )  # writes the mounts' sources, then SkyPilot parses the task
    assert (local / "demo.yaml").read_text() == TOOLS
    assert (local / "lib" / "notes.py").read_text() == NOTES


def test_an_absolute_path_is_the_jobs_and_ships_nothing(home, tmp_path):
    recipe = load_recipe(write_recipe(tmp_path / "mine", tools="/cluster/tools/demo.yaml"))
    prepared = api.prepare(recipe, "local", job_id="t-1")
    assert prepared.spec.files == ()
    assert tools_path(prepared.files["engine.yaml"]) == "/cluster/tools/demo.yaml"


def test_a_parent_recipe_in_another_folder_keeps_its_tools_file(home, tmp_path):
    write_recipe(tmp_path / "shared")
    child = tmp_path / "mine" / "child.yaml"
    child.parent.mkdir()
    child.write_text("extends: ../shared/recipe.yaml\nname: child\n")
    recipe = load_recipe(child)
    assert recipe.engine[TOOLS_KEY] == "../shared/tools/demo.yaml"  # from the child's folder
    prepared = api.prepare(recipe, "local", job_id="t-1")
    assert prepared.files["tools/demo.yaml"] == TOOLS
    assert prepared.files["tools/lib/notes.py"] == NOTES


def test_the_bundled_tool_recipe_ships_its_code_interpreter(home, tmp_path):
    """recipes/grpo_qwen25_3b_gsm8k_tools.yaml: its tools file, shipped, loads in the
    engine with the sandbox limits it sets."""
    from engine.agents.tools import build_tools, load_tool_specs

    recipe = load_recipe(api.find_recipe("grpo_qwen25_3b_gsm8k_tools"))
    prepared = api.prepare(recipe, "slurm", job_id="t-1", job_root=str(tmp_path / "shared"))
    (shipped,) = prepared.spec.files
    assert shipped.name == "tools/code_interpreter.yaml"
    node = tmp_path / "node.yaml"
    node.write_text(shipped.text)
    (spec,) = load_tool_specs(node)
    assert (spec.name, spec.builtin) == ("code_interpreter", "code_interpreter")
    limits = build_tools([spec])["code_interpreter"].limits
    assert (limits.wall_seconds, limits.cpu_seconds, limits.memory_bytes) == (10, 5, 512 << 20)
    cfg = yaml.safe_load(prepared.files["engine.yaml"])
    assert cfg["actor_rollout_ref"]["rollout"]["tensor_model_parallel_size"] == 1
    mt = cfg["actor_rollout_ref"]["rollout"]["multi_turn"]
    assert mt["enable"] and mt["tool_timeout_s"] > limits.wall_seconds  # the sandbox ends first


# ---------------------------------------------------------------------------
# refused at prepare time, naming the key, the value and the fix


def test_a_missing_tools_file_is_refused(home, tmp_path):
    recipe = load_recipe(write_recipe(tmp_path / "mine", tools="tools/nope.yaml"))
    with pytest.raises(RlctlError) as info:
        api.validate(recipe.source)
    message = str(info.value)
    assert f"engine.{TOOLS_KEY}: 'tools/nope.yaml' is not a file" in message
    assert str(tmp_path / "mine" / "tools" / "nope.yaml") in message
    assert "recipe's folder" in info.value.hint


def test_custom_code_outside_the_tools_folder_is_refused(home, tmp_path):
    recipe_path = write_recipe(tmp_path / "mine")
    (tmp_path / "mine" / "tools" / "demo.yaml").write_text(
        TOOLS.replace("path: lib/notes.py", "path: ../elsewhere.py")
    )
    with pytest.raises(RlctlError) as info:
        api.prepare(load_recipe(recipe_path), "local", job_id="t-1")
    assert "tools[1].path: '../elsewhere.py' is outside the tools file's folder" in str(info.value)
    assert "absolute path" in info.value.hint


def test_missing_custom_code_is_refused(home, tmp_path):
    recipe_path = write_recipe(tmp_path / "mine")
    (tmp_path / "mine" / "tools" / "lib" / "notes.py").unlink()
    with pytest.raises(RlctlError, match=r"tools\[1\]\.path: 'lib/notes\.py' is not a file"):
        api.prepare(load_recipe(recipe_path), "local", job_id="t-1")


def test_a_tools_file_that_is_not_one_is_refused(home, tmp_path):
    recipe_path = write_recipe(tmp_path / "mine")
    (tmp_path / "mine" / "tools" / "demo.yaml").write_text("- name: calculator\n")
    with pytest.raises(RlctlError, match="a tools file is a mapping with a list under tools:"):
        api.prepare(load_recipe(recipe_path), "local", job_id="t-1")


def test_a_name_a_shipped_file_cannot_have_is_refused(home, tmp_path):
    recipe_path = write_recipe(tmp_path / "mine", tools="'tools/my demo.yaml'")
    shutil.copy(
        tmp_path / "mine" / "tools" / "demo.yaml", tmp_path / "mine" / "tools" / "my demo.yaml"
    )
    with pytest.raises(RlctlError) as info:
        api.prepare(load_recipe(recipe_path), "local", job_id="t-1")
    assert "'my demo.yaml' has characters a shipped file cannot have" in str(info.value)


GAME = """\
class Guess:
    def __init__(self, config):
        pass

    def start(self, *, target):
        return int(target)

    def respond(self, state, reply):
        return int(reply) == state, "again", float(int(reply) == state)
"""


def test_an_interactions_file_ships_beside_the_tools_file_and_loads_there(home, tmp_path):
    """multi_turn.interaction_config_path is shipped like the tools file (under the job's
    interactions/, its classes' code with it), and the engine builds it from there."""
    from engine.agents.interactions import load_interactions

    folder = tmp_path / "mine"
    recipe_file = write_recipe(folder)
    (folder / "env").mkdir()
    (folder / "env" / "game.py").write_text(GAME)
    (folder / "env" / "demo.yaml").write_text(
        "interaction:\n  - name: guess\n    class_name: game.py:Guess\n"
        "  - name: retry\n    class_name: retry\n    config: {data_source: synthetic/add}\n"
    )
    recipe_file.write_text(
        recipe_file.read_text()
        + "  actor_rollout_ref.rollout.multi_turn.interaction_config_path: env/demo.yaml\n"
    )
    prepared = api.prepare(load_recipe(recipe_file), "local", job_id="t-1")
    root = Path(prepared.spec.paths.root)
    assert sorted(f.name for f in prepared.spec.files) == [
        "interactions/demo.yaml",
        "interactions/game.py",
        "tools/demo.yaml",
        "tools/lib/notes.py",
    ]
    multi_turn = yaml.safe_load(prepared.files["engine.yaml"])["actor_rollout_ref"]["rollout"][
        "multi_turn"
    ]
    assert multi_turn["interaction_config_path"] == f"{root}/interactions/demo.yaml"
    # what the job's directory will hold, loaded as the engine loads it
    for shipped in prepared.spec.files:
        (tmp_path / "job" / shipped.name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "job" / shipped.name).write_text(shipped.text)
    shutil.rmtree(folder)
    interactions = load_interactions(tmp_path / "job" / "interactions" / "demo.yaml")
    assert sorted(interactions) == ["guess", "retry"]
    guess = interactions["guess"]
    assert guess.respond(guess.start(target=3), "3")[0] is True


def test_an_interactions_file_that_is_not_one_is_refused_before_anything_runs(home, tmp_path):
    recipe_file = write_recipe(tmp_path / "mine")
    (tmp_path / "mine" / "env.yaml").write_text("tools: []\n")
    recipe_file.write_text(
        recipe_file.read_text()
        + "  actor_rollout_ref.rollout.multi_turn.interaction_config_path: env.yaml\n"
    )
    with pytest.raises(RlctlError) as err:
        api.prepare(load_recipe(recipe_file), "local", job_id="t-1")
    assert "interactions file is a mapping with a list under interaction:" in str(err.value)
    assert not (home / "jobs" / "t-1").exists()


LOOP = """\
class Echo:
    def __init__(self, config):
        self.turns = config.get("turns", 1)

    async def run(self, episode):
        for _ in range(self.turns):
            await episode.generate()
"""


def test_an_agent_loops_file_ships_with_its_code_and_loads_there(home, tmp_path):
    """multi_turn.agent_loop_config_path (verl's list, _target_: file.py:Class) is shipped
    under the job's agent_loops/, its classes' code with it, and builds there."""
    from engine.agents.loops import load_agent_loops

    folder = tmp_path / "mine"
    recipe_file = write_recipe(folder)
    (folder / "loops" / "code").mkdir(parents=True)
    (folder / "loops" / "code" / "echo.py").write_text(LOOP)
    (folder / "loops" / "mine.yaml").write_text(
        "- name: echo\n  _target_: code/echo.py:Echo\n  config: {turns: 2}\n"
    )
    recipe_file.write_text(
        recipe_file.read_text()
        + "  actor_rollout_ref.rollout.multi_turn.agent_loop_config_path: loops/mine.yaml\n"
    )
    prepared = api.prepare(load_recipe(recipe_file), "local", job_id="t-1")
    root = Path(prepared.spec.paths.root)
    names = sorted(f.name for f in prepared.spec.files)
    assert names[:2] == ["agent_loops/code/echo.py", "agent_loops/mine.yaml"]
    multi_turn = yaml.safe_load(prepared.files["engine.yaml"])["actor_rollout_ref"]["rollout"][
        "multi_turn"
    ]
    assert multi_turn["agent_loop_config_path"] == f"{root}/agent_loops/mine.yaml"
    for shipped in prepared.spec.files:
        (tmp_path / "job" / shipped.name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "job" / shipped.name).write_text(shipped.text)
    shutil.rmtree(folder)
    loops = load_agent_loops(tmp_path / "job" / "agent_loops" / "mine.yaml")
    assert loops["echo"].turns == 2


def test_an_agent_loops_file_that_is_not_a_list_is_refused(home, tmp_path):
    recipe_file = write_recipe(tmp_path / "mine")
    (tmp_path / "mine" / "loops.yaml").write_text("agent_loop: {name: echo}\n")
    recipe_file.write_text(
        recipe_file.read_text()
        + "  actor_rollout_ref.rollout.multi_turn.agent_loop_config_path: loops.yaml\n"
    )
    with pytest.raises(RlctlError, match="an agent loops file is a list of entries"):
        api.prepare(load_recipe(recipe_file), "local", job_id="t-1")
    assert not (home / "jobs" / "t-1").exists()
