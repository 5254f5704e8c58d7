"""Per-node data helpers: the label-sorted shard split and label reading."""

import pytest
import torch
from torch.utils.data import Dataset, TensorDataset

from exogym.data import LabelShards, labels_of


def _labelled(n: int = 200, classes: int = 10) -> TensorDataset:
    g = torch.Generator().manual_seed(3)
    return TensorDataset(torch.randn(n, 4, generator=g), torch.randint(0, classes, (n,), generator=g))


def test_label_shards_deal_disjoint_equal_shards_of_label_sorted_data() -> None:
    ds = _labelled()
    k, s = 10, 2
    split = LabelShards(ds, k, shards_per_node=s, seed=1)
    labels = ds.tensors[1]
    size = len(ds) // (k * s)
    seen: set[int] = set()
    for rank in range(k):
        idx = split(rank, k, True).indices
        assert len(idx) == s * size and not seen.intersection(idx)
        seen.update(idx)
    assert seen == set(range(len(ds)))  # every example dealt once (200 = 20 shards of 10)
    # Sorted by label, each shard is a run of one label, or of two where a label ends inside it:
    # a node of 2 shards holds at most 4 labels, and the whole split far fewer than IID would.
    held = [len(set(labels[split(r, k, True).indices].tolist())) for r in range(k)]
    assert max(held) <= 2 * s
    assert sum(held) / k < 0.5 * len(set(labels.tolist()))
    counts = split.label_counts()
    assert counts.shape == (k, 10) and torch.equal(counts.sum(0), torch.bincount(labels, minlength=10))


def test_label_shards_depend_only_on_the_seed() -> None:
    ds = _labelled()
    a, b, c = (LabelShards(ds, 5, 2, seed=s) for s in (7, 7, 8))
    assert a.indices == b.indices and a.indices != c.indices


def test_label_shards_refuse_a_different_node_count_and_too_little_data() -> None:
    ds = _labelled(n=30)
    with pytest.raises(ValueError, match="made for num_nodes=5, but the run has 4 nodes"):
        LabelShards(ds, 5, 2)(0, 4, True)
    with pytest.raises(ValueError, match="fewer than num_nodes \\* shards_per_node = 40"):
        LabelShards(ds, 20, 2)
    with pytest.raises(ValueError, match="shards_per_node must be a positive int"):
        LabelShards(ds, 5, 0)


def test_labels_are_read_from_tensors_targets_or_items() -> None:
    class Items(Dataset):
        def __len__(self) -> int:
            return 3

        def __getitem__(self, i):
            return torch.zeros(2), 2 - i

    class Targets(Items):
        targets = [5, 6, 7]

    assert labels_of(TensorDataset(torch.zeros(2, 1), torch.tensor([4, 1]))).tolist() == [4, 1]
    assert labels_of(Targets()).tolist() == [5, 6, 7]
    assert labels_of(Items()).tolist() == [2, 1, 0]


def test_digits_are_read_without_importing_scikit_learn_and_match_its_loader() -> None:
    import subprocess
    import sys

    code = (
        "import sys; from exogym.tasks.digits import _load_digits; x, y = _load_digits(); "
        "assert 'sklearn' not in sys.modules; print(x.shape, int(y.sum()))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    assert out == f"{x.shape} {int(y.sum())}"
