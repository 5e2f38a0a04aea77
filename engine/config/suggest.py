"""What to say about a key the schema does not have: a near miss of a key of the same
section (a typo: ``train_batch_sise``), the same key in another section (it moved), or
a verl section this engine lacks, named by the feature it configures. No suggestion
merely because two names look alike: ``trainer.balance_batch`` is not a misspelt
``trainer.total_epochs``."""

from __future__ import annotations

import difflib

# verl sections (and plugins' sections) the schema has no place for: what they are.
FOREIGN_SECTIONS = {
    "actor_rollout_ref.actor.engine": (
        "the section of verl's mlite (Megatron-lite) plugin engine"
        " (actor@actor_rollout_ref.actor=mlite_actor), not in this engine; its parallel"
        " sizes here are actor_rollout_ref.actor.megatron.* with strategy=megatron"
    ),
    "actor_rollout_ref.ref.engine": "the section of verl's mlite plugin engine, not in this engine",
    "critic.engine": "the section of verl's mlite plugin engine, not in this engine",
    "actor_rollout_ref.actor.torchtitan": "verl's TorchTitan engine's section, not in this engine",
    "actor_rollout_ref.ref.torchtitan": "verl's TorchTitan engine's section, not in this engine",
    "critic.torchtitan": "verl's TorchTitan engine's section, not in this engine",
    "actor_rollout_ref.actor.automodel": "verl's AutoModel engine's section, not in this engine",
    "evaluation": "verl's stand-alone evaluation entry point's config, not part of a training run",
}
# A close match needs at least this similarity of the last name (difflib's ratio).
NEAR_MISS = 0.8


def unknown_key_message(
    key: str, known: list[str], source: str, program: str = "python -m engine.main"
) -> str:
    """One line for an unknown dotted ``key``, given every key the schema knows
    (``program``: the command whose ``--help`` lists a section's keys)."""
    for section, what in FOREIGN_SECTIONS.items():
        if key == section or key.startswith(f"{section}."):
            return f"{source}: {key}: {what}"
    parent, _, name = key.rpartition(".")
    siblings = {k.rpartition(".")[2]: k for k in known if k.rpartition(".")[0] == parent}
    close = difflib.get_close_matches(name, list(siblings), n=1, cutoff=NEAR_MISS)
    if close:
        return f"{source}: unknown key {key!r}; did you mean {siblings[close[0]]!r}?"
    moved = [k for k in known if k.endswith(f".{name}") and k != key]
    if moved and len(moved) <= 3:
        where = " or ".join(repr(k) for k in moved)
        return f"{source}: unknown key {key!r}; the key of that name here is {where}"
    tops = sorted({k.split(".")[0] for k in known if "." in k})
    top = key.split(".")[0]
    if top not in tops and top not in known:
        return (
            f"{source}: unknown key {key!r}: no section {top!r} here nor in verl's schema;"
            f" the sections are {', '.join(tops)}"
        )
    hint = f" ({program} --help {parent} lists its keys)" if parent else ""
    return f"{source}: unknown key {key!r}{hint}"
