"""``python -m engine.sft``: supervised fine-tuning with verl's SFT trainer's command line
(``verl.trainer.sft_trainer``'s keys, docs/sft.md):

    python -m engine.sft data.train_files=train.parquet data.val_files=val.parquet \\
        model.path=Qwen/Qwen2.5-0.5B-Instruct optim.lr=1e-5 trainer.n_gpus_per_node=8
    python -m engine.sft --check ...           # validate only (no torch, no Ray)
    python -m engine.sft --print-config ...    # the resolved config, then exit
    python -m engine.sft --help data.max_length  # a key: type, default, meaning
    python -m engine.sft --config-path DIR --config-name NAME engine=megatron ...

Hydra's grammar as ``engine.main``'s (``+key``, ``~key``, group choices ``engine=megatron``
``optim=megatron``, ``--cfg job``); verl's keys that change nothing here are named at
start. Configuration errors print every problem with its fix and exit with code 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from engine.config.dump import to_yaml
from engine.config.given import start_note
from engine.config.load import load
from engine.config.sft import SFT, summary
from engine.errors import EngineError, user_errors

PROGRAM = "python -m engine.sft"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROGRAM,
        description="Supervised fine-tuning on chat conversations (verl's SFT trainer's keys)."
        " Configure with key=value overrides (Hydra syntax).",
        epilog=f"example: {PROGRAM} data.train_files=train.parquet"
        " model.path=Qwen/Qwen2.5-0.5B-Instruct optim.lr=1e-5",
        add_help=False,
    )
    parser.add_argument(
        "-h", "--help", nargs="*", metavar="KEY",
        help="this message; with KEYs, each key's type, default and meaning (a section lists"
        " its keys)",
    )  # fmt: skip
    parser.add_argument("--config", metavar="FILE", help="a YAML file applied before overrides")
    parser.add_argument(
        "--config-path", "-cp", metavar="DIR", help="Hydra's: the folder of --config-name"
    )
    parser.add_argument(
        "--config-name", "-cn", metavar="NAME",
        help="Hydra's: NAME.yaml in --config-path (its defaults may name verl's"
        " sft_trainer_engine and group choices)",
    )  # fmt: skip
    parser.add_argument("--print-config", action="store_true", help="print the config, exit")
    parser.add_argument(
        "--cfg", "-c", choices=("job", "hydra", "all"),
        help="Hydra's: print the config (job, all) or say Hydra's own settings are unused",
    )  # fmt: skip
    parser.add_argument("--resolve", action="store_true", help="Hydra's; always resolved")
    parser.add_argument("--check", action="store_true", help="validate the config and exit")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = _parser().parse_intermixed_args(sys.argv[1:] if argv is None else argv)
    with user_errors():
        if args.help is not None:
            explain(args.help)
            return
        if args.cfg == "hydra":
            print("# Hydra's own settings: the engine runs without Hydra's app runner")
            return
        loaded = load(
            args.overrides,
            config_file=args.config,
            config_path=args.config_path,
            config_name=args.config_name,
            schema=SFT,
        )
        cfg = loaded.config
        if args.cfg is not None or args.print_config:
            print(to_yaml(cfg), end="")
            return
        note = start_note(loaded, PROGRAM)
        if note:
            print(note, file=sys.stderr)
        if args.check:
            print(summary(cfg))
            return
        # torch and Ray only now: --check and --help never import them
        from engine.sft.runtime import run_sft

        run_sft(cfg)


def explain(keys: Sequence[str]) -> None:
    if not keys:
        _parser().print_help()
        return
    from engine.config.docs import key_help

    text, unknown = key_help(keys, SFT.root, SFT.names)
    if text:
        print(text)
    if unknown:
        raise EngineError("; ".join(unknown))


if __name__ == "__main__":
    main()
