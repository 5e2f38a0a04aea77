"""The model families the Megatron backend converts, one module each, registered here.

A family (``base.ModelFamily``) holds what differs between Hugging Face model types:
its shape rules (q/k/v biases, q/k norms, multi-latent attention, which layers are
mixtures of experts and their shared experts), which the planner sizes with and the
conversion builds; its translation into Megatron-core's ``TransformerConfig`` (routing,
RoPE, arguments of its own, settings it cannot convert); its weight names beyond every
family's; and the sizes of its tiny test model. Everything else is shared:
``engine.models.megatron_config`` (the config translation), ``megatron_convert`` (the
weights), ``engine.models.tiny`` (the tiny models) and ``rlctl.models`` (through
``engine.schema``) ask the family, never the model type.

Torch-free: ``engine.schema`` exports the registry to the launcher.

A new family: a module beside these (``qwen3_moe.py`` shows one built on another,
``deepseek_v3.py`` one with every part of its own) and its record in ``FAMILIES``.
"""

from __future__ import annotations

from engine.models.families.base import PLAIN_DECODER, ModelFamily
from engine.models.families.deepseek_v3 import DEEPSEEK_V3
from engine.models.families.llama import LLAMA, MISTRAL
from engine.models.families.qwen2 import QWEN2
from engine.models.families.qwen2_moe import QWEN2_MOE
from engine.models.families.qwen3 import QWEN3
from engine.models.families.qwen3_moe import QWEN3_MOE

# The registry, in the order messages list the families.
FAMILIES: dict[str, ModelFamily] = {
    f.model_type: f for f in (LLAMA, MISTRAL, QWEN2, QWEN3, QWEN2_MOE, QWEN3_MOE, DEEPSEEK_V3)
}

# Hugging Face model types the Megatron backend converts.
MODEL_TYPES: tuple[str, ...] = tuple(FAMILIES)


def family(model_type: str) -> ModelFamily:
    """The registered family of ``model_type``; a ValueError naming those there are."""
    try:
        return FAMILIES[model_type]
    except KeyError:
        raise ValueError(
            f"no model family {model_type!r}; registered: {', '.join(MODEL_TYPES)}"
        ) from None


def family_rules(model_type: str) -> ModelFamily:
    """The family of ``model_type``, or a plain decoder's rules for a type without one
    (the planner sizes more architectures than the Megatron backend converts)."""
    return FAMILIES.get(model_type, PLAIN_DECODER)


__all__ = ["FAMILIES", "MODEL_TYPES", "ModelFamily", "family", "family_rules"]
