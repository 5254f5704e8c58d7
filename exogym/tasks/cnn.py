"""A small convolutional classifier for 32x32 colour images (CIFAR-10)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SmallCNN(nn.Module):
    """Three 3x3 conv blocks (conv, ReLU, 2x2 max-pool) and a two-layer head; ``forward((x, y))``
    is the mean cross-entropy, ``logits(x)`` the class scores.

    Args:
        width: channels of the first block (doubled in the second and third); the default 32
            gives 188,810 parameters.
        classes: output classes.
    """

    def __init__(self, width: int = 32, classes: int = 10) -> None:
        super().__init__()
        chans = (3, width, 2 * width, 2 * width)
        self.features = nn.Sequential(
            *(
                layer
                for a, b in zip(chans[:-1], chans[1:], strict=True)
                for layer in (nn.Conv2d(a, b, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
            )
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(chans[-1] * 4 * 4, 128), nn.ReLU(), nn.Linear(128, classes))

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Class scores ``[batch, classes]`` for images ``[batch, 3, 32, 32]``."""
        return self.head(self.features(x))

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self.logits(x), y)
