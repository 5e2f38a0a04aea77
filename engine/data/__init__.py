"""Prompt data: verl-layout files, a tokenised dataset, a resumable loader, prepare scripts."""

from engine.data.dataset import DataError, PromptDataset, PromptSample, RLDataset
from engine.data.loader import PromptLoader

__all__ = ["DataError", "PromptDataset", "PromptLoader", "PromptSample", "RLDataset"]
