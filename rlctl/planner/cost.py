"""Estimated hourly cost of a plan, from SkyPilot's price catalog when it is on this machine.

SkyPilot keeps one CSV per cloud under ``~/.sky/catalogs/v8/<cloud>/vms.csv`` (fetched
from the internet the first time SkyPilot's optimizer or ``sky show-gpus`` needs it).
rlctl only reads what is already there: no download, no SkyPilot import. Without a
catalog the answer is "price unavailable", never a guess.

The estimate is the cheapest catalog row with the accelerator and count per node (in
the region, when one is given), on-demand or spot, times the node count. Rows that
price a GPU alone (GCP's attachable GPUs have no instance type) leave out the host VM,
so such an estimate is a lower bound; ``Estimate.note`` says so.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

CATALOG_DIR = Path.home() / ".sky" / "catalogs" / "v8"
UNAVAILABLE = "price unavailable"


@dataclass(frozen=True)
class Estimate:
    per_node: float  # USD per hour
    nodes: int
    cloud: str
    region: str
    instance_type: str
    spot: bool
    source: str  # the catalog file
    note: str = ""

    @property
    def total(self) -> float:
        return self.per_node * self.nodes

    def describe(self) -> str:
        kind = "spot" if self.spot else "on-demand"
        where = f"{self.cloud} {self.region}".strip()
        what = self.instance_type or "GPU only"
        text = (
            f"${self.total:,.2f}/h ({self.nodes} x ${self.per_node:,.2f}, {kind}, {what},"
            f" {where}; SkyPilot catalog {self.source})"
        )
        return f"{text}; {self.note}" if self.note else text


def hourly_cost(
    accelerator: str,
    count: int,
    nodes: int,
    cloud: str | None = None,
    region: str | None = None,
    spot: bool = False,
    catalog_dir: Path | None = None,
) -> Estimate | None:
    """The cheapest matching offer in the local catalogs, or None if there is none."""
    catalog_dir = catalog_dir or CATALOG_DIR
    clouds = [cloud] if cloud else sorted(p.name for p in catalog_dir.glob("*") if p.is_dir())
    best: Estimate | None = None
    for name in clouds:
        path = catalog_dir / name / "vms.csv"
        if not path.is_file():
            continue
        with path.open(newline="") as f:
            for row in csv.DictReader(f):
                offer = _offer(row, accelerator, count, region, spot)
                if offer is None:
                    continue
                price, instance_type, row_region = offer
                if best is None or price < best.per_node:
                    best = Estimate(
                        per_node=price,
                        nodes=nodes,
                        cloud=name,
                        region=row_region,
                        instance_type=instance_type,
                        spot=spot,
                        source=str(path),
                        note="" if instance_type else "the host VM is not included",
                    )
    return best


def describe(estimate: Estimate | None) -> str:
    if estimate is None:
        return f"{UNAVAILABLE} (no SkyPilot catalog on this machine lists it)"
    return estimate.describe()


def _offer(
    row: dict[str, str], accelerator: str, count: int, region: str | None, spot: bool
) -> tuple[float, str, str] | None:
    if (row.get("AcceleratorName") or "").casefold() != accelerator.casefold():
        return None
    try:
        if float(row.get("AcceleratorCount") or "nan") != count:
            return None
        price = float(row.get("SpotPrice" if spot else "Price") or "nan")
    except ValueError:
        return None
    if price != price or price <= 0:  # NaN: not offered that way
        return None
    row_region = row.get("Region") or ""
    if region and row_region != region:
        return None
    return price, row.get("InstanceType") or "", row_region
