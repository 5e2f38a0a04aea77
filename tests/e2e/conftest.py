"""Shared by the whole-run tests: the synthetic task's files, built once per module."""

import pytest


@pytest.fixture(scope="module")
def synthetic_data(tmp_path_factory):
    from engine.data.synthetic import write_synthetic_dataset

    return write_synthetic_dataset(tmp_path_factory.mktemp("synthetic"), n_train=512, n_val=32)
