"""Every config key explains itself: help text on each field, the generated
docs/configuration.md, and ``python -m engine.main --help KEY``."""

import subprocess
import sys

import pytest

from engine.config import config_keys, schema_leaf
from engine.config.docs import DOC_PATH, REGENERATE, key_help, render_markdown
from engine.config.keys import leaf, leaves, sections
from engine.main import main


def test_every_key_has_help():
    missing = [key for key in config_keys() if not leaf(key).help.strip()]
    assert not missing, f"give these fields help text (setting(default, help)): {missing}"


def test_every_section_describes_itself():
    # A dataclass without a docstring gets its signature as one: a section needs its own.
    missing = [section or "EngineConfig" for section, text in sections().items() if not text]
    assert not missing, f"give these sections' classes a docstring: {missing}"


def test_the_committed_reference_is_what_the_code_renders():
    assert DOC_PATH.read_text(encoding="utf-8") == render_markdown(), (
        f"docs/configuration.md is out of date: run `{REGENERATE}` and commit it"
    )


def test_the_reference_has_a_row_for_every_key():
    page = render_markdown()
    for key in config_keys():
        assert f"| `{key}` |" in page, key


def test_defaults_are_the_whole_configs():
    # The critic's optimizer is the shared OptimConfig with its own learning rate.
    assert schema_leaf("critic.optim.lr") == (float, 1e-5)
    assert schema_leaf("actor_rollout_ref.actor.optim.lr") == (float, 1e-6)
    assert "| `critic.optim.lr` | float | `1e-05` |" in render_markdown()
    assert schema_leaf("critic.optim") is None and schema_leaf("nope") is None


def test_a_section_lists_its_keys_nested_ones_included():
    keys = [item.key for item in leaves("actor_rollout_ref.rollout")]
    assert keys[0] == "actor_rollout_ref.rollout.name"
    assert "actor_rollout_ref.rollout.val_kwargs.top_p" in keys
    assert all(k.startswith("actor_rollout_ref.rollout.") for k in keys)


def test_help_for_a_key(capsys):
    main(["--help", "actor_rollout_ref.rollout.n"])
    out = capsys.readouterr().out
    assert out.splitlines()[:3] == [
        "actor_rollout_ref.rollout.n",
        "  type:    int",
        "  default: 1",
    ]
    assert "Samples generated per prompt" in out


def test_help_for_keys_with_null_and_list_defaults():
    text, unknown = key_help(["critic.ppo_epochs", "trainer.logger"])
    assert not unknown
    assert "type:    int or null\n  default: null" in text
    assert "type:    list of names, or one name\n  default: [console]" in text
    assert "console, jsonl, tensorboard, wandb or mlflow" in text


def test_help_for_a_section(capsys):
    main(["--help", "actor_rollout_ref.rollout.val_kwargs"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("actor_rollout_ref.rollout.val_kwargs: Validation-time sampling")
    rows = {line.split()[0]: line.split()[1] for line in lines[1:]}
    assert rows == {
        "n": "1",
        "temperature": "0.0",
        "top_p": "1.0",
        "top_k": "-1",
        "do_sample": "false",
    }
    assert all(len(line.split(None, 2)) == 3 for line in lines[1:])  # each with its help


def test_help_for_an_unknown_key_suggests_and_exits_2(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help", "data.train_batch_sise"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "unknown config key 'data.train_batch_sise'; did you mean data.train_batch_size" in err
    # A last component alone names every key that ends with it.
    _, (problem,) = key_help(["lr"])
    assert "actor_rollout_ref.actor.optim.lr, critic.optim.lr" in problem
    _, (problem,) = key_help(["nothing_like_it"])
    assert "the sections are data, actor_rollout_ref, critic" in problem


def test_known_keys_are_shown_before_an_unknown_one_fails(capsys):
    with pytest.raises(SystemExit):
        main(["--help", "trainer.seed", "trainer.sed"])
    captured = capsys.readouterr()
    assert captured.out.startswith("trainer.seed\n")
    assert "did you mean trainer.seed" in captured.err


def test_plain_help_is_the_usage(capsys):
    main(["--help"])
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m engine.main")
    assert "--check" in out and "--help [KEY ...]" in out


def test_help_on_the_command_line_without_torch():
    code = (
        "import sys; from engine.main import main; "
        "main(['--help', 'algorithm.adv_estimator', 'trainer']); "
        "bad = [m for m in ('torch', 'ray') if m in sys.modules]; sys.exit(3 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Advantage estimator: gae, grpo" in result.stdout
    assert "trainer: The run:" in result.stdout
    unknown = subprocess.run(
        [sys.executable, "-m", "engine.main", "--help", "algorithm.adv_estimater"],
        capture_output=True,
        text=True,
    )
    assert unknown.returncode == 2
    assert "did you mean algorithm.adv_estimator" in unknown.stderr
    assert "Traceback" not in unknown.stderr
