"""Properties over random inputs (hypothesis; the profile in tests/conftest.py makes the examples
fixed and the run fast): the ledger's bytes against the bandwidth-optimal algorithms' counts,
grouped collectives on the thread world against plain sums and concatenations, island and client
draws, partitions of data, bandwidth and latency strings, checkpoint files, and wrong arguments
to ``fit`` and the presets."""

from __future__ import annotations

import inspect
import os
import tempfile
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import exogym.strategy as S
from communicators.islands import draw_islands, draw_participants
from exogym import Trainer
from exogym.core.comm.ledger import KINDS, Ledger, wire_bytes
from exogym.core.comm.links import BANDWIDTH_RANGE, LATENCY_RANGE, Link, parse_bandwidth, parse_latency
from exogym.partition import SCHEMES, partition
from exogym.runtime import checkpoint as ckpt
from tests.fake_world import run_ranks
from tests.helpers import TinyNet, child_pids, regression_data

# ---------------------------------------------------------------- the ledger's bytes


def _ring_counts(kind: str, n: int, b: int, is_root: bool) -> tuple[float, float]:
    """Bytes one node sends and receives, counted step by step as the algorithms run: a ring
    all-reduce is a reduce-scatter then an all-gather, each ``n - 1`` steps moving one chunk of
    ``b / n`` bytes per node; a ring all-gather passes each node's whole block ``n - 1`` times;
    a broadcast sends the root's payload once to each receiver's account."""
    if n == 1 or kind == "barrier":
        return 0.0, 0.0
    chunk = b / n
    if kind == "reduce_scatter":
        steps = [chunk] * (n - 1)
    elif kind == "all_reduce":
        steps = [chunk] * (n - 1) + [chunk] * (n - 1)
    elif kind == "all_gather":
        steps = [float(b)] * (n - 1)
    else:
        return (float(b), 0.0) if is_root else (0.0, float(b))
    return float(sum(steps)), float(sum(steps))


@given(kind=st.sampled_from(KINDS), n=st.integers(1, 300), b=st.integers(0, 2**40), is_root=st.booleans())
def test_wire_bytes_equal_the_algorithms_step_by_step_counts(kind: str, n: int, b: int, is_root: bool) -> None:
    assert wire_bytes(kind, n, b, is_root) == pytest.approx(_ring_counts(kind, n, b, is_root), rel=1e-12)


@given(kind=st.sampled_from([k for k in KINDS if k != "broadcast"]), n=st.integers(1, 64), b=st.integers(0, 2**30))
def test_what_a_group_sends_it_receives(kind: str, n: int, b: int) -> None:
    # A broadcast is charged to the root alone (the module table), so its receivers take in more
    # than the group is charged for sending.
    flows = [wire_bytes(kind, n, b) for _ in range(n)]
    assert sum(s for s, _ in flows) == pytest.approx(sum(r for _, r in flows), rel=1e-12)


@given(
    st.lists(
        st.tuples(st.sampled_from(KINDS), st.integers(1, 32), st.integers(0, 2**24), st.booleans(), st.integers(1, 4)),
        max_size=20,
    )
)
def test_ledger_totals_are_the_sums_of_its_records(charges: list[tuple[str, int, int, bool, int]]) -> None:
    ledger = Ledger()
    for kind, n, b, root, count in charges:
        ledger.record(kind, n, b, is_root=root, count=count)
    records = ledger.end_step()
    assert len(records) == ledger.total_collectives == sum(c[4] for c in charges)
    assert ledger.total_sent == pytest.approx(sum(r.sent for r in records), rel=1e-12)
    assert ledger.total_received == pytest.approx(sum(r.received for r in records), rel=1e-12)
    assert ledger.total_payload == sum(b * count for _, _, b, _, count in charges)
    assert ledger.end_step() == []


# ---------------------------------------------------------------- collectives on the thread world


@st.composite
def _grouped_payloads(draw: Any) -> tuple[list[list[int]], dict[int, torch.Tensor], torch.dtype]:
    """A partition of 2-5 ranks into groups, and per rank a payload whose shape its group shares."""
    k = draw(st.integers(2, 5))
    labels = draw(st.lists(st.integers(0, k - 1), min_size=k, max_size=k))
    groups = [sorted(r for r in range(k) if labels[r] == g) for g in sorted(set(labels))]
    dtype = draw(st.sampled_from([torch.float32, torch.float64, torch.int64]))
    seed = draw(st.integers(0, 2**31 - 1))
    payloads = {}
    for g, members in enumerate(groups):
        shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
        for r in members:
            gen = torch.Generator().manual_seed(seed + 7919 * r + g)
            x = (
                torch.randint(-1000, 1000, shape, generator=gen)
                if dtype == torch.int64
                else torch.randn(shape, generator=gen)
            )
            payloads[r] = x.to(dtype)
    return groups, payloads, dtype


@given(_grouped_payloads())
def test_grouped_all_reduce_is_the_members_sum_all_gather_their_stack_and_the_ledger_the_formula(case) -> None:
    groups, payloads, dtype = case
    k = len(payloads)

    def body(rank: int, comm: Any) -> tuple[torch.Tensor, torch.Tensor, list]:
        reduced = comm.all_reduce(payloads[rank].clone(), op="sum", groups=groups)
        gathered = comm.all_gather(payloads[rank].clone(), groups=groups)
        return reduced, gathered, comm.ledger.end_step()

    out = run_ranks(k, body)
    for members in groups:
        rows = torch.stack([payloads[m] for m in members])
        nbytes = payloads[members[0]].numel() * payloads[members[0]].element_size()
        for r in members:
            reduced, gathered, records = out[r]
            torch.testing.assert_close(reduced, rows.sum(0), rtol=1e-5 if dtype == torch.float32 else 1e-12, atol=1e-5)
            assert torch.equal(gathered, rows)
            n = len(members)
            assert [(x.kind, x.group_size, x.payload) for x in records] == [
                ("all_reduce", n, nbytes),
                ("all_gather", n, nbytes),
            ]
            assert records[0].sent == pytest.approx(2 * (n - 1) / n * nbytes)
            assert records[1].sent == pytest.approx((n - 1) * nbytes)


# ---------------------------------------------------------------- islands, sampled clients, partitions


@given(
    num_nodes=st.integers(1, 200), size=st.integers(1, 220), seed=st.integers(0, 2**31), round_=st.integers(0, 10**6)
)
def test_every_island_partition_covers_each_rank_once(num_nodes: int, size: int, seed: int, round_: int) -> None:
    islands = draw_islands(num_nodes, size, seed, round_)
    assert sorted(r for island in islands for r in island) == list(range(num_nodes))
    assert all(island == sorted(island) and 1 <= len(island) <= size for island in islands)
    assert all(len(island) == min(size, num_nodes) for island in islands[:-1])  # only the last may be short
    assert islands == draw_islands(num_nodes, size, seed, round_)  # every rank draws the same


@given(
    members=st.lists(st.integers(0, 5000), min_size=1, max_size=300, unique=True),
    fraction=st.floats(0.001, 1.0),
    seed=st.integers(0, 2**31),
    round_=st.integers(0, 10**6),
)
def test_sampled_clients_are_a_sorted_subset_of_the_stated_size(
    members: list[int], fraction: float, seed: int, round_: int
) -> None:
    members = sorted(members)
    picked = draw_participants(members, fraction, seed, round_)
    assert len(picked) == min(len(members), max(1, round(fraction * len(members))))
    assert picked == sorted(set(picked)) and set(picked) <= set(members)
    assert picked == draw_participants(members, fraction, seed, round_)


@given(
    scheme=st.sampled_from(SCHEMES),
    num_nodes=st.integers(1, 12),
    per_node=st.integers(2, 30),
    classes=st.integers(1, 10),
    alpha=st.floats(0.05, 100.0),
    seed=st.integers(0, 2**31),
)
def test_every_partition_gives_each_example_to_exactly_one_node(
    scheme: str, num_nodes: int, per_node: int, classes: int, alpha: float, seed: int
) -> None:
    n = num_nodes * per_node
    labels = torch.randint(0, classes, (n,), generator=torch.Generator().manual_seed(seed))
    data = torch.utils.data.TensorDataset(torch.zeros(n, 1), labels)
    split = partition(data, num_nodes, scheme, alpha=alpha, seed=seed)
    assert len(split.indices) == num_nodes
    assert sorted(int(i) for idx in split.indices for i in idx) == list(range(n))
    assert all(len(idx) >= 1 for idx in split.indices)


# ---------------------------------------------------------------- bandwidth and latency strings

_NUMBERS = st.floats(1e-3, 1e6, allow_nan=False, allow_infinity=False)
_BANDWIDTH = {"bit/s": 1.0, "kbit/s": 1e3, "Mbit/s": 1e6, "Gbit/s": 1e9, "Tbit/s": 1e12, "Mbps": 1e6, "GB/s": 8e9}
_LATENCY = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


@given(x=_NUMBERS, unit=st.sampled_from(sorted(_BANDWIDTH)), space=st.sampled_from(["", " "]))
def test_a_bandwidth_with_a_unit_is_its_number_times_the_units_bits(x: float, unit: str, space: str) -> None:
    bits = x * _BANDWIDTH[unit]
    if BANDWIDTH_RANGE[0] <= bits <= BANDWIDTH_RANGE[1]:
        assert parse_bandwidth(f"{x!r}{space}{unit}") == pytest.approx(bits, rel=1e-12)
    else:  # no network has it
        with pytest.raises(ValueError, match=r"must be in \[1, 1e\+15\] bits/s"):
            parse_bandwidth(f"{x!r}{space}{unit}")


@given(x=_NUMBERS, unit=st.sampled_from(sorted(_LATENCY)))
def test_a_latency_with_a_unit_is_its_number_times_the_units_seconds(x: float, unit: str) -> None:
    seconds = x * _LATENCY[unit]
    if seconds <= LATENCY_RANGE[1]:
        assert parse_latency(f"{x!r}{unit}") == pytest.approx(seconds, rel=1e-12)
    else:
        with pytest.raises(ValueError, match=r"must be in \[0, 10000\] s"):
            parse_latency(f"{x!r}{unit}")


@given(bandwidth=st.floats(1.0, 1e12), latency=st.floats(0.0, 10.0))
def test_a_link_rebuilt_from_its_attributes_or_their_strings_is_equal(bandwidth: float, latency: float) -> None:
    link = Link(bandwidth, latency)
    assert Link(link.bandwidth, link.latency) == link
    assert Link(f"{link.bandwidth!r}bit/s", f"{link.latency!r}s") == link


@given(text=st.text(alphabet="0123456789.eE+- kMGTBbitps/µ", max_size=12))
def test_a_bandwidth_string_parses_or_raises_value_error_naming_the_argument(text: str) -> None:
    try:
        bits = parse_bandwidth(text, "Link bandwidth")
    except ValueError as e:
        assert "Link bandwidth" in str(e)
    else:
        assert bits > 0


# ---------------------------------------------------------------- checkpoint files

_DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.int8, torch.bool]


@st.composite
def _tensors(draw: Any) -> torch.Tensor:
    shape = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    return (torch.randn(shape, generator=gen) * 100).to(draw(st.sampled_from(_DTYPES)))


_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**62), 2**62),
    st.floats(allow_nan=False),
    st.text(max_size=8),
    _tensors(),
)
_STATES = st.dictionaries(
    st.text(max_size=8),
    st.recursive(
        _LEAVES,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4),
            st.tuples(inner, inner),
            st.dictionaries(st.one_of(st.text(max_size=6), st.integers(0, 99)), inner, max_size=4),
        ),
        max_leaves=12,
    ),
    max_size=6,
)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


@given(state=_STATES)
def test_a_state_dict_saved_and_loaded_safely_is_equal(state: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "node-00000.pt")
        ckpt.save_atomic(state, path)
        assert os.listdir(d) == ["node-00000.pt"]  # no temporary file left
        assert _same(ckpt.load_safe(path), state)


@given(state=_STATES, where=st.floats(0.0, 1.0, exclude_max=True), flip=st.integers(1, 255))
def test_any_changed_byte_of_a_node_file_is_refused_naming_it(state: dict[str, Any], where: float, flip: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = ckpt.node_file(d, 0)
        ckpt.save_atomic(state, path)
        meta = {"step": 1, ckpt.FILES: {"node-00000.pt": ckpt.sha256(path)}}
        ckpt.verify(d, meta, 1)  # intact: accepted
        data = bytearray(open(path, "rb").read())
        data[int(where * len(data))] ^= flip
        with open(path, "wb") as f:
            f.write(data)
        with pytest.raises(ValueError, match=r"node-00000\.pt does not match the SHA-256"):
            ckpt.verify(d, meta, 1)


# ---------------------------------------------------------------- wrong arguments

_PRESETS = sorted(
    n for n in S.__all__ if n.endswith("Strategy") and n not in ("Strategy", "CommunicateOptimizeStrategy")
)
_NOT_AN_INT = st.one_of(st.floats(allow_nan=True), st.text(max_size=3), st.booleans())
_BAD_FIT = {
    **{
        name: st.one_of(st.integers(max_value=0), _NOT_AN_INT)
        for name in ("num_nodes", "max_steps", "batch_size", "log_interval", "workers", "checkpoint_interval")
    },
    "val_size": st.one_of(st.integers(max_value=-1), st.text(max_size=3)),
    "seed": st.one_of(st.floats(allow_nan=True), st.text(max_size=3), st.booleans()),
}


@st.composite
def _bad_fit_argument(draw: Any) -> tuple[str, Any]:
    name = draw(st.sampled_from(sorted(_BAD_FIT)))
    return name, draw(_BAD_FIT[name])


@pytest.mark.timeout(120)
@given(_bad_fit_argument())
def test_a_wrong_fit_argument_raises_naming_it_before_any_process_starts(bad: tuple[str, Any]) -> None:
    name, value = bad
    args = {"num_nodes": 2, "max_steps": 2, "batch_size": 8, "logger": False, "progress": False, name: value}
    with pytest.raises((TypeError, ValueError), match=name):
        Trainer(TinyNet(), regression_data(64)).fit(S.SimpleReduceStrategy(), **args)
    assert child_pids() == []


@given(preset=st.sampled_from(_PRESETS), keyword=st.from_regex(r"[a-z_][a-z0-9_]{0,12}", fullmatch=True))
def test_a_preset_given_a_keyword_it_does_not_take_raises_type_error_naming_it(preset: str, keyword: str) -> None:
    cls = getattr(S, preset)
    if keyword in inspect.signature(cls).parameters:
        return
    with pytest.raises(TypeError, match=f"unexpected keyword argument '{keyword}'"):
        cls(**{keyword: 1})


def _numeric_parameters() -> list[tuple[str, str]]:
    out = []
    for preset in _PRESETS:
        for p in inspect.signature(getattr(S, preset)).parameters.values():
            if isinstance(p.default, (int, float)) and not isinstance(p.default, bool):
                out.append((preset, p.name))
    return out


@given(
    where=st.sampled_from(_numeric_parameters()),
    value=st.one_of(st.integers(max_value=-1), st.sampled_from([float("nan"), float("-inf")]), st.text(max_size=3)),
)
def test_a_preset_refuses_a_negative_nan_or_text_number_setting(where: tuple[str, str], value: Any) -> None:
    preset, name = where
    with pytest.raises((TypeError, ValueError), match=name):
        getattr(S, preset)(**{name: value})
