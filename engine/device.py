"""Which accelerator a worker uses, and how processes on it talk to each other.

Never assume CUDA: the device type, the collective backend, the variable that
restricts visible devices and the Ray resource name all come from one table.
ROCm builds of torch present AMD GPUs as ``cuda`` (HIP) and use RCCL behind the
``nccl`` backend name; Ascend NPUs come from ``torch_npu``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from engine.errors import EngineError


@dataclass(frozen=True)
class DeviceSpec:
    type: str  # torch device type: cuda | npu | cpu
    backend: str  # torch.distributed backend
    visible_devices_var: str | None  # env var a launcher sets to pin devices
    ray_resource: str | None  # Ray resource that counts one device (None: CPUs only)

    def torch_device(self, local_rank: int = 0) -> torch.device:
        return torch.device("cpu") if self.type == "cpu" else torch.device(self.type, local_rank)

    @property
    def supports_bf16(self) -> bool:
        # Mixed precision pays off on accelerators; on CPU bf16 matmuls are slow
        # and fp32 is the honest baseline.
        return self.type != "cpu"


def _is_rocm() -> bool:
    return getattr(torch.version, "hip", None) is not None


DEVICES = {
    "cuda": DeviceSpec("cuda", "nccl", "CUDA_VISIBLE_DEVICES", "GPU"),
    "rocm": DeviceSpec("cuda", "nccl", "HIP_VISIBLE_DEVICES", "GPU"),
    "npu": DeviceSpec("npu", "hccl", "ASCEND_RT_VISIBLE_DEVICES", "NPU"),
    "cpu": DeviceSpec("cpu", "gloo", None, None),
}


def npu_available() -> bool:
    try:
        import torch_npu  # noqa: F401  (registers torch.npu)
    except ImportError:
        return False
    return torch.npu.is_available()  # type: ignore[attr-defined]


def resolve_device(name: str) -> DeviceSpec:
    """The spec for ``trainer.device`` (auto | cuda | npu | cpu) on this machine."""
    if name == "auto":
        if torch.cuda.is_available():
            name = "cuda"
        elif npu_available():
            name = "npu"
        else:
            name = "cpu"
    if name == "cuda":
        if not torch.cuda.is_available():
            raise EngineError(
                "trainer.device=cuda but torch sees no CUDA/ROCm device; "
                "set trainer.device=cpu or auto, or install the GPU build of torch"
            )
        return DEVICES["rocm"] if _is_rocm() else DEVICES["cuda"]
    if name == "npu":
        if not npu_available():
            raise EngineError("trainer.device=npu needs torch_npu and a visible Ascend NPU")
        return DEVICES["npu"]
    if name == "cpu":
        return DEVICES["cpu"]
    raise EngineError(f"unknown trainer.device {name!r}; valid: auto, cuda, npu, cpu")


def set_device(spec: DeviceSpec, local_rank: int) -> None:
    if spec.type == "cuda":
        torch.cuda.set_device(local_rank)
    elif spec.type == "npu":
        torch.npu.set_device(local_rank)  # type: ignore[attr-defined]


def local_rank_from_env(spec: DeviceSpec) -> int:
    """Ray pins each worker to its device(s) through the visible-devices variable,
    so inside the worker the device is always index 0 of what it can see."""
    if spec.visible_devices_var and os.environ.get(spec.visible_devices_var):
        return 0
    return int(os.environ.get("LOCAL_RANK", "0"))
