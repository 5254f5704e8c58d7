"""Non-IID partitions: every example once, deterministic from the seed, and the skew each
scheme promises, measured on the bundled digits data (10 classes)."""

from __future__ import annotations

import pytest
import torch

from exogym import Trainer
from exogym.data import partition
from exogym.partition import SCHEMES
from exogym.strategy import FedAvgStrategy
from exogym.tasks.digits import MLPClassifier, digits_datasets

TRAIN, VAL = digits_datasets()
LABELS = TRAIN.tensors[1]


def _top2_share(counts: torch.Tensor) -> list[float]:
    """Per node: the share of its examples in its two most frequent labels."""
    c = counts.double()
    return (c.sort(1, descending=True).values[:, :2].sum(1) / c.sum(1)).tolist()


@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_example_goes_to_exactly_one_node_and_the_seed_fixes_the_split(scheme: str) -> None:
    a = partition(TRAIN, 6, scheme, seed=3)
    flat = [i for idx in a.indices for i in idx]
    assert sorted(flat) == list(range(len(TRAIN)))
    assert a.indices == partition(TRAIN, 6, scheme, seed=3).indices
    assert a.indices != partition(TRAIN, 6, scheme, seed=4).indices
    assert torch.equal(a.label_counts().sum(0), torch.bincount(LABELS, minlength=10))


def test_dirichlet_with_large_alpha_is_near_iid() -> None:
    counts = partition(TRAIN, 4, "dirichlet", alpha=1e3).label_counts().double()
    global_share = torch.bincount(LABELS, minlength=10).double() / len(LABELS)
    node_share = counts / counts.sum(1, keepdim=True)
    assert (node_share - global_share).abs().max() < 0.03
    assert max(_top2_share(counts)) < 0.25  # IID digits: two labels are about 20% of a node


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dirichlet_with_tiny_alpha_gives_each_node_one_or_two_dominant_labels(seed: int) -> None:
    split = partition(TRAIN, 10, "dirichlet", alpha=0.01, min_size=16, seed=seed)
    shares = _top2_share(split.label_counts())
    assert min(shares) > 0.9, shares
    assert min(split.sizes()) >= 16


def test_shards_give_each_node_about_its_shards_of_classes() -> None:
    split = partition(TRAIN, 10, "shards", shards_per_node=2)
    held = (split.label_counts() > 0).sum(1)
    assert held.max() <= 4 and held.float().mean() <= 3  # 2 shards: 2 labels, 3-4 where a label ends inside
    assert max(split.sizes()) - min(split.sizes()) <= 2


def test_quantity_skew_varies_sizes_and_keeps_labels_iid() -> None:
    split = partition(TRAIN, 4, "quantity", alpha=1.0, min_size=32)
    sizes = split.sizes()
    assert max(sizes) > 2 * min(sizes) and min(sizes) >= 32
    big = split.label_counts()[sizes.index(max(sizes))].double()
    assert (big / big.sum() - torch.bincount(LABELS, minlength=10).double() / len(LABELS)).abs().max() < 0.05


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"scheme": "noniid"}, "scheme must be one of"),
        ({"scheme": "dirichlet", "alpha": 0}, r"alpha \(the Dirichlet concentration\) must be > 0"),
        ({"scheme": "shards", "shards_per_node": 0}, "shards_per_node must be a positive int"),
        ({"scheme": "quantity", "alpha": 0.001, "min_size": 100}, "fewer than min_size=100 examples in 1000 draws"),
        ({"scheme": "iid", "min_size": 10_000}, r"min_size must be an int in \[0, len\(dataset\) / num_nodes"),
    ],
)
def test_bad_partitions_name_the_argument(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        partition(TRAIN, 10, **kwargs)


@pytest.mark.procs
@pytest.mark.timeout(120)
def test_a_partition_is_a_dataset_factory_for_fit_and_its_histogram_is_logged(caplog) -> None:
    split = partition(TRAIN, 2, "dirichlet", alpha=0.1, min_size=32)
    with caplog.at_level("INFO", logger="exogym"):
        Trainer(MLPClassifier(), split, VAL).fit(
            FedAvgStrategy(H=2), num_nodes=2, max_steps=4, batch_size=16, logger=False, progress=False, val_size=64
        )
    assert "partition dirichlet(alpha=0.1, seed=0): 2 nodes" in caplog.text
    assert f"node 1: {split.sizes()[1]} examples labels" in caplog.text
    with pytest.raises(ValueError, match="made for num_nodes=2, but the run has 3 nodes"):
        Trainer(MLPClassifier(), split, VAL).fit(FedAvgStrategy(H=2), num_nodes=3, max_steps=4, batch_size=16)


def test_a_node_with_fewer_examples_than_a_batch_is_refused_before_start_naming_the_fix() -> None:
    split = partition(TRAIN, 10, "dirichlet", alpha=0.1, seed=42)
    small = min(range(10), key=split.sizes().__getitem__)
    batch = split.sizes()[small] + 1
    with pytest.raises(ValueError, match=rf"node {small} of the partition holds {batch - 1} examples, fewer than "
                       rf"batch_size={batch}.*min_size={batch}"):  # fmt: skip
        Trainer(MLPClassifier(), split, VAL).fit(FedAvgStrategy(H=2), num_nodes=10, max_steps=4, batch_size=batch)
