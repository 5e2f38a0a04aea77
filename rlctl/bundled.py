"""Where the launcher's own data lives: ``templates/`` and ``recipes/``.

In a source checkout (and an editable install) they sit next to the ``rlctl`` package;
an installed wheel puts them under ``<prefix>/share/rlctl/`` (pyproject's data-files).
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

SOURCE_ROOT = Path(__file__).resolve().parent.parent
INSTALLED_ROOT = Path(sysconfig.get_path("data")) / "share" / "rlctl"


def bundled_dir(name: str) -> Path:
    """``templates`` or ``recipes``: the source tree's when there is one, else the
    installed copy (the source path is returned when neither exists, so the error names
    where a checkout would have it)."""
    source = SOURCE_ROOT / name
    if source.is_dir():
        return source
    installed = INSTALLED_ROOT / name
    return installed if installed.is_dir() else source
