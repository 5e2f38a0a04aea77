"""LoRA for the FSDP2 actor, with ``peft`` (``actor_rollout_ref.model.lora_rank`` > 0).

What each role sees:

- actor: the Hugging Face model with peft's LoRA layers injected (each targeted linear
  layer keeps its weight W as ``<module>.base_layer.weight`` and gains ``lora_A`` [r, in]
  and ``lora_B`` [out, r]); only A and B require gradients, so AdamW holds moments for
  them alone and FSDP2 reduces no gradient of W.
- reference: the very same module under peft's ``disable_adapter()``: the initial policy
  without a second copy of the model (``engine.workers.reference``).
- rollout: merged weights, W + (α/r)·B·A under the model's own Hugging Face names
  (``merged_tensors``), computed as they are sent; W itself is never written to. Or, for
  vLLM serving the adapter itself (``rollout.lora_as_adapter``), W once (``merge=False``)
  and the adapter's tensors at each sync (``adapter_tensors``).
- checkpoints: the adapter and its optimizer state only (``engine.train.fsdp_checkpoint``),
  and ``hf/adapter_config.json`` naming the base model, from which ``engine.export``
  writes the merged model or the adapter alone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from engine.config import ModelConfig
from engine.errors import ConfigError

ADAPTER = "default"  # peft's name for the one adapter
ADAPTER_CONFIG = "adapter_config.json"  # peft's file, in a checkpoint's hf/
TARGETS_KEY = "actor_rollout_ref.model.target_modules"


def lora_config(model_cfg: ModelConfig, targets: list[str] | None = None) -> Any:
    """peft's config of the actor's adapter; ``targets``: the module names it adapts,
    when known (a separate rollout reads them off the pushed tensors), else the
    configured ``target_modules``."""
    from peft import LoraConfig

    targets = model_cfg.target_modules if targets is None else targets
    return LoraConfig(
        r=model_cfg.lora_rank,
        lora_alpha=model_cfg.lora_alpha,
        target_modules=targets if isinstance(targets, str) else list(targets),
        # verl's model.exclude_modules: a regular expression (or names) left without adapter
        exclude_modules=model_cfg.exclude_modules,
        lora_dropout=0.0,  # dropout would make π_old and the update's π differ
        bias="none",
        base_model_name_or_path=model_cfg.path,
    )


def apply_lora(model: nn.Module, model_cfg: ModelConfig) -> Any:
    """``model`` with an adapter injected in place; returns peft's ``PeftModel`` around
    it (for ``disable_adapter``). The base weights are frozen; B starts at zero, so the
    adapted model starts as the base model."""
    from peft import get_peft_model

    # a saved adapter's rank is read into the config before any worker starts
    assert model_cfg.lora_rank > 0, "engine.train.lora_saved.resolve the config first"
    try:
        peft_model = get_peft_model(model, lora_config(model_cfg))
    except ValueError as exc:
        if "not found in the base model" not in str(exc):
            raise
        raise ConfigError([_no_match(model, model_cfg)]) from None
    _check_untied(model, model_cfg)
    return peft_model


def _check_untied(model: nn.Module, model_cfg: ModelConfig) -> None:
    """An adapter on an output layer that shares its weight with the input embeddings
    would, merged, change both (and the engines tie the two themselves): refused."""
    from engine.rollout.weights import ties_embeddings

    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if output is None or not ties_embeddings(model):
        return
    tied = [name for name, m in lora_layers(model).items() if m is output]
    if tied:
        raise ConfigError(
            [
                f"{TARGETS_KEY} adapts {tied[0]}, which shares its weight with the input"
                f" embeddings in {model_cfg.path} (tie_word_embeddings): merged, the adapter"
                f" would change both; leave {tied[0].rsplit('.', 1)[-1]} out of the list"
            ]
        )


def _no_match(model: nn.Module, model_cfg: ModelConfig) -> str:
    linear = sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules()
                     if isinstance(m, nn.Linear) and "." in name})  # fmt: skip
    return (
        f"{TARGETS_KEY}={list(model_cfg.target_modules)} matches no module of"
        f" {model_cfg.path} ({type(model).__name__}); its linear layers are named"
        f" {', '.join(linear)}: list some of those, or set it to all-linear"
    )


def check_targets(model_cfg: ModelConfig) -> None:
    """Before any worker starts: inject the adapter into the model built on the meta
    device (no weights read or allocated), so that ``target_modules`` that match no
    module fail now, naming the key and the names there are."""
    from transformers import AutoModelForCausalLM

    from engine.models.hf_config import load_hf_config

    config = load_hf_config(model_cfg)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(
            config, trust_remote_code=model_cfg.trust_remote_code
        )
        apply_lora(model, model_cfg)


def lora_layers(model: nn.Module) -> dict[str, nn.Module]:
    """peft's LoRA layers of ``model`` by their module name (without FSDP's wrappers)."""
    from peft.tuners.lora import LoraLayer

    from engine.rollout.weights import clean_name

    return {clean_name(n): m for n, m in model.named_modules() if isinstance(m, LoraLayer)}


def is_adapter_name(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


@contextlib.contextmanager
def adapter_disabled(peft_model: Any) -> Iterator[None]:
    """The base model, for the reference's log-probs (peft's own switch)."""
    with peft_model.disable_adapter():
        yield


def merged_tensors(
    model: nn.Module, dtype: torch.dtype | None, device: torch.device | None, merge: bool = True
) -> Iterator[tuple[str, torch.Tensor]]:
    """What ``engine.rollout.weights.full_tensors`` hands a rollout, with each adapted
    weight merged: W + scaling·B·A (in float32, then cast to ``dtype``) under W's own
    checkpoint name (``...q_proj.weight``), the adapter's own tensors left out.
    Collective like it: every rank walks the same names and gathers the same tensors
    (W, then A and B of the same module). ``merge=False``: the base weights W alone, under
    the same names (for an engine that applies the adapter itself)."""
    from engine.rollout.weights import (
        as_checkpoint,
        checkpoint_reverter,
        clean_name,
        skipped_weight,
        ties_embeddings,
        whole_tensor,
    )

    layers = lora_layers(model)
    skip_lm_head = ties_embeddings(model)

    def gathered() -> Iterator[tuple[str, torch.Tensor]]:
        for raw_name, tensor in model.state_dict().items():
            name = clean_name(raw_name)
            if is_adapter_name(name) or skipped_weight(name, skip_lm_head):
                continue  # A and B are folded into their base weight below
            module_name, _, leaf = name.rpartition(".")
            owner = module_name.removesuffix(".base_layer")
            shard = tensor.detach()
            full = whole_tensor(shard.to(device) if device is not None else shard)
            if owner in layers and module_name.endswith(".base_layer"):
                name = f"{owner}.{leaf}"
                if leaf == "weight" and merge:
                    full = full.float() + _delta(layers[owner], device)
            if dtype is not None and full.is_floating_point():
                full = full.to(dtype)
            yield name, full

    yield from as_checkpoint(gathered(), checkpoint_reverter(model))


def _delta(layer: Any, device: torch.device | None) -> torch.Tensor:
    """scaling·B·A of one LoRA layer, from its gathered A and B."""
    from engine.rollout.weights import whole_tensor

    def gathered(linear: nn.Module) -> torch.Tensor:
        weight = linear.weight.detach()
        return whole_tensor(weight.to(device) if device is not None else weight).float()

    a = gathered(layer.lora_A[ADAPTER])
    b = gathered(layer.lora_B[ADAPTER])
    delta = (b @ a) * layer.scaling[ADAPTER]
    return delta.T if getattr(layer, "fan_in_fan_out", False) else delta


def adapter_tensors(
    model: nn.Module, dtype: torch.dtype | None, device: torch.device | None
) -> Iterator[tuple[str, torch.Tensor]]:
    """The adapter's full tensors under peft's saved names (``base_model.model.<module>.
    lora_A.weight``), as ``PeftModel.save_pretrained`` writes them and vLLM reads them.
    Collective: every rank gathers each, in the same order."""
    from engine.rollout.weights import clean_name, whole_tensor

    for raw_name, tensor in model.state_dict().items():
        name = clean_name(raw_name)
        if not is_adapter_name(name):
            continue
        shard = tensor.detach()
        full = whole_tensor(shard.to(device) if device is not None else shard)
        if dtype is not None:
            full = full.to(dtype)
        yield f"base_model.model.{name.replace(f'.{ADAPTER}.', '.')}", full


def trainable_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
