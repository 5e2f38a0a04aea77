"""Export of a LoRA actor (engine.train.lora): the merged model, or the adapter alone.

A LoRA checkpoint's ``actor/model/`` holds the adapter's tensors only, and ``actor/hf/``
peft's ``adapter_config.json``, which names the base model (``base_model_name_or_path``:
the run's ``actor_rollout_ref.model.path``). The base model is loaded from there, the
adapter injected and filled from ``model/``; then either

- merged (the default): peft's ``merge_and_unload`` folds W + (α/r)·B·A into each
  weight and drops the adapter layers: a plain Hugging Face model, as a full-weight
  run exports; or
- ``--adapter-only``: peft's own adapter folder (``adapter_config.json`` and
  ``adapter_model.safetensors``), which ``PeftModel.from_pretrained(base, OUT)`` and
  vLLM's ``LoRARequest`` load beside the base model.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from engine.errors import EngineError

ADAPTER_CONFIG = "adapter_config.json"


def is_lora(role_dir: Path) -> bool:
    return (role_dir / "hf" / ADAPTER_CONFIG).is_file()


def load_lora_model(role_dir: Path, error: type[EngineError]) -> Any:
    """The base model with the checkpoint's adapter (peft's ``PeftModel``), in float32."""
    import torch
    import torch.distributed.checkpoint as dcp
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    hf_dir = role_dir / "hf"
    config = LoraConfig.from_pretrained(str(hf_dir))
    base_path = config.base_model_name_or_path
    try:
        base = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    except (OSError, ValueError) as exc:
        raise error(
            f"the LoRA checkpoint's base model {base_path!r} (base_model_name_or_path in"
            f" {hf_dir / ADAPTER_CONFIG}) cannot be loaded ({type(exc).__name__}): make it"
            " reachable at that path or id (the adapter alone needs it too)"
        ) from None
    peft_model = get_peft_model(base, config)
    state = {
        name: tensor
        for name, tensor in base.state_dict().items()
        if ".lora_A." in name or ".lora_B." in name
    }
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"torch\.distributed is disabled")
        dcp.load(state, checkpoint_id=str(role_dir / "model"), no_dist=True)
    return peft_model


def write_lora(
    role_dir: Path, out: Path, dtype: str, adapter_only: bool, error: type[EngineError]
) -> None:
    """Write the merged model (or, ``adapter_only``, the adapter) to ``out``."""
    import torch

    peft_model = load_lora_model(role_dir, error)
    if adapter_only:
        peft_model.to(getattr(torch, dtype)).save_pretrained(out, safe_serialization=True)
        return
    merged = peft_model.merge_and_unload()  # W + (α/r)·B·A, in float32, then the cast
    merged.config.use_cache = True
    merged.to(getattr(torch, dtype)).save_pretrained(
        out, safe_serialization=True, max_shard_size="5GB"
    )
