"""Per-node data: sharding a dataset (or calling a dataset factory), batches, minibatches.

Non-IID splits live in [`exogym.partition`][exogym.partition]
([`partition`][exogym.partition.partition], re-exported here with
[`Partition`][exogym.partition.Partition] and [`labels_of`][exogym.partition.labels_of])."""

from __future__ import annotations

import inspect
import numbers
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import (
    DataLoader,
    Dataset,
    DistributedSampler,
    RandomSampler,
    SequentialSampler,
    Subset,
    default_collate,
)

from exogym.partition import Partition as Partition  # re-exported: exogym.data.partition
from exogym.partition import labels_of as labels_of
from exogym.partition import partition as partition

#: ``dataset_factory(rank, num_nodes, train_dataset) -> Dataset``, called inside each node.
DatasetFactory = Callable[[int, int, bool], Dataset]
DatasetArg = Dataset | DatasetFactory | None


def is_factory(ds: DatasetArg) -> bool:
    """True for a dataset factory (a callable that is not itself a Dataset)."""
    return callable(ds) and not isinstance(ds, Dataset)


def check_dataset(ds: DatasetArg, name: str, num_nodes: int) -> None:
    """Validate a dataset argument in the parent, before any process starts."""
    if ds is None:
        return
    if is_factory(ds):
        try:
            params = inspect.signature(ds).parameters
        except (TypeError, ValueError):
            return
        positional = [p for p in params.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if len(positional) < 3 and not any(p.kind is p.VAR_POSITIONAL for p in params.values()):
            raise TypeError(
                f"{name} factory must accept (rank, num_nodes, train_dataset); got signature {inspect.signature(ds)}"
            )
        return
    if not hasattr(ds, "__getitem__") or not hasattr(ds, "__len__"):
        raise TypeError(
            f"{name} must be a map-style Dataset (with __len__ and __getitem__) or a dataset factory, "
            f"got {type(ds).__name__}"
        )
    if len(ds) < num_nodes:
        raise ValueError(f"{name} has {len(ds)} examples, fewer than num_nodes={num_nodes}: every node needs data")


class LabelShards(Partition):
    """``partition(dataset, num_nodes, "shards", shards_per_node=..., seed=...)`` as a class:
    McMahan et al.'s label-sorted shards (see [`exogym.partition`][exogym.partition]).

    Args:
        dataset: a labelled map-style dataset (see [`labels_of`][exogym.partition.labels_of]).
        num_nodes: the run's node count (``fit(num_nodes=...)`` must match).
        shards_per_node: shards (about the number of classes) per node.
        seed: fixes the order of equal labels and the dealing of shards.
    """

    def __init__(self, dataset: Dataset, num_nodes: int, shards_per_node: int = 2, seed: int = 0) -> None:
        split = partition(dataset, num_nodes, "shards", shards_per_node=shards_per_node, seed=seed)
        super().__init__(split.dataset, split.indices, split.scheme, split.params)


#: DataLoader arguments ExoGym sets itself (``fit(dataloader_kwargs=...)`` may not give them).
LOADER_OWN = ("batch_size", "shuffle", "sampler", "batch_sampler", "drop_last", "generator", "dataset")


def check_loader_kwargs(kwargs: Any) -> dict[str, Any]:
    """``fit(dataloader_kwargs=...)`` as a dict, or ``ValueError``/``TypeError`` naming the key."""
    if kwargs is None:
        return {}
    if not isinstance(kwargs, Mapping):
        raise TypeError(f"dataloader_kwargs must be a dict of DataLoader arguments, got {type(kwargs).__name__}")
    own = sorted(set(kwargs) & set(LOADER_OWN))
    if own:
        raise ValueError(
            f"dataloader_kwargs may not set {own}: ExoGym sets them (batch_size and shuffle are fit arguments)"
        )
    valid = set(inspect.signature(DataLoader.__init__).parameters) - {"self"}
    unknown = sorted(set(kwargs) - valid)
    if unknown:
        raise TypeError(f"dataloader_kwargs has {unknown}, which torch.utils.data.DataLoader does not take")
    return dict(kwargs)


def node_dataset(ds: DatasetArg, rank: int, num_nodes: int, train: bool) -> Dataset | None:
    """This node's dataset: the factory's output, or the shared dataset itself (sharded later)."""
    if ds is None:
        return None
    return ds(rank, num_nodes, train) if is_factory(ds) else ds


def collate(examples: Sequence[Any]) -> Any:
    """The batch of ``examples``: ``torch.utils.data.default_collate``, except that examples that
    are mappings collate key by key, and a key whose values are lists of numbers (token ids, as a
    Hugging Face dataset gives them) becomes one tensor ``[batch, ...]``, as Hugging Face's own
    default collator makes it (``default_collate`` would transpose it into a list of ``[batch]``
    tensors, one per position).

    ``{"input_ids": [5, 3, 9], "labels": [5, 3, 9]}`` per example gives ``{"input_ids": int64
    [B, 3], "labels": int64 [B, 3]}``; tensors, numbers and strings collate as
    ``default_collate`` does. Raises ``ValueError`` naming the key when its lists differ in length.
    """
    if examples and isinstance(examples[0], Mapping):
        first = examples[0]
        return _rebuild(first, {k: _collate_field(k, [e[k] for e in examples]) for k in first})
    return default_collate(examples)


def _collate_field(key: Any, values: list[Any]) -> Any:
    """One key of mapping examples collated: nested mappings key by key, lists of numbers as one
    tensor, the rest by ``default_collate``."""
    if isinstance(values[0], Mapping):
        return collate(values)
    if isinstance(values[0], (list, tuple)) and _holds_numbers(values[0]):
        try:
            return torch.tensor(values)
        except (ValueError, TypeError) as e:
            lengths = sorted({len(v) for v in values if isinstance(v, (list, tuple))})
            raise ValueError(
                f"the examples' {key!r} lists cannot make one tensor (lengths {lengths}): {e}. Pad or truncate them "
                "to one length in the dataset, or pass a collate_fn that pads them, e.g. "
                "fit(..., dataloader_kwargs={'collate_fn': transformers.DataCollatorWithPadding(tokenizer)})"
            ) from e
    return default_collate(values)


def _holds_numbers(items: list[Any] | tuple[Any, ...]) -> bool:
    """Whether a (nested) list's first leaf is a number (an empty list counts as numbers)."""
    while isinstance(items, (list, tuple)):
        if not items:
            return True
        items = items[0]
    return isinstance(items, numbers.Number)


def collate_fn(loader_kwargs: Mapping[str, Any] | None) -> Callable[[Sequence[Any]], Any]:
    """The function that makes batches: ``loader_kwargs['collate_fn']`` where the user gives one
    (``fit(dataloader_kwargs=...)``), else ``collate``."""
    return (loader_kwargs or {}).get("collate_fn") or collate


def train_loader(
    ds: Dataset,
    shared: bool,
    rank: int,
    num_nodes: int,
    batch_size: int,
    shuffle: bool,
    seed: int,
    loader_kwargs: Mapping[str, Any] | None = None,
) -> tuple[DataLoader, Any]:
    """Loader of full per-node batches (``drop_last``) and its sampler.

    A ``shared`` dataset is split across nodes by ``DistributedSampler`` (same ``seed`` on every
    rank, so shards are disjoint); a factory's dataset is already this node's shard.
    """
    sampler: Any
    if shared:
        sampler = DistributedSampler(ds, num_replicas=num_nodes, rank=rank, shuffle=shuffle, seed=seed)
    elif shuffle:
        sampler = RandomSampler(ds, generator=torch.Generator().manual_seed(seed * 1000003 + rank))
    else:
        sampler = SequentialSampler(ds)
    # The loader's own generator: iterating it must not draw from the node's global stream.
    loader = DataLoader(
        ds,
        batch_size=batch_size,
        sampler=sampler,
        drop_last=True,
        generator=torch.Generator(),
        **{**(loader_kwargs or {}), "collate_fn": collate_fn(loader_kwargs)},
    )
    return loader, sampler


def steps_per_epoch(ds_len: int, shared: bool, num_nodes: int, batch_size: int) -> int:
    """Full batches per epoch on one node (DistributedSampler pads to ``ceil(len / K)``)."""
    per_node = -(-ds_len // num_nodes) if shared else ds_len
    return per_node // batch_size


class BatchStream:
    """The batches of ``loader`` epoch after epoch (reshuffled each epoch), with a position that
    checkpoints save and restore (``state_dict``): the epoch, the batches taken in it and the
    sampler's generator at the epoch's start. Restoring skips the taken batches by index,
    without loading them. Iterating draws nothing from torch's global random stream (the
    loaders have a generator of their own), so a resumed node's dropout stream is unchanged."""

    def __init__(self, loader: DataLoader, sampler: Any, loader_kwargs: Mapping[str, Any] | None = None) -> None:
        self.loader, self.sampler, self.loader_kwargs = loader, sampler, dict(loader_kwargs or {})
        self.epoch = self.offset = 0
        self._it: Iterator[Any] | None = None
        self._epoch_generator: torch.Tensor | None = None

    def __iter__(self) -> BatchStream:
        return self

    def __next__(self) -> Any:
        while True:
            if self._it is None:
                self._it = self._start_epoch()
            try:
                batch = next(self._it)
            except StopIteration:
                self.epoch, self.offset, self._it = self.epoch + 1, 0, None
                continue
            self.offset += 1
            return batch

    def _start_epoch(self) -> Iterator[Any]:
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(self.epoch)
        gen = getattr(self.sampler, "generator", None)
        self._epoch_generator = gen.get_state() if gen is not None else None
        if self.offset == 0:
            return iter(self.loader)
        bs = self.loader.batch_size
        rest = list(iter(self.sampler))[self.offset * bs :]
        loader = DataLoader(
            self.loader.dataset,
            batch_size=bs,
            sampler=rest,
            drop_last=True,
            generator=torch.Generator(),
            **{"collate_fn": self.loader.collate_fn, **self.loader_kwargs},
        )
        return iter(loader)

    def state_dict(self) -> dict[str, Any]:
        """The position: epoch, batches taken in it, the sampler generator at its start."""
        return {"epoch": self.epoch, "offset": self.offset, "generator": self._epoch_generator}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved position (the next batch is the one after it)."""
        self.epoch, self.offset, self._it = state["epoch"], state["offset"], None
        gen = getattr(self.sampler, "generator", None)
        if gen is not None and state["generator"] is not None:
            gen.set_state(state["generator"])


def val_subset(ds: Dataset, shared: bool, rank: int, num_nodes: int, val_size: int) -> Dataset:
    """This node's share of the validation examples: of the first ``val_size`` examples of a
    shared dataset, every ``num_nodes``-th from ``rank``; of a factory's dataset, its first
    ``ceil(val_size / num_nodes)``."""
    if shared:
        return Subset(ds, list(range(rank, min(val_size, len(ds)), num_nodes)))
    return Subset(ds, list(range(min(-(-val_size // num_nodes), len(ds)))))


def split_batch(batch: Any, parts: int) -> list[Any]:
    """Split a collated batch into ``parts`` equal minibatches along the first dimension.

    Tensors, and lists/tuples/namedtuples/dicts of them (nested), are split; a list of plain
    items (e.g. strings) is sliced; other leaves are repeated in every minibatch.
    """
    if parts == 1:
        return [batch]
    if isinstance(batch, torch.Tensor):
        if batch.dim() == 0 or batch.shape[0] % parts:
            raise ValueError(f"cannot split a batch of leading size {tuple(batch.shape)[:1]} into {parts} minibatches")
        return list(batch.chunk(parts))
    if isinstance(batch, Mapping):
        split = {k: split_batch(v, parts) for k, v in batch.items()}
        return [_rebuild(batch, {k: v[i] for k, v in split.items()}) for i in range(parts)]
    if isinstance(batch, (list, tuple)):
        if batch and not any(isinstance(x, _CONTAINERS) for x in batch):
            n = len(batch) // parts
            return [_rebuild(batch, list(batch[i * n : (i + 1) * n])) for i in range(parts)]
        cols = [split_batch(x, parts) for x in batch]
        return [_rebuild(batch, [c[i] for c in cols]) for i in range(parts)]
    return [batch] * parts


_CONTAINERS = (torch.Tensor, Mapping, list, tuple)


def _rebuild(like: Any, items: Any) -> Any:
    """A container of ``like``'s type holding ``items`` (a dict for mappings, a list otherwise)."""
    if isinstance(like, Mapping):
        return items if type(like) is dict else type(like)(items)
    if isinstance(like, tuple) and hasattr(like, "_fields"):
        return type(like)(*items)
    return type(like)(items)


def to_device(batch: Any, device: torch.device) -> Any:
    """Move every tensor in a (nested) batch to ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, Mapping):
        return _rebuild(batch, {k: to_device(v, device) for k, v in batch.items()})
    if isinstance(batch, (list, tuple)):
        return _rebuild(batch, [to_device(x, device) for x in batch])
    return batch


def batch_len(batch: Any) -> int:
    """Number of examples in a collated batch (leading size of its first tensor)."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, Mapping):
        for v in batch.values():
            return batch_len(v)
    if isinstance(batch, Sequence) and not isinstance(batch, str) and batch:
        first = batch[0]
        return batch_len(first) if isinstance(first, (torch.Tensor, Mapping, list, tuple)) else len(batch)
    return 1
