"""CIFAR-10 from its python-pickle archive (downloaded once into a data folder), without torchvision."""

from __future__ import annotations

import logging
import os
import pickle
import tarfile
import urllib.request

import numpy as np
import torch
from torch.utils.data import Dataset

logger = logging.getLogger(__name__)

URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
ARCHIVE = "cifar-10-python.tar.gz"
FOLDER = "cifar-10-batches-py"
FILES = {"train": tuple(f"data_batch_{i}" for i in range(1, 6)), "val": ("test_batch",)}

#: Per-channel mean and standard deviation of the training images (in [0, 1]).
MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)

CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


def read_batch(path: str) -> tuple[np.ndarray, np.ndarray]:
    """One pickled batch file: images ``[n, 3, 32, 32]`` uint8 (RGB planes, rows of 32) and labels."""
    with open(path, "rb") as f:
        d = pickle.load(f, encoding="bytes")  # noqa: S301 - the dataset's own format, from a fixed https URL
    data = np.asarray(d[b"data"], dtype=np.uint8)
    labels = np.asarray(d[b"labels"], dtype=np.int64)
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or len(labels) != len(data):
        raise ValueError(f"{path}: expected data [n, 3072] and n labels, got {data.shape} and {len(labels)}")
    return data.reshape(-1, 3, 32, 32), labels


class CIFAR10(Dataset):
    """Images kept as uint8 (150 MB for the training set, not 600) and normalised per item:
    ``(x [3, 32, 32] float32, y int64)``."""

    def __init__(self, images: np.ndarray, labels: np.ndarray) -> None:
        self.images = torch.from_numpy(np.ascontiguousarray(images))
        self.targets = torch.from_numpy(labels)
        self._mean = torch.tensor(MEAN).view(3, 1, 1)
        self._std = torch.tensor(STD).view(3, 1, 1)

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.images[i].float().div_(255.0)
        return (x - self._mean) / self._std, self.targets[i]


def _fetch(data_dir: str) -> None:
    """Download the archive into ``data_dir`` (atomically) and unpack it there."""
    archive = os.path.join(data_dir, ARCHIVE)
    if not os.path.exists(archive):
        os.makedirs(data_dir, exist_ok=True)
        logger.info("downloading %s (170 MB)", URL)
        urllib.request.urlretrieve(URL, archive + ".part")  # noqa: S310 - a fixed https URL
        os.replace(archive + ".part", archive)
    with tarfile.open(archive, "r:gz") as tar:
        tar.extractall(data_dir, filter="data")  # no absolute paths, links out or devices


def cifar10_datasets(data_dir: str, download: bool = True) -> tuple[CIFAR10, CIFAR10]:
    """(train, val) ``CIFAR10`` datasets (50,000 and 10,000 images).

    Read from ``<data_dir>/cifar-10-batches-py/``; when that is missing, unpacked from
    ``<data_dir>/cifar-10-python.tar.gz``, which is downloaded from ``URL`` first if it is
    missing too and ``download`` is true (else ``FileNotFoundError``).
    """
    folder = os.path.join(data_dir, FOLDER)
    if not all(os.path.exists(os.path.join(folder, n)) for names in FILES.values() for n in names):
        if not download and not os.path.exists(os.path.join(data_dir, ARCHIVE)):
            raise FileNotFoundError(f"{folder} and {os.path.join(data_dir, ARCHIVE)} are missing (pass download=True)")
        _fetch(data_dir)
    out = []
    for split in ("train", "val"):
        parts = [read_batch(os.path.join(folder, name)) for name in FILES[split]]
        out.append(CIFAR10(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])))
    return out[0], out[1]
