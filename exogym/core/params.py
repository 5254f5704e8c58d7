"""``ModelParameters``: a model's parameters as the inner optimizer receives them, with their model."""

from __future__ import annotations

from collections.abc import Iterator

import torch


class ModelParameters:
    """The parameters of ``model``, iterated as ``model.parameters()`` gives them (each once, in
    the model's order), so every torch optimizer takes it as its ``params``. Its ``model`` lets an
    optimizer that treats parameters by their role read the model's modules:
    [`MuonAdamW`][exogym.strategy.MuonAdamW] finds the embeddings and the output head this way.

    Args:
        model: the node's model.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def __iter__(self) -> Iterator[torch.nn.Parameter]:
        return iter(self.model.parameters())


__all__ = ["ModelParameters"]
