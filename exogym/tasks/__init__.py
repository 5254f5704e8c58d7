"""Built-in tasks for ``exogym compare`` and your own scripts: a model factory, the train and
validation datasets, and an inner learning rate that suits them ([`load`][exogym.tasks.load]).

``digits`` and ``chars`` need no download (scikit-learn's bundled digits; the Python standard
library's source as text). ``mnist``, ``cifar10`` and ``shakespeare`` download their data once
into ``data_dir``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from exogym._lazy import lazy_exports

if TYPE_CHECKING:
    from torch import nn
    from torch.utils.data import Dataset

    from exogym.tasks.cifar10 import cifar10_datasets
    from exogym.tasks.cnn import SmallCNN
    from exogym.tasks.digits import MLPClassifier, digits_datasets
    from exogym.tasks.gpt import CharGPT
    from exogym.tasks.mnist import mnist_datasets
    from exogym.tasks.text import CharDataset, load_text, split_text, stdlib_corpus

# Each name is imported when first used: importing this package (for TASKS, say) imports no torch.
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "CharDataset": "exogym.tasks.text",
        "CharGPT": "exogym.tasks.gpt",
        "MLPClassifier": "exogym.tasks.digits",
        "SHAKESPEARE_URL": "exogym.tasks.text",
        "SmallCNN": "exogym.tasks.cnn",
        "cifar10_datasets": "exogym.tasks.cifar10",
        "digits_datasets": "exogym.tasks.digits",
        "load_text": "exogym.tasks.text",
        "mnist_datasets": "exogym.tasks.mnist",
        "split_text": "exogym.tasks.text",
        "stdlib_corpus": "exogym.tasks.text",
    },
)


@dataclass(frozen=True)
class Task:
    """A model factory, train and validation datasets, and the inner learning rate that suits them.

    Attributes:
        name: the task's name (one of [`TASKS`][exogym.tasks.TASKS] for a built-in task).
        make_model: builds a fresh model whose ``forward(batch)`` returns a scalar loss.
        train: the training set (``Trainer``'s ``train_dataset``).
        val: the validation set (``Trainer``'s ``val_dataset``).
        lr: an inner learning rate (AdamW) that trains the model in a few hundred steps.
    """

    name: str
    make_model: Callable[[], nn.Module]
    train: Dataset
    val: Dataset
    lr: float


TASKS = ("digits", "chars", "mnist", "cifar10", "shakespeare")
"""The built-in tasks' names, those that need no download first."""

CLASSES = {"digits": 10, "chars": 256, "mnist": 10, "cifar10": 10, "shakespeare": 256}
"""The label values of each built-in task (the text tasks' labels are next bytes): what
``Adversaries('label_flip')`` flips them within on the command line."""


def load(name: str, data_dir: str = "data") -> Task:
    """The built-in task ``name`` (one of [`TASKS`][exogym.tasks.TASKS]), its data loaded.

    * ``digits``: scikit-learn's bundled 8x8 digits (1,438 train, 359 val, 10 classes) and a
      64-256-256-10 [`MLPClassifier`][exogym.tasks.MLPClassifier]; needs scikit-learn (the
      ``[examples]`` extra).
    * ``chars``: the Python standard library's source as bytes, windows of 64, and a
      [`CharGPT`][exogym.tasks.CharGPT].
    * ``mnist``: MNIST, downloaded into ``<data_dir>/mnist``, and a 784-256-10
      [`MLPClassifier`][exogym.tasks.MLPClassifier].
    * ``cifar10``: CIFAR-10, downloaded into ``data_dir``, and a
      [`SmallCNN`][exogym.tasks.SmallCNN].
    * ``shakespeare``: tiny Shakespeare, downloaded into ``data_dir``, and a
      [`CharGPT`][exogym.tasks.CharGPT].

    Every task's learning rate is ``1e-3``.

    Args:
        name: the task's name.
        data_dir: where the downloaded tasks keep their files (``digits`` and ``chars`` read
            nothing from it).

    Raises:
        ValueError: ``name`` is not a built-in task (the message lists
            [`TASKS`][exogym.tasks.TASKS]).
        ImportError: ``digits`` without scikit-learn.
    """
    from exogym.tasks.cifar10 import cifar10_datasets
    from exogym.tasks.cnn import SmallCNN
    from exogym.tasks.digits import MLPClassifier, digits_datasets
    from exogym.tasks.gpt import CharGPT
    from exogym.tasks.mnist import mnist_datasets
    from exogym.tasks.text import SHAKESPEARE_URL, load_text, split_text, stdlib_corpus

    if name == "digits":
        train, val = digits_datasets()
        return Task(name, MLPClassifier, train, val, 1e-3)
    if name == "chars":
        train, val = split_text(stdlib_corpus(), block=64)
        return Task(name, CharGPT, train, val, 1e-3)
    if name == "shakespeare":
        train, val = split_text(load_text(os.path.join(data_dir, "shakespeare.txt"), SHAKESPEARE_URL), block=64)
        return Task(name, CharGPT, train, val, 1e-3)
    if name == "mnist":
        train, val = mnist_datasets(os.path.join(data_dir, "mnist"))
        return Task(name, lambda: MLPClassifier((784, 256, 10)), train, val, 1e-3)
    if name == "cifar10":
        train, val = cifar10_datasets(data_dir)
        return Task(name, SmallCNN, train, val, 1e-3)
    raise ValueError(f"unknown task {name!r}; choose from {TASKS}")


#: ``load_task`` is ``load`` (one of the alias spellings listed in ``exogym.compat``).
load_task = load

__all__ = [
    "CLASSES",
    "TASKS",
    "CharDataset",
    "CharGPT",
    "MLPClassifier",
    "SmallCNN",
    "Task",
    "cifar10_datasets",
    "digits_datasets",
    "load",
    "load_text",
    "mnist_datasets",
    "split_text",
    "stdlib_corpus",
]
