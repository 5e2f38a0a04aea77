"""vLLM serving a LoRA actor's adapter itself (``rollout.lora_as_adapter``).

The engine is built with ``enable_lora``; the frozen base weights are pushed once (the
first sync), and after each actor update only the adapter, written in peft's layout
(engine.rollout.lora_adapter). The adapter keeps one id for the whole run and each
version replaces the last in place (``LLM.llm_engine.add_lora`` of a ``LoRARequest``
with ``load_inplace=True``): requests in flight (the fully asynchronous mode's partial
rollouts) name the adapter by that id, so they go on under the new version, as they
would under new full weights. A new id per version would instead keep them on the old
adapter, and with one adapter slot make every new request wait for them. (vLLM's API,
0.27 to 0.33: ``LLM(enable_lora=True, max_lora_rank=...)``, ``LoRARequest(lora_name,
lora_int_id, lora_path, load_inplace=...)``, ``generate(..., lora_request=...)``.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# vLLM's allowed max_lora_rank values (its LoRAConfig.max_lora_rank)
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
ADAPTER_NAME = "actor"
ADAPTER_ID = 1  # vLLM's ids start at 1


# The oldest vLLM seen loading base weights into a LoRA-enabled engine (0.32.0, the CPU
# build). 0.27.1's weight-update session looks the base weights up under their plain
# names (qkv_proj.weight) where its LoRA layers hold them as base_layer.*, and fails at
# the first sync; the builds between were not tried.
ADAPTER_SINCE = (0, 32)


def check_adapter_support(version: str) -> None:
    """Refuse ``rollout.lora_as_adapter`` on a vLLM older than ``ADAPTER_SINCE``, before
    the engine starts (it would fail at the first weight sync)."""
    from engine.errors import EngineError
    from engine.versions import version_tuple

    if version_tuple(version) < ADAPTER_SINCE:
        since = ".".join(map(str, ADAPTER_SINCE))
        raise EngineError(
            f"actor_rollout_ref.rollout.lora_as_adapter=true needs vLLM {since} or newer to"
            f" load the base weights into its LoRA layers; this is vLLM {version}. Upgrade"
            f" vLLM, or set lora_as_adapter=false (the rollout then gets the merged weights)"
        )


def lora_engine_args(rank: int) -> dict[str, Any]:
    """vLLM's engine arguments for one adapter of ``rank`` (<= 512, the config's rule)."""
    return {
        "enable_lora": True,
        "max_lora_rank": next(r for r in VLLM_LORA_RANKS if r >= rank),
        "max_loras": 1,
    }


def load_adapter(llm_engine: Any, folder: Path) -> Any:
    """Load ``folder``'s adapter over the one served so far (the same id); the
    ``LoRARequest`` every request passes from now on. The cached prefixes are keyed by
    the adapter's path, so none computed with the old version is reused."""
    from vllm.lora.request import LoRARequest

    replace = LoRARequest(ADAPTER_NAME, ADAPTER_ID, str(folder), load_inplace=True)
    if not llm_engine.add_lora(replace):
        raise RuntimeError(f"vLLM did not load the LoRA adapter in {folder}")
    # Without load_inplace: each step's batch activates the loaded adapter, not a reload
    return LoRARequest(ADAPTER_NAME, ADAPTER_ID, str(folder))
