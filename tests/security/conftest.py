"""Hypothesis keeps its caches outside the working tree (not a .hypothesis/ folder in it)."""

import tempfile
from pathlib import Path

from hypothesis.configuration import set_hypothesis_home_dir

set_hypothesis_home_dir(str(Path(tempfile.gettempdir()) / "rlctl-hypothesis"))
