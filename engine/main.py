"""The engine's entry point, Hydra-style, as verl users know it:

    python -m engine.main algorithm.adv_estimator=grpo data.train_files=train.parquet ...
    python -m engine.main --config run.yaml trainer.total_epochs=2
    python -m engine.main --print-config ...     # the resolved config, then exit
    python -m engine.main --check ...            # validate only (no torch, no ray)
    python -m engine.main --help actor_rollout_ref.rollout.n   # a key: type, default, meaning
    python -m engine.main --help trainer         # a section: its keys, one line each

verl's command lines carry over (docs/verl-compat.md): Hydra's ``--config-path`` and
``--config-name`` (a config file of verl's layout, or verl's bundled ppo_trainer and
ppo_megatron_trainer), group choices (``model_engine=megatron``,
``actor@actor_rollout_ref.actor=megatron_actor``), ``+key=value``, ``~key`` and
``--cfg job`` (the config in verl's layout). A run that sets keys which change nothing
here is told so in one line at start.

Configuration errors print every problem with its fix and exit with code 2
(``engine.errors.user_errors``); so does ``--help`` with a key the schema does not have
(with the close matches). With ``ENGINE_EXIT_RECORD`` set (``engine.supervisor`` sets
it), the command also writes why it ended there (``engine.exits``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from engine.config import EngineConfig, load, to_yaml, verl_yaml
from engine.config.given import start_note
from engine.config.notes import notes
from engine.errors import EngineError, user_errors
from engine.exits import exit_recorded
from engine.startup import StartupClock, process_start_time


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    return _parser().parse_intermixed_args(argv)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m engine.main",
        description="Run the RL engine. Configure with key=value overrides (Hydra syntax).",
        epilog="example: python -m engine.main algorithm.adv_estimator=grpo "
        "actor_rollout_ref.rollout.n=8 data.train_files=train.parquet "
        "actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct",
        add_help=False,
    )
    parser.add_argument(
        "-h",
        "--help",
        nargs="*",
        metavar="KEY",
        help="show this message; with KEYs, each key's type, default and meaning (a section"
        " such as actor_rollout_ref.rollout lists the keys under it)",
    )
    parser.add_argument("--config", metavar="FILE", help="a YAML file applied before overrides")
    parser.add_argument(
        "--config-path",
        "-cp",
        metavar="DIR",
        help="Hydra's: the folder of --config-name (a verl config file: nested keys, a"
        " defaults list naming verl's ppo_trainer or ppo_megatron_trainer, group choices)",
    )
    parser.add_argument(
        "--config-name",
        "-cn",
        metavar="NAME",
        help="Hydra's: the config file NAME.yaml in --config-path, or verl's bundled"
        " ppo_trainer / ppo_megatron_trainer",
    )
    parser.add_argument(
        "--print-config", action="store_true", help="print the resolved config and exit"
    )
    parser.add_argument(
        "--cfg",
        "-c",
        choices=("job", "hydra", "all"),
        help="Hydra's: print the config and exit; job (and all): the resolved config in"
        " verl's layout, every key also under verl's spelling; hydra: Hydra's own"
        " settings, which the engine does not use",
    )
    parser.add_argument(
        "--resolve", action="store_true", help="Hydra's; the printed config is always resolved"
    )
    parser.add_argument("--check", action="store_true", help="validate the config and exit")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    started = process_start_time() if argv is None else None  # a command, not a call
    args = parse_args(sys.argv[1:] if argv is None else argv)
    # the exit record (under the supervisor) is written inside the error boundary: it
    # sees the error itself, before the boundary turns it into an exit code
    with user_errors(), exit_recorded():
        if args.help is not None:
            explain(args.help)
            return
        if args.cfg == "hydra":
            print("# Hydra's own settings: the engine runs without Hydra's app runner", end="")
            print(" (no output folder, no logging setup, no sweeps)")
            return
        loaded = load(
            args.overrides,
            config_file=args.config,
            config_path=args.config_path,
            config_name=args.config_name,
        )
        cfg = loaded.config
        if args.cfg is not None:
            print(verl_yaml(cfg), end="")
            return
        if args.print_config:
            print(to_yaml(cfg), end="")
            return
        for note in [start_note(loaded), *notes(cfg)]:
            if note:
                print(note if note.startswith("note:") else f"note: {note}", file=sys.stderr)
        if args.check:
            print(summary(cfg))
            return
        run(cfg, StartupClock(started))


def explain(keys: Sequence[str]) -> None:
    """``--help [KEY ...]``: the usage, or each key's help (torch-free, like --check)."""
    if not keys:
        _parser().print_help()
        return
    from engine.config.docs import key_help

    text, unknown = key_help(keys)
    if text:
        print(text)
    if unknown:
        raise EngineError("; ".join(unknown))


def summary(cfg: EngineConfig) -> str:
    """One paragraph a person can check: what will run, on what, in which batch sizes."""
    actor = cfg.actor_rollout_ref.actor
    n = cfg.actor_rollout_ref.rollout.n
    samples = cfg.data.train_batch_size * n
    minis = cfg.data.train_batch_size // actor.ppo_mini_batch_size
    return (
        f"config ok: {cfg.algorithm.adv_estimator} advantages, "
        f"{actor.policy_loss.loss_mode} policy loss ({actor.loss_agg_mode}), "
        f"model {cfg.actor_rollout_ref.model.path}\n"
        f"  {cfg.data.train_batch_size} prompts × {n} samples = {samples} samples per step, "
        f"{minis} optimizer step(s) per PPO epoch, on {cfg.world_size} device(s) "
        f"({cfg.trainer.nnodes} node(s) × {cfg.trainer.n_gpus_per_node})\n"
        f"  critic: {'on' if cfg.use_critic else 'off'}, "
        f"reference: {'on' if cfg.use_reference else 'off'}, "
        f"rollout: {cfg.actor_rollout_ref.rollout.name} ({cfg.actor_rollout_ref.rollout.placement})"
    )


def run(cfg: EngineConfig, clock: StartupClock | None = None) -> None:
    # Imported here: the trainer pulls in torch and ray, which --check and
    # --print-config (and rlctl on a laptop) never need.
    from engine.runtime import run_training

    run_training(cfg, clock)


if __name__ == "__main__":
    main()
