"""The data stage's error, apart from the dataset so that its helpers
(``engine.data.images``, the sources) can raise it without importing the dataset."""

from __future__ import annotations

from engine.errors import EngineError


class DataError(EngineError):
    """A data file or its contents cannot be used; the message says what to fix."""
