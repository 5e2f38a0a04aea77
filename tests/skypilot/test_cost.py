"""rlctl.planner.cost reads SkyPilot's local price catalog, or says the price is unavailable."""

from __future__ import annotations

from rlctl.planner.cost import UNAVAILABLE, describe, hourly_cost

HEADER = "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,Price,SpotPrice,Region,AvailabilityZone\n"


def _catalog(tmp_path):
    (tmp_path / "aws").mkdir()
    (tmp_path / "aws" / "vms.csv").write_text(
        HEADER
        + "p5.48xlarge,H100,8,192,2048,98.32,40.0,us-east-1,us-east-1a\n"
        + "p5.48xlarge,H100,8,192,2048,110.0,,eu-west-1,eu-west-1a\n"
        + "p4d.24xlarge,A100,8,96,1152,32.77,12.0,us-east-1,us-east-1a\n"
    )
    (tmp_path / "gcp").mkdir()
    (tmp_path / "gcp" / "vms.csv").write_text(
        HEADER + ",H100,8,,,90.0,,us-central1,us-central1-a\n"  # a GPU-only row
    )
    return tmp_path


def test_cheapest_matching_offer_times_nodes(tmp_path):
    cat = _catalog(tmp_path)
    est = hourly_cost("H100", 8, nodes=2, cloud="aws", catalog_dir=cat)
    assert (est.per_node, est.total, est.instance_type) == (98.32, 196.64, "p5.48xlarge")
    assert "$196.64/h" in describe(est)
    assert hourly_cost("H100", 8, 1, "aws", region="eu-west-1", catalog_dir=cat).per_node == 110.0
    assert hourly_cost("H100", 8, 1, "aws", spot=True, catalog_dir=cat).per_node == 40.0
    assert hourly_cost("H100", 8, 1, "aws", region="eu-west-1", spot=True, catalog_dir=cat) is None


def test_any_cloud_and_gpu_only_rows_say_so(tmp_path):
    est = hourly_cost("H100", 8, 1, catalog_dir=_catalog(tmp_path))
    assert est.cloud == "gcp" and "host VM is not included" in describe(est)


def test_no_catalog_is_unavailable(tmp_path):
    assert hourly_cost("H100", 8, 1, "gcp", catalog_dir=tmp_path / "none") is None
    assert describe(None).startswith(UNAVAILABLE)


def test_backend_estimate_without_a_catalog_says_unavailable(monkeypatch, tmp_path):
    import rlctl.planner.cost
    from rlctl.api import find_recipe, plan_recipe
    from rlctl.backends.skypilot import SkyPilotBackend, SkyPilotOptions
    from rlctl.job.spec import build_spec
    from rlctl.recipe.load import load_recipe

    monkeypatch.setattr(rlctl.planner.cost, "CATALOG_DIR", tmp_path)
    recipe = load_recipe(find_recipe("dapo_qwen32b"))
    backend = SkyPilotBackend(SkyPilotOptions(cloud="aws/us-east-1"))
    spec = build_spec(recipe, plan_recipe(recipe), backend.paths("j", recipe.checkpoints))
    assert backend.estimate(spec).startswith(UNAVAILABLE)
    _catalog(tmp_path)
    assert backend.estimate(spec).startswith("$1,573.12/h (16 x $98.32")
