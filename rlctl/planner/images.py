"""The container image a job's nodes run, and what the setup adds to it.

By default a plan names an image anyone can pull today: the inference engine's own
release image for the vendor (vLLM's for NVIDIA and ROCm, SGLang's for NVIDIA), pinned
by tag to the release the engine is tested against (engine/versions.py's pins;
tests/rlctl/test_images.py keeps them equal). The node's setup then installs, over the
image, exactly the rlctl the user launched from (a wheel shipped with the job,
``rlctl/job/wheel.py``) and the engine's dependencies the image lacks (``rlctl/node/jobenv.py``).

Where no public image has what the engine needs, the default is the project's own image
(``images/``), marked not public: a launch that would pull it is refused with how to
build it, unless ``image:`` (the recipe's, or the site profile's) names one. The project's
images stay an option everywhere for faster starts (everything preinstalled).
"""

from __future__ import annotations

from dataclasses import dataclass

from rlctl import __version__
from rlctl.errors import RlctlError
from rlctl.hardware import Accelerator

# The releases the public images are pinned to: engine/versions.py's `pinned`.
VLLM = "0.33.0"
SGLANG = "0.5.23"


@dataclass(frozen=True)
class JobImage:
    ref: str  # what the nodes pull
    contents: str  # what is in it, for people
    public: bool  # on a public registry today; False: build and push it first
    build: str = ""  # when not public: how to make it

    def check_pullable(self, chosen: str | None, where: str) -> None:
        """Refuse a launch whose nodes would pull this image when it is not public;
        ``chosen`` is the image the backend settled on (None: no container)."""
        if chosen is None or self.public or chosen.removeprefix("docker:") != self.ref:
            return
        raise RlctlError(
            f"{where}: the default image {self.ref} is on no public registry",
            hint=self.build,
        )


def project_image(flavor: str) -> str:
    """The project's own image (images/build.sh): ``rlctl/engine:<version>-<flavor>``."""
    return f"rlctl/engine:{__version__}-{flavor}"


_VLLM_CUDA = JobImage(
    f"vllm/vllm-openai:v{VLLM}",
    f"vLLM {VLLM}'s release image (CUDA, torch, Ray)",
    public=True,
)
_SGLANG_CUDA = JobImage(
    f"lmsysorg/sglang:v{SGLANG}",
    f"SGLang {SGLANG}'s release image (CUDA, torch)",
    public=True,
)
_VLLM_ROCM = JobImage(
    f"vllm/vllm-openai-rocm:v{VLLM}",
    f"vLLM {VLLM}'s ROCm release image (ROCm, torch, Ray)",
    public=True,
)
_ASCEND = JobImage(
    project_image("ascend"),
    "the project's Ascend image: CANN, torch_npu, vLLM and vllm-ascend (images/Dockerfile.ascend)",
    public=False,
    build="vllm-ascend's newest image (v0.23.0) has vLLM 0.23, below the engine's 0.27:"
    " build this one (PUSH=1 REGISTRY=registry.example.com images/build.sh ascend) and set"
    " image: in the recipe or the site profile to the pushed name",
)
_SGLANG_ROCM = JobImage(
    project_image("rocm-sglang"),
    "an image with SGLang for ROCm",
    public=False,
    build="neither the project nor vLLM publishes a ROCm image with SGLang (SGLang's own are"
    " tagged per GPU model): use rollout: vllm, or set image: to an SGLang ROCm image",
)


def default_image(acc: Accelerator | None, rollout: str) -> JobImage:
    """The image a plan names for this accelerator (None: a CPU job) and rollout."""
    vendor = acc.vendor if acc else "nvidia"  # CUDA builds of torch run on CPUs too
    if vendor == "ascend":
        return _ASCEND
    if vendor == "amd":
        return _SGLANG_ROCM if rollout == "sglang" else _VLLM_ROCM
    return _SGLANG_CUDA if rollout == "sglang" else _VLLM_CUDA
