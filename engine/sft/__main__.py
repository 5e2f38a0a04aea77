"""``python -m engine.sft``: the command is ``engine.sft.cli``."""

from engine.sft.cli import main

main()
