"""Streaming DiLoCo against a plain-PyTorch reference written from the paper (arXiv 2501.18512):
fragments on a staggered schedule, outer updates applied tau steps late and mixed by alpha."""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from exogym.core.comm.network import Network
from exogym.strategy import DiLoCoStrategy, OptimSpec, StreamingDiLoCoStrategy
from tests.fake_world import train_ranks
from tests.helpers import TinyNet, node_batches, regression_data

SGD = OptimSpec(torch.optim.SGD, lr=0.05)
H, STEPS = 4, 12  # three rounds of every fragment


def streaming_reference(ds, k: int, steps: int, h: int, F: int, tau: int, alpha: float) -> list[torch.Tensor]:
    """K model copies with inner SGD. The flat parameter vector is cut into F equal contiguous
    fragments; fragment f is synchronised after steps s with (s+1) % H == floor((f+1)H/F) % H:
    delta = global_f - mean_k(local_k,f); tau steps later (if the run lasts that long) the outer
    Nesterov SGD steps global_f with delta, and every local_k,f <- alpha local + (1-alpha) global."""
    base = TinyNet()
    models = [TinyNet() for _ in range(k)]
    for m in models:
        m.load_state_dict(base.state_dict())
    inner = [torch.optim.SGD(m.parameters(), lr=0.05) for m in models]
    data = [node_batches(ds, k, r) for r in range(k)]
    flat = parameters_to_vector(base.parameters()).detach()
    n = flat.numel()
    cuts = [round(i * n / F) for i in range(F + 1)]
    glob = [flat[cuts[f] : cuts[f + 1]].clone() for f in range(F)]
    outer = [torch.optim.SGD([g], lr=0.7, momentum=0.9, nesterov=True) for g in glob]
    pending: list[tuple[int, int, torch.Tensor]] = []
    for s in range(steps):
        for r in range(k):
            inner[r].zero_grad()
            models[r](next(data[r])).backward()
            inner[r].step()
        with torch.no_grad():
            for f in range(F):
                if (s + 1) % h == math.floor((f + 1) * h / F) % h:
                    lo, hi = cuts[f], cuts[f + 1]
                    mean_local = sum(parameters_to_vector(m.parameters())[lo:hi] for m in models) / k
                    pending.append((s + tau, f, glob[f] - mean_local))
            for item in [p for p in pending if p[0] == s]:
                pending.remove(item)
                _, f, delta = item
                glob[f].grad = delta
                outer[f].step()
                lo, hi = cuts[f], cuts[f + 1]
                for m in models:
                    v = parameters_to_vector(m.parameters())
                    v[lo:hi] = alpha * v[lo:hi] + (1 - alpha) * glob[f]
                    vector_to_parameters(v, m.parameters())
    return [parameters_to_vector(m.parameters()).detach() for m in models]


@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("tau", [0, 1])
def test_two_fragments_match_the_reference_after_three_rounds(k: int, tau: int, alpha: float) -> None:
    ds = regression_data(k * 8 * STEPS)
    out = train_ranks(
        k,
        lambda: StreamingDiLoCoStrategy(H=H, num_fragments=2, overlap_steps=tau, alpha=alpha, optim_spec=SGD),
        STEPS,
        dataset=ds,
    )
    ref = streaming_reference(ds, k, STEPS, H, 2, tau, alpha)
    for rank in range(k):
        torch.testing.assert_close(parameters_to_vector(out[rank]["params"]), ref[rank], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("k", [2, 4])
def test_one_fragment_without_overlap_is_diloco(k: int) -> None:
    stream = train_ranks(k, lambda: StreamingDiLoCoStrategy(H=H, num_fragments=1, optim_spec=SGD), STEPS)
    diloco = train_ranks(k, lambda: DiLoCoStrategy(H=H, optim_spec=SGD), STEPS)
    for a, b in zip(stream, diloco, strict=True):
        for p, q in zip(a["params"], b["params"], strict=True):
            torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("tau", [0, 1])
def test_with_a_robust_rule_one_fragment_is_diloco_with_that_rule_and_the_gather_does_not_block(tau: int) -> None:
    k = 4
    make = lambda: StreamingDiLoCoStrategy(  # noqa: E731
        H=H, num_fragments=1, overlap_steps=tau, optim_spec=SGD, aggregate="median"
    )
    stream = train_ranks(k, make, STEPS)
    if tau == 0:
        diloco = train_ranks(k, lambda: DiLoCoStrategy(H=H, optim_spec=SGD, aggregate="median"), STEPS)
        for a, b in zip(stream, diloco, strict=True):
            for p, q in zip(a["params"], b["params"], strict=True):
                torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
    plain = lambda: StreamingDiLoCoStrategy(H=H, num_fragments=1, overlap_steps=tau, optim_spec=SGD)  # noqa: E731
    mean = train_ranks(k, plain, STEPS)
    assert not torch.allclose(stream[0]["params"][0], mean[0]["params"][0])
    records = [r for step in stream[0]["records"] for r in step]
    assert records and {(r.kind, r.blocking, r.tag) for r in records} == {("all_gather", False, "streaming_diloco")}


def test_peak_bytes_per_step_are_one_fragment_and_the_total_is_diloco_s() -> None:
    k = 4
    stream = train_ranks(k, lambda: StreamingDiLoCoStrategy(H=H, num_fragments=2, optim_spec=SGD), STEPS)
    diloco = train_ranks(k, lambda: DiLoCoStrategy(H=H, optim_spec=SGD), STEPS)
    per_step = [[sum(r.sent for r in recs) for recs in o[0]["records"]] for o in (stream, diloco)]
    n = sum(p.numel() for p in TinyNet().parameters())  # 161: fragments of 80 and 81 entries
    ring = 2 * (k - 1) / k * 4  # bytes sent per float32 entry in a ring all-reduce
    assert max(per_step[0]) == pytest.approx(ring * math.ceil(n / 2))
    assert max(per_step[1]) == pytest.approx(ring * n)
    assert sum(per_step[0]) == pytest.approx(sum(per_step[1]))
    assert sum(1 for b in per_step[0] if b) == 2 * sum(1 for b in per_step[1] if b)  # twice as often, half each


def test_an_overlapped_fragment_is_hidden_behind_the_backward_pass_and_the_next_steps_compute() -> None:
    from exogym.core.comm.network import Network

    def sim_comm(tau: int, compute: float) -> float:
        net = Network(100e6, 0.03, compute=compute)
        make = lambda: StreamingDiLoCoStrategy(H=H, overlap_steps=tau, optim_spec=SGD)  # noqa: E731
        rows = [r for r in train_ranks(2, make, STEPS, network=net)[0]["node"].history if "train_loss" in r]
        return rows[-1]["sim_comm_time"]

    # A fragment's all-reduce between 2 nodes: 2 * 0.03 + 32 * n / 1e8 s, n = 80 or 81 floats
    # (0.0600256, 0.06002592 s), started with its step's backward pass (2/3 of the compute);
    # fragment 0 is sent after steps 1, 5, 9 and fragment 1 after steps 3, 7, 11.
    t80, t81 = 0.06 + 32 * 80 / 1e8, 0.06 + 32 * 81 / 1e8
    # tau=0, waited in its own step: compute 0.05 s, backward 0.0333 s: each waits t - 0.0333 s
    assert sim_comm(0, 0.05) == pytest.approx(3 * (t80 + t81) - 6 * 0.1 / 3, abs=1e-12)
    assert sim_comm(0, 0.5) == 0.0  # backward 0.333 s: each hidden behind its own step's backward pass
    assert sim_comm(1, 0.05) == 0.0  # 0.0333 s + the next step's 0.05 s: hidden
    # compute 0.01 s: tau=0 waits t - 0.00667 s for each of the 6; tau=1 t - 0.00667 - 0.01 s for
    # the 5 waited for (the one sent after the last step is still in flight)
    assert sim_comm(0, 0.01) == pytest.approx(3 * (t80 + t81) - 6 * 0.02 / 3, abs=1e-12)
    assert sim_comm(1, 0.01) == pytest.approx(3 * t80 + 2 * t81 - 5 * (0.02 / 3 + 0.01), abs=1e-12)


def test_quantized_fragments_are_charged_as_int8() -> None:
    k = 2
    out = train_ranks(k, lambda: StreamingDiLoCoStrategy(H=H, quantize="int8", optim_spec=SGD), STEPS)
    sent = [r for recs in out[0]["records"] for r in recs]
    assert {r.tag for r in sent} == {"streaming_diloco+int8"}
    assert sorted({r.payload for r in sent}) == [80 + 4, 81 + 4]  # one int8 per entry, one fp32 scale
    flat = [parameters_to_vector(o["params"]) for o in out]
    assert torch.isfinite(flat[0]).all()
    # fragment 1 (entries 80..160) was synchronised after the last step: every rank holds its global value
    assert torch.equal(flat[0][80:], flat[1][80:]) and not torch.equal(flat[0][:80], flat[1][:80])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_fragments": 5}, r"num_fragments must be an int in \[1, 4\] \(at most H"),
        ({"overlap_steps": 4}, r"overlap_steps must be an int in \[0, H=4\)"),
        ({"overlap_steps": "later"}, r"overlap_steps must be an int in \[0, H=4\) .* or 'auto'"),
        ({"alpha": 1.5}, r"alpha must be a number in \[0, 1\]"),
        ({"quantize": "fp2"}, "quantize must be one of"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        StreamingDiLoCoStrategy(H=H, **kwargs)


def _rows(out) -> list[dict]:
    measured = ("wall_time", "comm_time", "peak_memory")
    return [{k: v for k, v in r.items() if k not in measured} for r in out[0]["node"].history]


def _fragment_steps(bandwidth: float, latency: float, compute: float, k: int, floats: int) -> int:
    """Steps of ``compute`` seconds after its own until a fragment's ring all-reduce of ``floats``
    float32 among ``k`` nodes, started with its step's backward pass (2/3 of the compute before
    the end), has arrived: max(0, ceil((2(k-1) a + 2(k-1)/k * 32 floats / B - 2/3 compute) / compute))."""
    seconds = 2 * (k - 1) * latency + 2 * (k - 1) / k * 32 * floats / bandwidth
    return max(0, math.ceil((seconds - 2 / 3 * compute) / compute))


@pytest.mark.parametrize(("bandwidth", "latency"), [(1e9, 1e-4), (1e5, 0.01)])
def test_auto_lands_each_fragment_at_the_step_its_transfer_arrives(bandwidth: float, latency: float) -> None:
    """With overlap_steps="auto" an update lands after as many steps as its transfer takes on the
    link past its step's backward pass: the same parameters and rows as overlap_steps=<those
    steps>, which hides it whole. On the fast link (0.0002 s, under the 0.00667 s backward pass)
    it lands in the step it is sent; on the slow one (0.0456 s) 4 steps later: 0.0456 - 0.00667
    = 0.0389 s = 3.9 steps."""
    k, h, compute = 2, 8, 0.01
    # TinyNet's 161 parameters in two fragments of 80 and 81 floats
    tau = {_fragment_steps(bandwidth, latency, compute, k, n) for n in (80, 81)}
    assert len(tau) == 1
    (tau,) = tau
    net = Network(bandwidth, latency, compute=compute)
    auto = train_ranks(k, lambda: StreamingDiLoCoStrategy(H=h, overlap_steps="auto", optim_spec=SGD), 24, network=net)
    fixed = train_ranks(k, lambda: StreamingDiLoCoStrategy(H=h, overlap_steps=tau, optim_spec=SGD), 24, network=net)
    for a, b in zip(auto, fixed, strict=True):
        for p, q in zip(a["params"], b["params"], strict=True):
            assert torch.equal(p, q)
    assert _rows(auto) == _rows(fixed)
    assert tau == (0 if bandwidth == 1e9 else 4)
    trained = [r for r in fixed[0]["node"].history if "train_loss" in r]
    assert [r["sim_comm_time"] for r in trained] == [0.0] * len(trained)  # hidden whole: the node never waits
    assert [r["sim_time"] for r in trained] == [
        pytest.approx(r["step"] * compute, abs=1e-12) for r in trained
    ]  # the slow link delays each update by 4 more steps


def test_a_step_count_that_the_transfer_does_not_fit_stalls_at_the_wait() -> None:
    """tau=1 on a link that takes 4.6 steps: the update lands one step after it was sent, the
    node waiting there for the rest of the transfer (auto lands it later, without the stall)."""
    net = Network(1e5, 0.01, compute=0.01)
    fixed = train_ranks(2, lambda: StreamingDiLoCoStrategy(H=8, overlap_steps=1, optim_spec=SGD), 8, network=net)
    t = 2 * 0.01 + 32 * 80 / 1e5  # fragment 0 (80 floats, 0.0456 s), sent after step 3, waited for after step 4
    # it starts with step 3's backward pass, 0.04 - 2/3 * 0.01 = 0.03333 s, and arrives at 0.07893 s;
    # step 4's compute ends at 0.05 s: it waits 0.0456 - 0.00667 - 0.01 = 0.02893 s
    arrival = 4 * 0.01 - 0.02 / 3 + t
    rows = [r for r in fixed[0]["node"].history if "train_loss" in r]
    assert [r["sim_comm_time"] for r in rows[:4]] == [0.0] * 4
    assert rows[4]["sim_comm_time"] == pytest.approx(t - 0.02 / 3 - 0.01, abs=1e-12)
    assert rows[4]["sim_time"] == pytest.approx(arrival, abs=1e-12)


def test_auto_refuses_measured_compute_naming_the_fix() -> None:
    fix = r"pass fit\(\.\.\., network=Network\(\.\.\., compute=<seconds per step>\)\)"
    with pytest.raises(ValueError, match=r"overlap_steps='auto' .* compute='measured': " + fix):
        train_ranks(
            2,
            lambda: StreamingDiLoCoStrategy(H=4, overlap_steps="auto", optim_spec=SGD),
            4,
            network=Network(1e9, 0.01, compute="measured"),
        )


def test_auto_lands_at_the_same_steps_on_virtual_nodes() -> None:
    """On a world of speeds 1, 1, 2, 4 (each node's own clock decides), virtual nodes on 1 and 2
    workers give the thread world's schedule exactly and its values up to summation order."""
    net = Network(1e5, 0.01, compute=0.01, compute_slowdown=(1, 1, 2, 4))
    make = lambda: StreamingDiLoCoStrategy(H=8, overlap_steps="auto", optim_spec=SGD)  # noqa: E731
    runs = [train_ranks(4, make, 24, network=net, workers=w) for w in (None, 1, 2)]
    schedule = [
        [{k: r.get(k) for k in ("step", "sim_time", "sim_comm_time", "bytes_sent")} for r in _rows(o)] for o in runs
    ]
    clocks = [[o["node"].comm.clock.seconds for o in run] for run in runs]
    assert schedule[1] == schedule[0] and schedule[2] == schedule[0]
    assert clocks[1] == clocks[0] and clocks[2] == clocks[0]
    for run in runs[1:]:
        for a, b in zip(runs[0], run, strict=True):
            for p, q in zip(a["params"], b["params"], strict=True):
                torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
