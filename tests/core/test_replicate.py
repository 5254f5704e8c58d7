"""ModelReplicator: every node's copy of the model is what copy.deepcopy would make."""

from __future__ import annotations

import copy
import pickle
import threading

import torch
from torch import nn

from exogym.runtime.node import NodeJob
from exogym.runtime.replicate import ModelReplicator, _differs
from exogym.tasks import MLPClassifier


class ConvBN(nn.Module):
    """Parameters and buffers (BatchNorm's running statistics and its integer counter)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.head = nn.Linear(4, 2)


class Tied(nn.Module):
    """The decoder reuses the encoder's weight (one parameter, two modules)."""

    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Linear(4, 4, bias=False)
        self.dec = nn.Linear(4, 4, bias=False)
        self.dec.weight = self.enc.weight


class SharedBuffers(nn.Module):
    """Two buffers over one storage (``window`` is a view of ``table``)."""

    def __init__(self) -> None:
        super().__init__()
        table = torch.arange(6.0)
        self.register_buffer("table", table)
        self.register_buffer("window", table[2:4])


class Handle:
    """Something deepcopy shares (``__deepcopy__`` returns it) but pickle refuses."""

    def __deepcopy__(self, memo: dict) -> Handle:
        return self

    def __reduce_ex__(self, protocol: int) -> tuple:
        raise TypeError("a Handle cannot be pickled")


class WithHandle(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.handle = Handle()


def _storages(m: nn.Module) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in m.state_dict(keep_vars=True).values() if t.numel()}


def _assert_same_as_deepcopy(replica: nn.Module, model: nn.Module) -> None:
    reference = copy.deepcopy(model)
    assert type(replica) is type(reference)
    assert [n for n, _ in replica.named_parameters()] == [n for n, _ in reference.named_parameters()]
    assert [p.requires_grad for p in replica.parameters()] == [p.requires_grad for p in reference.parameters()]
    got, want = replica.state_dict(), reference.state_dict()
    assert list(got) == list(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]), k


def test_replicas_equal_a_deepcopy_and_share_no_memory_with_the_model():
    frozen = ConvBN()
    frozen.head.weight.requires_grad_(False)  # a frozen parameter stays frozen
    for model in (MLPClassifier(), frozen):
        rep = ModelReplicator(model)
        assert rep.fast, type(model).__name__
        first, second = rep.replica(), rep.replica()
        for replica in (first, second):
            _assert_same_as_deepcopy(replica, model)
            assert not _storages(replica) & _storages(model)
        assert not _storages(first) & _storages(second)
        assert {id(m) for m in first.modules()}.isdisjoint(id(m) for m in model.modules())


def test_a_change_to_one_replica_leaves_the_model_and_the_other_replicas_unchanged():
    model = ConvBN()
    before = copy.deepcopy(model.state_dict())
    rep = ModelReplicator(model)
    a, b = rep.replica(), rep.replica()
    with torch.no_grad():
        a.conv.weight.add_(1.0)
    a.bn(torch.randn(2, 4, 3, 3))  # training mode: updates a's running statistics
    assert not torch.equal(a.bn.running_mean, b.bn.running_mean)
    for k, v in before.items():
        assert torch.equal(model.state_dict()[k], v), k
        assert torch.equal(b.state_dict()[k], v), k


def test_tied_parameters_stay_one_parameter_in_each_replica():
    replica = ModelReplicator(Tied()).replica()
    assert replica.dec.weight is replica.enc.weight
    assert len(list(replica.parameters())) == len(list(copy.deepcopy(Tied()).parameters())) == 1


def test_buffers_over_one_storage_still_share_it_as_in_a_deepcopy():
    model = SharedBuffers()
    replica, reference = ModelReplicator(model).replica(), copy.deepcopy(model)

    def shared(m: nn.Module) -> bool:
        return m.window.untyped_storage().data_ptr() == m.table.untyped_storage().data_ptr()

    assert shared(reference) and shared(replica)
    replica.table[2] = 100.0
    assert replica.window[0] == 100.0 and model.window[0] == 2.0


def test_a_model_that_pickle_refuses_is_deep_copied_instead():
    model = WithHandle()
    rep = ModelReplicator(model)
    assert not rep.fast
    replica = rep.replica()
    _assert_same_as_deepcopy(replica, model)
    assert replica.handle is model.handle  # what deepcopy does with it
    assert replica.lin.weight.data_ptr() != model.lin.weight.data_ptr()


def test_the_check_names_what_a_replica_got_wrong():
    model = MLPClassifier()
    assert _differs(copy.deepcopy(model), model) is None
    other = copy.deepcopy(model)
    with torch.no_grad():
        other.net[0].bias.add_(1.0)
    assert "net.0.bias" in _differs(other, model)
    assert "shares memory" in _differs(model, model)
    assert "class" in _differs(ConvBN(), model)


def test_replicas_made_from_several_threads_are_all_distinct():
    model = MLPClassifier()
    rep = ModelReplicator(model)
    out: list[nn.Module] = []
    lock = threading.Lock()

    def make() -> None:
        for _ in range(5):
            r = rep.replica()
            with lock:
                out.append(r)

    threads = [threading.Thread(target=make) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(r) for r in out}) == 20
    ptrs = [r.net[0].weight.data_ptr() for r in out]
    assert len(set(ptrs)) == 20


def test_a_job_pickles_without_its_snapshot():
    job = NodeJob(MLPClassifier(), None, None, None, None, "run")  # type: ignore[arg-type]
    first = job.model_copy()
    assert job._replicator is not None and job._replicator.fast
    clone = pickle.loads(pickle.dumps(job))
    assert clone._replicator is None
    _assert_same_as_deepcopy(clone.model_copy(), job.model)
    assert first.net[0].weight.data_ptr() != job.model.net[0].weight.data_ptr()


class _CopiesItself:
    """An object that copies itself its own way (``copy.deepcopy`` keeps the same object)."""

    def __deepcopy__(self, memo: dict) -> _CopiesItself:
        return self


def test_strategy_copies_equal_a_deepcopy_and_share_no_state_with_the_job_or_each_other():
    from exogym.runtime.replicate import strategy_replicator
    from exogym.strategy import DiLoCoStrategy, FedAvgStrategy

    for strategy in (DiLoCoStrategy(H=5, outer_lr=0.5), FedAvgStrategy(H=3, island_size=2)):
        rep = strategy_replicator(strategy)
        assert rep.fast
        a, b = rep.replica(), rep.replica()
        ref = copy.deepcopy(strategy)
        for s in (a, b):
            assert type(s) is type(ref) and list(vars(s)) == list(vars(ref))
            assert s.config() == ref.config()
            assert s.pipeline is not strategy.pipeline
        assert a.pipeline is not b.pipeline
        assert [type(m) for m in a.pipeline.modules] == [type(m) for m in ref.pipeline.modules]
        assert all(x is not y for x, y in zip(a.pipeline.modules, b.pipeline.modules, strict=True))


def test_a_strategy_holding_an_object_that_copies_itself_is_deep_copied_for_every_node():
    from exogym.runtime.replicate import strategy_replicator
    from exogym.strategy import DiLoCoStrategy

    strategy = DiLoCoStrategy(H=5)
    strategy.marker = _CopiesItself()  # type: ignore[attr-defined]
    rep = strategy_replicator(strategy)
    assert not rep.fast
    assert rep.replica().marker is strategy.marker  # what deepcopy does with it
