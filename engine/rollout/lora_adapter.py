"""A LoRA actor's adapter on local disk, in peft's layout (``adapter_config.json``,
``adapter_model.safetensors``): what vLLM and SGLang load when they serve the adapter
themselves (``rollout.lora_as_adapter``). One folder per weight version; the previous
one is removed once the next is written (the engine has loaded it by then)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch


class AdapterFolder:
    """The current weight version's adapter on local disk, for the engine to load."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="rlctl-lora-"))
        self.current: Path | None = None

    def write(
        self, version: int, peft_config: Any, tensors: Iterable[tuple[str, torch.Tensor]]
    ) -> Path:
        """Write version ``version``'s adapter; the folder that holds it."""
        from safetensors.torch import save_file

        folder = self.root / f"v{version}"
        folder.mkdir()
        peft_config.save_pretrained(str(folder))
        save_file(
            {name: t.detach().contiguous().cpu() for name, t in tensors},
            str(folder / "adapter_model.safetensors"),
        )
        if self.current is not None:
            shutil.rmtree(self.current, ignore_errors=True)
        self.current = folder
        return folder

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
