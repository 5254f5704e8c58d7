"""Non-IID data: split one dataset into per-node shards by a named scheme.

[`partition`][exogym.partition.partition] returns a [`Partition`][exogym.partition.Partition], which
is a ``dataset_factory`` (pass it to ``Trainer`` as the training set). Every example goes to exactly
one node, and the split depends only on ``seed``. Schemes ([`SCHEMES`][exogym.partition.SCHEMES]):

* ``iid``: a random permutation cut into equal parts;
* ``dirichlet`` (Hsu et al. 2019): for every class, the shares of the nodes are drawn from
  ``Dirichlet(alpha, ..., alpha)`` and the class's examples (shuffled) are cut accordingly.
  Large ``alpha`` (1e3) is near-IID, small ``alpha`` (0.01) gives each node one or two
  dominant labels;
* ``shards`` (McMahan et al. 2017): the examples sorted by label (ties in a random order) are
  cut into ``num_nodes * shards_per_node`` shards of equal size (within one example), dealt at
  random, so each node holds about ``shards_per_node`` classes;
* ``quantity``: labels IID, but the nodes' sizes drawn from ``Dirichlet(alpha, ..., alpha)``.

``dirichlet`` and ``quantity`` draw again (from the same seeded stream) while a node would get
fewer than ``min_size`` examples; give ``min_size=batch_size`` so that every node can form a
batch.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # torch is imported where it is used: the command line reads SCHEMES without it
    import torch
    from torch.utils.data import Dataset

logger = logging.getLogger(__name__)

SCHEMES = ("iid", "dirichlet", "shards", "quantity")
"""The partition schemes [`partition`][exogym.partition.partition] takes."""
#: Draws tried before a ``min_size`` that cannot be met is reported.
_MAX_DRAWS = 1000


def labels_of(ds: Dataset) -> torch.Tensor:
    """The integer label of every example: a ``TensorDataset``'s second tensor, a ``targets``
    attribute (torchvision), or ``ds[i][1]`` read one by one."""
    import torch

    n = len(ds)  # type: ignore[arg-type]
    tensors = getattr(ds, "tensors", None)
    targets = getattr(ds, "targets", None)
    try:
        if tensors is not None and len(tensors) >= 2:
            labels = torch.as_tensor(tensors[1]).reshape(-1).long()
        elif targets is not None:
            labels = torch.as_tensor(targets).reshape(-1).long()
        else:
            labels = torch.tensor([int(ds[i][1]) for i in range(n)], dtype=torch.long)
    except (TypeError, ValueError, RuntimeError, IndexError) as e:
        raise ValueError(f"cannot read one integer label per example ({type(e).__name__}: {e})") from e
    if labels.numel() != n:
        raise ValueError(
            f"the dataset's labels are not one integer per example ({labels.numel()} labels for {n} examples): "
            "label-based partitions need a classification dataset"
        )
    return labels


class Partition:
    """A dataset split over nodes; a ``dataset_factory(rank, num_nodes, train_dataset)``.

    Attributes:
        dataset: the whole dataset.
        indices: ``indices[r]``: node ``r``'s examples (sorted).
        scheme: how it was split ([`SCHEMES`][exogym.partition.SCHEMES]).
        params: the scheme's settings, for logs.
    """

    def __init__(self, dataset: Dataset, indices: Sequence[Sequence[int]], scheme: str, params: dict[str, Any]) -> None:
        self.dataset, self.scheme, self.params = dataset, scheme, dict(params)
        self.indices = [sorted(int(i) for i in idx) for idx in indices]

    @property
    def num_nodes(self) -> int:
        """The number of nodes it was made for."""
        return len(self.indices)

    def __call__(self, rank: int, num_nodes: int, train: bool = True) -> Dataset:
        """Node ``rank``'s examples (the factory call; ``train`` is ignored)."""
        from torch.utils.data import Subset

        self._check_nodes(num_nodes)
        return Subset(self.dataset, self.indices[rank])

    def check(self, num_nodes: int, batch_size: int) -> None:
        """``ValueError`` unless a run of ``num_nodes`` nodes with ``batch_size`` examples per
        step can train on it (made for that node count; every node holds a full batch). ``fit``
        calls it before any process starts."""
        self._check_nodes(num_nodes)
        sizes = self.sizes()
        small = min(range(num_nodes), key=sizes.__getitem__)
        if sizes[small] < batch_size:
            raise ValueError(
                f"train_dataset: node {small} of the partition holds {sizes[small]} examples, fewer than "
                f"batch_size={batch_size}, so it has no full batch; pass a smaller batch_size or make the "
                f"partition with min_size={batch_size}"
            )

    def _check_nodes(self, num_nodes: int) -> None:
        if num_nodes != self.num_nodes:
            raise ValueError(
                f"this partition was made for num_nodes={self.num_nodes}, but the run has {num_nodes} nodes; "
                f"partition the dataset for {num_nodes} nodes"
            )

    def sizes(self) -> list[int]:
        """Examples per node."""
        return [len(i) for i in self.indices]

    def label_counts(self) -> torch.Tensor:
        """``[num_nodes, classes]``: how many examples of each label every node holds."""
        import torch

        labels = labels_of(self.dataset)
        classes = int(labels.max()) + 1 if len(labels) else 0
        return torch.stack([torch.bincount(labels[idx], minlength=classes) for idx in self.indices])

    def describe(self) -> str:
        """``scheme(settings)``, e.g. ``dirichlet(alpha=0.1, seed=0)``."""
        return f"{self.scheme}({', '.join(f'{k}={v}' for k, v in self.params.items())})"

    def log_summary(self, max_nodes: int = 8) -> None:
        """Log (INFO) the first ``max_nodes`` nodes' sizes and label histograms."""
        try:
            counts = self.label_counts()
        except (TypeError, ValueError, IndexError):  # no integer labels
            counts = None
        sizes = self.sizes()
        logger.info("partition %s: %d nodes, sizes %d..%d", self.describe(), self.num_nodes, min(sizes), max(sizes))
        for r in range(min(self.num_nodes, max_nodes)):
            hist = "" if counts is None else " labels " + " ".join(str(int(c)) for c in counts[r])
            logger.info("  node %d: %d examples%s", r, len(self.indices[r]), hist)
        if self.num_nodes > max_nodes:
            logger.info("  ... %d more nodes (Partition.label_counts() has them all)", self.num_nodes - max_nodes)

    def __repr__(self) -> str:
        return f"Partition({self.describe()}, num_nodes={self.num_nodes})"


def partition(
    dataset: Dataset,
    num_nodes: int,
    scheme: str = "iid",
    *,
    alpha: float = 0.5,
    shards_per_node: int = 2,
    min_size: int = 1,
    seed: int = 0,
) -> Partition:
    """Split ``dataset`` over ``num_nodes`` nodes by ``scheme`` (see the module docstring).

    Args:
        dataset: a map-style dataset; the label schemes (``dirichlet``, ``shards``) read integer
            labels with [`labels_of`][exogym.partition.labels_of].
        num_nodes: the run's node count (``fit(num_nodes=...)`` must match).
        scheme: one of [`SCHEMES`][exogym.partition.SCHEMES].
        alpha: concentration of ``dirichlet`` (label skew) and ``quantity`` (size skew), > 0.
        shards_per_node: shards per node for ``shards`` (about the classes each node holds).
        min_size: fewest examples a node may get (``dirichlet``, ``quantity`` draw again).
        seed: the split depends on nothing else.

    Returns:
        A [`Partition`][exogym.partition.Partition], usable as
        ``Trainer(model, partition(...), val_dataset)``.
    """
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    if not isinstance(num_nodes, int) or isinstance(num_nodes, bool) or num_nodes < 1:
        raise ValueError(f"num_nodes must be a positive int, got {num_nodes!r}")
    n = len(dataset)  # type: ignore[arg-type]
    if not isinstance(min_size, int) or min_size < 0 or min_size * num_nodes > n:
        raise ValueError(
            f"min_size must be an int in [0, len(dataset) / num_nodes = {n // num_nodes}], got {min_size!r}"
        )
    if n < num_nodes:
        raise ValueError(f"the dataset has {n} examples, fewer than num_nodes={num_nodes}: every node needs data")
    rng = np.random.default_rng(seed)
    if scheme == "iid":
        return Partition(dataset, np.array_split(rng.permutation(n), num_nodes), scheme, {"seed": seed})
    if scheme == "shards":
        if not isinstance(shards_per_node, int) or isinstance(shards_per_node, bool) or shards_per_node < 1:
            raise ValueError(f"shards_per_node must be a positive int, got {shards_per_node!r}")
        shards = num_nodes * shards_per_node
        if n < shards:
            raise ValueError(f"the dataset has {n} examples, fewer than num_nodes * shards_per_node = {shards}")
        labels = labels_of(dataset).numpy()
        shuffled = rng.permutation(n)
        order = shuffled[np.argsort(labels[shuffled], kind="stable")]
        pieces = np.array_split(order, shards)
        dealt = rng.permutation(shards)
        indices = [
            np.concatenate([pieces[s] for s in dealt[r * shards_per_node : (r + 1) * shards_per_node]])
            for r in range(num_nodes)
        ]
        return Partition(dataset, indices, scheme, {"shards_per_node": shards_per_node, "seed": seed})
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha > 0:
        raise ValueError(f"alpha (the Dirichlet concentration) must be > 0, got {alpha!r}")
    labels = labels_of(dataset).numpy() if scheme == "dirichlet" else None
    for _ in range(_MAX_DRAWS):
        if labels is not None:
            indices = _dirichlet_by_label(rng, labels, num_nodes, alpha)
        else:
            indices = _by_quantity(rng, n, num_nodes, alpha)
        if min(len(i) for i in indices) >= min_size:
            return Partition(dataset, indices, scheme, {"alpha": alpha, "seed": seed})
    raise ValueError(
        f"partition(scheme={scheme!r}, alpha={alpha}) gave some node fewer than min_size={min_size} examples in "
        f"{_MAX_DRAWS} draws; raise alpha or lower min_size"
    )


def _dirichlet_by_label(rng: np.random.Generator, labels: np.ndarray, k: int, alpha: float) -> list[np.ndarray]:
    parts: list[list[np.ndarray]] = [[] for _ in range(k)]
    for c in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == c))
        shares = rng.dirichlet(np.full(k, float(alpha)))
        cuts = np.round(np.cumsum(shares)[:-1] * len(members)).astype(int)
        for r, piece in enumerate(np.split(members, cuts)):
            parts[r].append(piece)
    return [np.concatenate(p) if p else np.empty(0, dtype=int) for p in parts]


def _by_quantity(rng: np.random.Generator, n: int, k: int, alpha: float) -> list[np.ndarray]:
    shares = rng.dirichlet(np.full(k, float(alpha)))
    cuts = np.round(np.cumsum(shares)[:-1] * n).astype(int)
    return np.split(rng.permutation(n), cuts)


__all__ = ["SCHEMES", "Partition", "labels_of", "partition"]
