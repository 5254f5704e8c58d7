"""MNIST from its IDX files (downloaded once into a data folder), without torchvision."""

from __future__ import annotations

import gzip
import logging
import os
import struct
import urllib.request

import numpy as np
import torch
from torch.utils.data import TensorDataset

logger = logging.getLogger(__name__)

MIRROR = "https://ossci-datasets.s3.amazonaws.com/mnist/"
FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "val": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}


def read_idx(path: str) -> np.ndarray:
    """An IDX array (gzip or plain): big-endian magic ``0x0000 dtype ndim``, dims, data."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    zero, dtype_code, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0 or dtype_code != 0x08:
        raise ValueError(f"{path} is not an unsigned-byte IDX file")
    dims = struct.unpack(f">{ndim}I", raw[4 : 4 + 4 * ndim])
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise ValueError(f"{path}: header says {dims} but holds {data.size} values")
    return data.reshape(dims)


def mnist_datasets(data_dir: str, download: bool = True) -> tuple[TensorDataset, TensorDataset]:
    """(train, val) ``TensorDataset`` s of ``(x [784] float32 in [0, 1], y int64)``.

    Files are read from ``data_dir``; missing ones are downloaded from ``MIRROR`` when
    ``download`` is true, else ``FileNotFoundError`` is raised.
    """
    out = []
    for split in ("train", "val"):
        arrays = []
        for name in FILES[split]:
            path = os.path.join(data_dir, name)
            if not os.path.exists(path):
                if not download:
                    raise FileNotFoundError(f"{path} is missing (pass download=True to fetch it)")
                os.makedirs(data_dir, exist_ok=True)
                logger.info("downloading %s", MIRROR + name)
                urllib.request.urlretrieve(MIRROR + name, path + ".part")  # noqa: S310 - a fixed https URL
                os.replace(path + ".part", path)
            arrays.append(read_idx(path))
        images, labels = arrays
        x = torch.tensor(images.reshape(len(images), -1), dtype=torch.float32) / 255.0
        out.append(TensorDataset(x, torch.tensor(labels, dtype=torch.int64)))
    return out[0], out[1]
