"""The accelerator catalog: one row of facts per accelerator, data not code.

Every place in the launcher that needs to know about a device (the planner's memory
and parallelism sizing, the Ray bootstrap, the Slurm ``--gres`` line, the SkyPilot
``accelerators:`` field) reads it from ``ACCELERATORS``; the container image per vendor
is rlctl/planner/images.py's.

Conventions of the table:

- ``memory_gib`` and ``bf16_tflops`` are the vendor datasheet figures for ONE device as
  torch and Ray count devices: dense bf16 (no 2:4 sparsity), nominal memory. What the
  driver leaves usable is a little less (firmware reservation; ECC on GDDR parts), so
  the planner keeps its own headroom.
- An MI250X/MI250 module holds two graphics compute dies and ROCm shows each as its
  own GPU; a row there describes one die (64 GiB), which is what ``HIP_VISIBLE_DEVICES``,
  Ray's ``GPU`` resource, Slurm's ``gpu`` GRES and ``MI250X:8`` count.
- NVIDIA rows are the SXM/HGX parts; PCIe and NVL boards differ (fewer TFLOPS, NVLink
  bridges between pairs at most) and are not in the table.
- Per vendor, the software columns match ``engine/device.py``'s ``DEVICES``: ROCm torch
  calls AMD GPUs ``cuda`` and reaches RCCL through the ``nccl`` backend name (hence
  ``torch_backend``); Ascend NPUs are ``npu`` with HCCL, from ``torch_npu``. Ray counts
  AMD GPUs by ``HIP_VISIBLE_DEVICES`` and refuses a bare ``ROCR_VISIBLE_DEVICES``, so
  jobs must never set the latter.
- ``rollout_backends`` and ``train_backends`` list what upstream supports on that
  device, in order of preference; docs/hardware.md gives the basis of each claim.

This module imports nothing heavy (no torch, ray or engine); keep it that way.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from rlctl.errors import AcceleratorSpecError, RlctlError, UnknownAcceleratorError

VENDORS = ("nvidia", "amd", "ascend")
ROLLOUT_BACKENDS = ("vllm", "sglang", "hf")  # engine.config.ROLLOUT_BACKENDS, same names
TRAIN_BACKENDS = ("fsdp", "fsdp2", "megatron")  # engine.config.TRAIN_STRATEGIES


@dataclass(frozen=True)
class Accelerator:
    name: str  # canonical, as users and SkyPilot write it
    vendor: str  # nvidia | amd | ascend
    memory_gib: float  # one device, nominal (datasheet)
    bf16_tflops: float  # one device, dense bf16 peak (no sparsity)
    interconnect: str  # intra-node device-to-device link, for people
    nvlink_like: bool  # fast intra-node links: tensor parallel across devices is cheap
    ray_resource: str  # GPU | NPU
    visible_devices_var: str  # CUDA_/HIP_/ASCEND_RT_VISIBLE_DEVICES
    collective_backend: str  # the library: nccl | rccl | hccl
    torch_device: str  # torch device type: cuda (NVIDIA and ROCm) | npu
    rollout_backends: tuple[str, ...]  # subset of ROLLOUT_BACKENDS, preferred first
    train_backends: tuple[str, ...]  # subset of TRAIN_BACKENDS, preferred first
    skypilot_name: str  # what goes in SkyPilot's `accelerators: NAME:COUNT`
    skypilot_catalogued: bool  # some public cloud in SkyPilot's catalog offers it
    slurm_gres: str  # GRES type in `--gres=gpu:<type>:<n>` (sites name types freely)
    aliases: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict, hash=False)  # read-only
    source: str = ""  # where memory and TFLOPS come from
    notes: str = ""  # caveats a planner or a reader should know

    def __post_init__(self) -> None:
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))

    @property
    def torch_backend(self) -> str:
        """The ``torch.distributed`` backend name: RCCL is reached as ``nccl``."""
        return "nccl" if self.collective_backend == "rccl" else self.collective_backend

    @property
    def slurm_gres_name(self) -> str:
        """The GRES name: ``gpu`` for NVIDIA and AMD, ``npu`` for Ascend."""
        return "npu" if self.vendor == "ascend" else "gpu"

    def gres(self, count: int) -> str:
        """The ``--gres`` value for ``count`` devices per node, e.g. ``gpu:h100:8``."""
        return f"{self.slurm_gres_name}:{self.slurm_gres}:{count}"


# The per-vendor software stack: every row of a vendor shares these columns.
_NVIDIA = dict(
    vendor="nvidia",
    ray_resource="GPU",
    visible_devices_var="CUDA_VISIBLE_DEVICES",
    collective_backend="nccl",
    torch_device="cuda",
    # NCCL prints nothing by default; warnings name the failing link when a job hangs.
    env={"NCCL_DEBUG": "WARN"},
)
_AMD = dict(
    vendor="amd",
    ray_resource="GPU",
    visible_devices_var="HIP_VISIBLE_DEVICES",
    collective_backend="rccl",
    torch_device="cuda",
    env={"NCCL_DEBUG": "WARN"},  # RCCL reads the NCCL_* variables
)
_ASCEND = dict(
    vendor="ascend",
    ray_resource="NPU",
    visible_devices_var="ASCEND_RT_VISIBLE_DEVICES",
    collective_backend="hccl",
    torch_device="npu",
    # HCCL's default link-setup timeout (120 s) is too short for multi-node starts.
    env={"HCCL_CONNECT_TIMEOUT": "1200"},
)

_ALL_ROLLOUT = ("vllm", "sglang", "hf")
_ALL_TRAIN = ("fsdp2", "fsdp", "megatron")

ACCELERATORS: tuple[Accelerator, ...] = (
    # ---- NVIDIA ------------------------------------------------------------------
    Accelerator(
        name="H100",
        **_NVIDIA,
        memory_gib=80,
        bf16_tflops=989,
        interconnect="NVLink 4: 900 GB/s",
        nvlink_like=True,
        rollout_backends=_ALL_ROLLOUT,
        train_backends=_ALL_TRAIN,
        skypilot_name="H100",
        skypilot_catalogued=True,
        slurm_gres="h100",
        aliases=("H100-80GB", "H100-SXM", "H100-SXM5", "H100-SXM5-80GB", "H100-80GB-HBM3"),
        # NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column: BF16 1,979 TFLOPS
        # with sparsity (989 dense), 80 GB HBM3, NVLink 900 GB/s.
        source="NVIDIA H100 Tensor Core GPU datasheet (H100 SXM)",
    ),
    Accelerator(
        name="H200",
        **_NVIDIA,
        memory_gib=141,
        bf16_tflops=989,
        interconnect="NVLink 4: 900 GB/s",
        nvlink_like=True,
        rollout_backends=_ALL_ROLLOUT,
        train_backends=_ALL_TRAIN,
        skypilot_name="H200",
        skypilot_catalogued=True,
        slurm_gres="h200",
        aliases=("H200-141GB", "H200-SXM"),
        # NVIDIA H200 Tensor Core GPU datasheet, H200 SXM column: BF16 1,979 TFLOPS
        # with sparsity (989 dense), 141 GB HBM3e, NVLink 900 GB/s.
        source="NVIDIA H200 Tensor Core GPU datasheet (H200 SXM)",
    ),
    Accelerator(
        name="B200",
        **_NVIDIA,
        memory_gib=180,
        bf16_tflops=2250,
        interconnect="NVLink 5: 1.8 TB/s",
        nvlink_like=True,
        rollout_backends=_ALL_ROLLOUT,
        train_backends=_ALL_TRAIN,
        skypilot_name="B200",
        skypilot_catalogued=True,
        slurm_gres="b200",
        aliases=("B200-180GB", "HGX-B200"),
        # NVIDIA HGX B200 specifications, per GPU: FP16/BF16 4.5 PFLOPS with sparsity
        # (2.25 dense), 180 GB HBM3e, 5th-generation NVLink 1.8 TB/s.
        source="NVIDIA HGX B200 datasheet (per-GPU column)",
        notes="needs CUDA 12.8+ builds of torch, vLLM and SGLang (sm_100)",
    ),
    Accelerator(
        name="A100-80GB",
        **_NVIDIA,
        memory_gib=80,
        bf16_tflops=312,
        interconnect="NVLink 3: 600 GB/s",
        nvlink_like=True,
        rollout_backends=_ALL_ROLLOUT,
        train_backends=_ALL_TRAIN,
        skypilot_name="A100-80GB",
        skypilot_catalogued=True,
        slurm_gres="a100-80gb",
        aliases=("A100-80G", "A100-SXM4-80GB", "A100-80GB-SXM", "A100-80GB-SXM4"),
        # NVIDIA A100 Tensor Core GPU datasheet, A100 80GB SXM column: BF16 312 TFLOPS
        # (624 with sparsity), 80 GB HBM2e, NVLink 600 GB/s.
        source="NVIDIA A100 Tensor Core GPU datasheet (A100 80GB SXM)",
    ),
    Accelerator(
        name="A100-40GB",
        **_NVIDIA,
        memory_gib=40,
        bf16_tflops=312,
        interconnect="NVLink 3: 600 GB/s",
        nvlink_like=True,
        rollout_backends=_ALL_ROLLOUT,
        train_backends=_ALL_TRAIN,
        # SkyPilot's plain "A100" is the 40 GB part.
        skypilot_name="A100",
        skypilot_catalogued=True,
        slurm_gres="a100-40gb",
        aliases=("A100-40G", "A100-SXM4-40GB", "A100-40GB-SXM", "A100-40GB-SXM4"),
        # NVIDIA A100 Tensor Core GPU datasheet, A100 40GB SXM column: BF16 312 TFLOPS
        # (624 with sparsity), 40 GB HBM2, NVLink 600 GB/s.
        source="NVIDIA A100 Tensor Core GPU datasheet (A100 40GB SXM)",
    ),
    Accelerator(
        name="L40S",
        **_NVIDIA,
        memory_gib=48,
        bf16_tflops=362,
        interconnect="PCIe 4.0 x16: 64 GB/s (no NVLink)",
        nvlink_like=False,
        rollout_backends=_ALL_ROLLOUT,
        train_backends=_ALL_TRAIN,
        skypilot_name="L40S",
        skypilot_catalogued=True,
        slurm_gres="l40s",
        aliases=("L40S-48GB",),
        # NVIDIA L40S datasheet: BF16 362.05 TFLOPS dense (733 with sparsity),
        # 48 GB GDDR6 with ECC, PCIe Gen4 x16.
        source="NVIDIA L40S GPU datasheet",
    ),
    Accelerator(
        name="L4",
        **_NVIDIA,
        memory_gib=24,
        bf16_tflops=121,
        interconnect="PCIe 4.0 x16: 64 GB/s (no NVLink)",
        nvlink_like=False,
        rollout_backends=_ALL_ROLLOUT,
        train_backends=_ALL_TRAIN,
        skypilot_name="L4",
        skypilot_catalogued=True,
        slurm_gres="l4",
        aliases=("L4-24GB",),
        # NVIDIA L4 Tensor Core GPU datasheet: BF16 242 TFLOPS with sparsity
        # (121 dense), 24 GB GDDR6, PCIe Gen4 x16.
        source="NVIDIA L4 Tensor Core GPU datasheet",
    ),
    # ---- AMD (ROCm) --------------------------------------------------------------
    Accelerator(
        name="MI300X",
        **_AMD,
        memory_gib=192,
        bf16_tflops=1307.4,
        interconnect="Infinity Fabric: 7 links x 128 GB/s",
        nvlink_like=True,
        rollout_backends=_ALL_ROLLOUT,
        train_backends=_ALL_TRAIN,
        skypilot_name="MI300X",
        skypilot_catalogued=True,
        slurm_gres="mi300x",
        aliases=("MI300X-OAM", "MI300X-192GB"),
        # AMD Instinct MI300X data sheet: peak BF16 1307.4 TFLOPS dense (2614.9 with
        # sparsity), 192 GB HBM3, 7 Infinity Fabric links at 128 GB/s peak each.
        source="AMD Instinct MI300X accelerator data sheet",
        notes="megatron through AMD's ROCm builds of Megatron-LM and Transformer Engine",
    ),
    Accelerator(
        name="MI325X",
        **_AMD,
        memory_gib=256,
        bf16_tflops=1307.4,
        interconnect="Infinity Fabric: 7 links x 128 GB/s",
        nvlink_like=True,
        rollout_backends=_ALL_ROLLOUT,
        train_backends=_ALL_TRAIN,
        skypilot_name="MI325X",
        skypilot_catalogued=False,
        slurm_gres="mi325x",
        aliases=("MI325X-OAM", "MI325X-256GB"),
        # AMD Instinct MI325X data sheet: the MI300X's compute (peak BF16 1307.4 TFLOPS
        # dense) with 256 GB HBM3E.
        source="AMD Instinct MI325X accelerator data sheet",
        notes="megatron through AMD's ROCm builds of Megatron-LM and Transformer Engine",
    ),
    Accelerator(
        name="MI250X",
        **_AMD,
        memory_gib=64,
        bf16_tflops=191.5,
        interconnect="Infinity Fabric (xGMI): 8 links per module",
        nvlink_like=True,
        rollout_backends=("vllm", "hf"),
        train_backends=("fsdp2", "fsdp"),
        skypilot_name="MI250X",
        skypilot_catalogued=False,
        slurm_gres="mi250x",
        aliases=("MI250X-OAM",),
        # AMD Instinct MI250X data sheet, per OAM module: peak BF16 383 TFLOPS,
        # 128 GB HBM2e, over two dies; one die (one ROCm device) has half of each.
        source="AMD Instinct MI250X accelerator data sheet (per module, halved per die)",
        notes="one row is one die: an MI250X module is two ROCm devices",
    ),
    Accelerator(
        name="MI250",
        **_AMD,
        memory_gib=64,
        bf16_tflops=181.05,
        interconnect="Infinity Fabric (xGMI): 6 links per module",
        nvlink_like=True,
        rollout_backends=("vllm", "hf"),
        train_backends=("fsdp2", "fsdp"),
        skypilot_name="MI250",
        skypilot_catalogued=False,
        slurm_gres="mi250",
        aliases=("MI250-OAM",),
        # AMD Instinct MI250 data sheet, per OAM module: peak BF16 362.1 TFLOPS,
        # 128 GB HBM2e, over two dies; one die (one ROCm device) has half of each.
        source="AMD Instinct MI250 accelerator data sheet (per module, halved per die)",
        notes="one row is one die: an MI250 module is two ROCm devices",
    ),
    # ---- Huawei Ascend -----------------------------------------------------------
    Accelerator(
        name="Ascend910B",
        **_ASCEND,
        memory_gib=64,
        bf16_tflops=313,
        interconnect="HCCS (NPU-to-NPU within a node)",
        nvlink_like=True,
        rollout_backends=("vllm", "hf"),
        train_backends=("fsdp2", "fsdp"),
        skypilot_name="Ascend910B",
        skypilot_catalogued=False,
        slurm_gres="ascend910b",
        aliases=("910B", "Ascend-910B", "Ascend910B1", "Ascend910B2", "Ascend910B3"),
        # Huawei publishes no per-chip datasheet for the 910B. 64 GB HBM2e is what an
        # Atlas 800T A2 (8 x 910B) shows per NPU; ~313 TFLOPS FP16/BF16 is the figure
        # most often reported for the 910B3 (reports span roughly 280-376 across SKUs).
        source="approximate: Huawei Atlas 800T A2 specs (memory); public reports (TFLOPS)",
        notes=(
            "TFLOPS approximate; vllm through the vllm-ascend plugin (Atlas A2 series); "
            "910B4 (32 GB) is a different SKU and not in the table"
        ),
    ),
)

# Names that match more than one row: refused with every candidate named.
_AMBIGUOUS: dict[str, tuple[str, ...]] = {
    "A100": ("A100-40GB", "A100-80GB"),
    "A100-SXM": ("A100-40GB", "A100-80GB"),
    "A100-SXM4": ("A100-40GB", "A100-80GB"),
}
_AMBIGUOUS_HINT = {
    "A100": "A100 comes with 40 GB or 80 GB, and SkyPilot's plain 'A100' means the 40 GB part",
}

# Leading words that name the vendor, not the part ("NVIDIA H100", "AMD-Instinct-MI300X").
_VENDOR_PREFIXES = ("amdinstinct", "instinct", "nvidia", "amd", "huawei")


def _key(name: str) -> str:
    """Lower case, without separators: 'A100 80GB', 'a100_80gb' and 'A100-80GB' meet."""
    return re.sub(r"[\s_\-./]+", "", name).casefold()


def _build_index() -> dict[str, Accelerator]:
    index: dict[str, Accelerator] = {}
    for acc in ACCELERATORS:
        for spelling in (acc.name, *acc.aliases):
            key = _key(spelling)
            other = index.get(key)
            if other is not None and other is not acc:
                raise AssertionError(f"{spelling!r} names both {other.name} and {acc.name}")
            index[key] = acc
    for spelling in _AMBIGUOUS:
        if _key(spelling) in index:
            raise AssertionError(f"{spelling!r} is both a name and ambiguous")
    return index


_INDEX = _build_index()


def known_names() -> tuple[str, ...]:
    """The canonical names, in table order."""
    return tuple(acc.name for acc in ACCELERATORS)


def _candidates(key: str) -> tuple[str, ...]:
    """Keys to try: the name itself, then without a vendor word in front."""
    keys = [key]
    for prefix in _VENDOR_PREFIXES:
        if key.startswith(prefix) and len(key) > len(prefix):
            keys.append(key[len(prefix) :])
    return tuple(keys)


def _suggest(key: str) -> tuple[str, ...]:
    ambiguous = {_key(k): v for k, v in _AMBIGUOUS.items()}
    pool = [*_INDEX, *ambiguous]
    names: list[str] = []
    for cand in _candidates(key):
        for match in difflib.get_close_matches(cand, pool, n=6, cutoff=0.6):
            found = (_INDEX[match].name,) if match in _INDEX else ambiguous[match]
            names.extend(n for n in found if n not in names)
    return tuple(names[:4])


def get_accelerator(name: str) -> Accelerator:
    """The row for ``name``: case-insensitive, separators ignored, aliases accepted.

    Raises ``UnknownAcceleratorError`` (message with close matches and every known
    name) for an unknown name, and for an ambiguous one such as ``A100``.
    """
    key = _key(name)
    if not key:
        raise UnknownAcceleratorError(
            "empty accelerator name",
            hint=f"name one of: {', '.join(known_names())}",
        )
    ambiguous = {_key(k): (k, v) for k, v in _AMBIGUOUS.items()}
    for cand in _candidates(key):
        if cand in _INDEX:
            return _INDEX[cand]
        if cand in ambiguous:
            spelled, options = ambiguous[cand]
            why = _AMBIGUOUS_HINT.get(spelled, f"{spelled} names more than one accelerator")
            raise UnknownAcceleratorError(
                f"accelerator {name!r} is ambiguous: use {' or '.join(options)}",
                hint=f"{why}; write the full name, e.g. {options[-1]}:8",
                suggestions=options,
            )
    suggestions = _suggest(key)
    did_you_mean = f" Did you mean {' or '.join(suggestions)}?" if suggestions else ""
    raise UnknownAcceleratorError(
        f"unknown accelerator {name!r}.{did_you_mean} Known: {', '.join(known_names())}",
        hint="names are case-insensitive and accept aliases (docs/hardware.md lists them)",
        suggestions=suggestions,
    )


_COUNT = re.compile(r"[0-9]+")


def parse_accelerator_spec(spec: str) -> tuple[Accelerator, int]:
    """``"H100:8"`` -> (H100 row, 8); ``"h100"`` -> (H100 row, 1).

    The count must be a whole number of at least 1; whether a count suits a node is
    the planner's business, not this parser's.
    """
    text = spec.strip()
    name, sep, count_text = text.partition(":")
    if not name.strip():
        raise AcceleratorSpecError(
            f"accelerator spec {spec!r} has no accelerator name",
            hint="write NAME[:COUNT], e.g. H100:8",
        )
    count = 1
    if sep:
        count_text = count_text.strip()
        if ":" in count_text:
            raise AcceleratorSpecError(
                f"accelerator spec {spec!r} has more than one ':'",
                hint="write NAME[:COUNT], e.g. H100:8",
            )
        if re.fullmatch(r"[+-]?[0-9]+", count_text) and int(count_text) < 1:
            raise AcceleratorSpecError(
                f"accelerator spec {spec!r}: the count must be at least 1, got {count_text}",
                hint=f"write the devices per node as a positive integer, e.g. {name.strip()}:8",
            )
        if not _COUNT.fullmatch(count_text):
            raise AcceleratorSpecError(
                f"accelerator spec {spec!r}: count {count_text!r} is not a whole number",
                hint=f"write the devices per node as a positive integer, e.g. {name.strip()}:8",
            )
        count = int(count_text)
        if count < 1:
            raise AcceleratorSpecError(
                f"accelerator spec {spec!r}: count must be at least 1, got {count}",
                hint=f"write the devices per node as a positive integer, e.g. {name.strip()}:8",
            )
    return get_accelerator(name.strip()), count


def by_vendor(vendor: str) -> tuple[Accelerator, ...]:
    """The rows of one vendor (nvidia | amd | ascend), in table order."""
    wanted = vendor.strip().casefold()
    if wanted not in VENDORS:
        raise RlctlError(
            f"unknown accelerator vendor {vendor!r}; known: {', '.join(VENDORS)}",
            hint="vendors are nvidia (CUDA), amd (ROCm) and ascend (Huawei NPUs)",
        )
    return tuple(acc for acc in ACCELERATORS if acc.vendor == wanted)
