"""The reward-model role: a Hugging Face sequence-classification model (one label) that
scores whole sequences, prompt and response, on the training workers or on its own
(``reward_model.enable_resource_pool``) (the discriminative style; the generative one, an LLM judge, is engine.workers.judge).

Each rank holds a full copy in eval mode (no sharding, no optimizer) and scores its share
of the batch in micro-batches of ``reward_model.micro_batch_size_per_gpu``. The score of
a sequence is the head applied to the hidden state of its last real token: sequences are
right-padded and the position is read from the attention mask, never from the pad id
(a response that ends in an EOS equal to the pad id would fool a pad-id search, as
transformers' own pooling does)."""

from __future__ import annotations

from typing import Any

import torch

from engine.config import EngineConfig
from engine.config.reward import classifier_config_problems
from engine.device import DeviceSpec
from engine.errors import ConfigError

# Decoder reward models (Llama, Qwen2, Mistral, Gemma...) name their one-label head this.
HEAD = "score"


def load_reward_model(path: str, trust_remote_code: bool, dtype: torch.dtype) -> Any:
    """The model at ``path``, in eval mode; a ConfigError naming the key when it is not a
    one-label decoder sequence classifier."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    problems = classifier_config_problems(path, config.to_dict())
    if problems:
        raise ConfigError(problems)
    model = AutoModelForSequenceClassification.from_pretrained(
        path, trust_remote_code=trust_remote_code, torch_dtype=dtype
    )
    if not isinstance(getattr(model, HEAD, None), torch.nn.Module):
        raise ConfigError(
            [
                f"reward_model.model.path {path!r}: {type(model).__name__} has no `{HEAD}`"
                " head over its last token (an encoder classifier pools differently): use a"
                " decoder *ForSequenceClassification reward model (Llama, Qwen2, Mistral...)"
            ]
        )
    return model.eval()


@torch.no_grad()
def sequence_scores(
    model: Any, sequences: list[list[int]], micro_batch_size: int, device: torch.device
) -> torch.Tensor:
    """(B,) float32 on the CPU: the model's score of each token sequence."""
    scores = []
    for start in range(0, len(sequences), micro_batch_size):
        chunk = sequences[start : start + micro_batch_size]
        width = max(len(s) for s in chunk)
        ids = torch.zeros((len(chunk), width), dtype=torch.long)  # pads are masked out
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for row, seq in enumerate(chunk):
            ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
            mask[row, : len(seq)] = 1
        ids, mask = ids.to(device), mask.to(device)
        hidden = model.base_model(input_ids=ids, attention_mask=mask).last_hidden_state
        last = mask.sum(-1) - 1
        pooled = hidden[torch.arange(len(chunk), device=device), last]
        scores.append(getattr(model, HEAD)(pooled).squeeze(-1).float().cpu())
    return torch.cat(scores) if scores else torch.zeros(0)


class RewardModelWorker:
    def __init__(
        self, cfg: EngineConfig, device: DeviceSpec, tokenizer: Any, colocated: dict[str, Any]
    ) -> None:
        rm = cfg.reward_model
        self.device = device.torch_device()
        dtype = torch.bfloat16 if device.supports_bf16 else torch.float32
        self.model = load_reward_model(rm.model.path, rm.model.trust_remote_code, dtype)
        self.model.to(self.device)
        self.micro_batch_size = rm.micro_batch_size_per_gpu

    def scores(self, sequences: list[list[int]]) -> torch.Tensor:
        return sequence_scores(self.model, sequences, self.micro_batch_size, self.device)


def reward_model_role(
    cfg: EngineConfig, device: DeviceSpec, tokenizer: Any, colocated: dict[str, Any]
) -> Any:
    """The ``rm`` role of ``reward_model.style``."""
    if cfg.reward_model.style == "generative":
        from engine.workers.judge import JudgeWorker

        return JudgeWorker(cfg, device, tokenizer, colocated)
    return RewardModelWorker(cfg, device, tokenizer, colocated)
