"""Byte-level text corpora: the Python standard library's own source (always present), and
tiny Shakespeare (downloaded once into a data folder)."""

from __future__ import annotations

import logging
import os
import sysconfig
import urllib.request

import torch
from torch.utils.data import Dataset

logger = logging.getLogger(__name__)

SHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"


class CharDataset(Dataset):
    """Windows of a byte sequence: item ``i`` is ``(data[s:s+block], data[s+1:s+block+1])`` with
    ``s = i * stride``, both int64."""

    def __init__(self, data: torch.Tensor, block: int, stride: int | None = None) -> None:
        if data.numel() < block + 2:
            raise ValueError(f"text of {data.numel()} bytes is too short for block={block}")
        self.data, self.block, self.stride = data.to(torch.int64), block, stride or block
        self.n = (data.numel() - block - 1) // self.stride + 1

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= i < self.n:
            raise IndexError(i)
        s = i * self.stride
        return self.data[s : s + self.block], self.data[s + 1 : s + self.block + 1]


def split_text(data: torch.Tensor, block: int, val_fraction: float = 0.1) -> tuple[CharDataset, CharDataset]:
    """(train, val) datasets over the first ``1 - val_fraction`` and the rest of ``data``."""
    cut = int(data.numel() * (1 - val_fraction))
    return CharDataset(data[:cut], block), CharDataset(data[cut:], block)


def stdlib_corpus(max_bytes: int = 2_000_000) -> torch.Tensor:
    """Bytes of the standard library's ``.py`` files (sorted paths, top folder first), up to
    ``max_bytes``: a text corpus present on every machine with Python."""
    root = sysconfig.get_paths()["stdlib"]
    chunks, total = [], 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("site-packages", "test", "tests", "idlelib"))
        for name in sorted(filenames):
            if not name.endswith(".py"):
                continue
            with open(os.path.join(dirpath, name), "rb") as f:
                blob = f.read()
            chunks.append(blob)
            total += len(blob)
            if total >= max_bytes:
                return torch.frombuffer(bytearray(b"".join(chunks)[:max_bytes]), dtype=torch.uint8)
    return torch.frombuffer(bytearray(b"".join(chunks)), dtype=torch.uint8)


def load_text(path: str, url: str | None = None) -> torch.Tensor:
    """Bytes of the file at ``path``, downloading it from ``url`` first when it is missing."""
    if not os.path.exists(path):
        if url is None:
            raise FileNotFoundError(f"{path} does not exist and no download URL was given")
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        logger.info("downloading %s to %s", url, path)
        tmp = path + ".part"
        urllib.request.urlretrieve(url, tmp)  # noqa: S310 - a fixed https URL
        os.replace(tmp, path)
    with open(path, "rb") as f:
        return torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)
