"""The shared hint for an unknown name (recipes, Slurm and SkyPilot site profiles)."""

from rlctl.errors import closest_or_all


def test_hint_names_the_closest_or_lists_every_known_name():
    assert closest_or_all("imgae", ("image", "prelude")) == "did you mean 'image'?"
    assert closest_or_all("zzz", ("image", "prelude")) == "fields: image, prelude"
    assert closest_or_all(3, {"a": 1, "b": 2}, listing="valid") == "valid: a, b"
