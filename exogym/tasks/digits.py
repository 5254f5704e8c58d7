"""8x8 handwritten digits (scikit-learn's bundled copy of the UCI set) and an MLP for them."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset


def _load_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's bundled digits as ``(x [1797, 64], y [1797])``.

    Read straight from the CSV scikit-learn ships (importing scikit-learn takes over a second,
    paid by every worker process); ``load_digits`` where the file has moved.
    """
    spec = importlib.util.find_spec("sklearn")
    if spec is None:
        raise ImportError("the built-in digits task needs scikit-learn: pip install 'exogym[examples]'")
    for root in spec.submodule_search_locations or []:
        path = os.path.join(root, "datasets", "data", "digits.csv.gz")
        if os.path.exists(path):
            data = np.loadtxt(path, delimiter=",")
            return data[:, :-1], data[:, -1].astype(np.int64)
    from sklearn.datasets import load_digits

    return load_digits(return_X_y=True)


def digits_datasets(val_fraction: float = 0.2, seed: int = 0) -> tuple[TensorDataset, TensorDataset]:
    """(train, val) ``TensorDataset`` s of ``(x [64] float32 in [0, 1], y int64)`` from the 1,797
    bundled digits, split once with ``seed``."""
    x, y = _load_digits()
    x = torch.tensor(x, dtype=torch.float32) / 16.0
    y = torch.tensor(y, dtype=torch.int64)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    n_val = int(len(x) * val_fraction)
    val, train = perm[:n_val], perm[n_val:]
    return TensorDataset(x[train], y[train]), TensorDataset(x[val], y[val])


class MLPClassifier(nn.Module):
    """An MLP whose ``forward((x, y))`` returns the mean cross-entropy (the ExoGym model contract).

    Args:
        sizes: layer widths from input to classes; the default 64-256-256-10 has 85,002
            parameters (the benchmark model).
    """

    def __init__(self, sizes: Sequence[int] = (64, 256, 256, 10)) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
            layers.append(nn.Linear(a, b))
            if i < len(sizes) - 2:
                layers.append(nn.ReLU())
        self.net = nn.Sequential(*layers)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Class scores ``[batch, classes]`` for inputs ``[batch, sizes[0]]``."""
        return self.net(x)

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self.logits(x), y)
