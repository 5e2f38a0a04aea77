"""Where SkyPilot can run a job: the clouds and their regions (``--cloud``), which of
them offer which accelerator, and the fallbacks a plan also fits. Torch-free and
SkyPilot-free: ``rlctl plan`` and the profiles read it without importing SkyPilot."""

from __future__ import annotations

import re
from dataclasses import dataclass

from rlctl.errors import RlctlError
from rlctl.hardware import Accelerator, get_accelerator

# Which clouds offer which accelerator (the names of rlctl's hardware table), kept
# conservative: a cloud is listed for an accelerator only where SkyPilot 0.14.1's own
# catalog code names that accelerator for that cloud (files under sky/catalog/):
#   gcp     gcp_catalog.py _ACC_INSTANCE_TYPE_DICTS: A100 (a2-highgpu), A100-80GB
#           (a2-ultragpu), L4 (g2), H100 (a3-highgpu), H200 (a3-ultragpu), B200 (a4)
#   aws     data_fetchers/fetch_aws.py: A100-80GB (p4de), H200 (p5e/p5en), L4 (g6);
#           H100 (p5), A100 (p4d), L40S (g6e) come from the EC2 API as NVIDIA names them
#   azure   data_fetchers/fetch_azure.py family map: A100, A100-80GB, H100
#   lambda  data_fetchers/fetch_lambda_cloud.py: A100, A100-80GB, H100, B200
#   runpod  data_fetchers/fetch_runpod.py: A100-80GB, B200, H100, L4, L40S, MI300X
#           (its H200 is named H200-SXM there, so rlctl's "H200" is not listed)
#   nebius  H100, H200 (names from Nebius's API; the two its GPU clusters are sold with)
# Your own clusters (kubernetes, slurm, ssh) have whatever their nodes have: NVIDIA and
# AMD GPUs are accepted (SkyPilot schedules nvidia.com/gpu and amd.com/gpu); no
# SkyPilot infra schedules Ascend NPUs: use --backend slurm for those.
CLOUD_ACCELERATORS: dict[str, frozenset[str]] = {
    "gcp": frozenset({"A100-40GB", "A100-80GB", "L4", "H100", "H200", "B200"}),
    "aws": frozenset({"A100-40GB", "A100-80GB", "L4", "L40S", "H100", "H200"}),
    "azure": frozenset({"A100-40GB", "A100-80GB", "H100"}),
    "lambda": frozenset({"A100-40GB", "A100-80GB", "H100", "B200"}),
    "runpod": frozenset({"A100-80GB", "B200", "H100", "L4", "L40S", "MI300X"}),
    "nebius": frozenset({"H100", "H200"}),
}
OWN_CLUSTERS = ("kubernetes", "slurm", "ssh")  # any NVIDIA or AMD accelerator
_OWN_VENDORS = ("nvidia", "amd")
CLOUD_ALIASES = {"k8s": "kubernetes", "google": "gcp", "amazon": "aws"}
# Clouds SkyPilot 0.14 knows but rlctl has no accelerator table for: passed through
# (SkyPilot's optimizer decides), with the accelerator checked against SkyPilot's
# catalog flag only.
OTHER_CLOUDS = (
    "cudo", "do", "fluidstack", "hyperbolic", "ibm", "mithril", "oci", "paperspace",
    "primeintellect", "scp", "seeweb", "shadeform", "vast", "verda", "vsphere", "yotta",
)  # fmt: skip

# Ordered fallbacks: a plan sized for the first accelerator also fits the next ones
# (same vendor and software, no less memory, no less compute, fast links kept).
# B200 is left out: the default images (CUDA 13) carry sm_100 builds, but nothing here
# has run on one; a recipe that wants it names it.
FALLBACKS: dict[str, tuple[str, ...]] = {
    "H100": ("H200",),
    "A100-80GB": ("H100", "H200"),
    "A100-40GB": ("A100-80GB", "H100", "H200"),
    "L4": ("L40S",),
}


@dataclass(frozen=True)
class Infra:
    cloud: str | None  # canonical SkyPilot name, or None: any enabled cloud
    location: str  # "region" or "region/zone" (or a Kubernetes context), may be ""

    @property
    def value(self) -> str | None:
        if self.cloud is None:
            return None
        return f"{self.cloud}/{self.location}" if self.location else self.cloud


def parse_infra(text: str | None) -> Infra:
    """``gcp``, ``gcp/us-central1``, ``aws/us-east-1/us-east-1a``, ``k8s``, ``k8s/ctx``."""
    if text is None or not text.strip():
        return Infra(None, "")
    cloud, _, location = text.strip().partition("/")
    cloud = CLOUD_ALIASES.get(cloud.casefold(), cloud.casefold())
    known = (*CLOUD_ACCELERATORS, *OWN_CLUSTERS, *OTHER_CLOUDS)
    if cloud not in known:
        import difflib

        close = difflib.get_close_matches(cloud, known, n=1)
        did = f" (did you mean {close[0]!r}?)" if close else ""
        raise RlctlError(
            f"unknown cloud {cloud!r}{did}",
            hint=f"give one of: {', '.join(sorted(known))}; optionally /region[/zone]",
        )
    location = location.strip("/")
    if location:
        _check_location(cloud, location, text)
    return Infra(cloud, location)


# A region, zone, Slurm cluster/partition or Kubernetes context name: letters and digits
# first, then those and . _ - : @ + (EKS contexts are ARNs, GKE's have underscores).
_LOCATION_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+-]{0,252}")


def _check_location(cloud: str, location: str, text: str) -> None:
    parts = location.split("/")
    # a Kubernetes context may hold '/' (EKS: arn:...:cluster/NAME); elsewhere
    # region[/zone] or cluster[/partition]
    most = None if cloud == "kubernetes" else 2
    if not all(_LOCATION_PART.fullmatch(p) for p in parts) or (most and len(parts) > most):
        where = "context" if cloud == "kubernetes" else "region[/zone]"
        raise RlctlError(
            f"--cloud {text!r}: {location!r} is not a {cloud} {where}",
            hint="names of letters, digits and . _ - : @ + (no spaces, quotes or shell"
            " characters, not starting with '-'), e.g. gcp/us-central1,"
            " aws/us-east-1/us-east-1a, k8s/my-context, slurm/my-cluster",
        )


def check_offered(acc: Accelerator, infra: Infra) -> None:
    """Refuse an accelerator the chosen cloud (or every cloud) does not offer."""
    if acc.vendor == "ascend":
        raise RlctlError(
            f"{acc.name} cannot run through SkyPilot: no SkyPilot cloud or Kubernetes"
            " integration schedules Ascend NPUs",
            hint="use --backend slurm on an Ascend cluster",
        )
    cloud = infra.cloud
    if cloud in OWN_CLUSTERS:
        if acc.vendor not in _OWN_VENDORS:
            raise RlctlError(f"{acc.name} cannot be scheduled on {cloud}")
        return
    if cloud in CLOUD_ACCELERATORS:
        if acc.name not in CLOUD_ACCELERATORS[cloud]:
            offered = sorted(c for c, names in CLOUD_ACCELERATORS.items() if acc.name in names)
            where = f"clouds that offer it: {', '.join(offered)}" if offered else ""
            raise RlctlError(
                f"{cloud} does not offer {acc.name} (in SkyPilot's catalog)",
                hint=(where or "no public cloud in rlctl's table offers it")
                + "; or your own Kubernetes cluster: --cloud k8s",
            )
        return
    if not acc.skypilot_catalogued:
        raise RlctlError(
            f"{acc.name} is in no public cloud's SkyPilot catalog",
            hint="run it on your own cluster: --cloud k8s, or --backend slurm",
        )


def fallbacks(acc: Accelerator, infra: Infra) -> list[Accelerator]:
    """``acc`` and the FALLBACKS for it that ``infra`` offers, in order."""
    out = [acc]
    for name in FALLBACKS.get(acc.name, ()):
        other = get_accelerator(name)
        try:
            check_offered(other, infra)
        except RlctlError:
            continue
        out.append(other)
    return out
