"""User strategies written as in the seeds, with exogym.strategy.communicate collectives."""

import pytest
import torch

from exogym import Trainer
from exogym.strategy import OptimSpec, Strategy
from exogym.strategy.communicate import all_gather, all_reduce, broadcast
from tests.helpers import FIT_DEFAULTS, TinyNet, regression_data

pytestmark = [pytest.mark.procs, pytest.mark.timeout(90)]


class QuantizedReduce(Strategy):
    """Quantize each gradient to uint8, widen to int32, all-reduce, rescale, step."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)

    def _init_node(self, model, rank, num_nodes):
        super()._init_node(model, rank, num_nodes)
        self.params = list(model.parameters())

    def step(self):
        for p in self.params:
            scale = p.grad.abs().max().reshape(1).clone()
            all_reduce(scale, op=torch.distributed.ReduceOp.MAX)
            scale = scale.clamp_min(1e-12)
            q = torch.round((p.grad / scale * 127.0) + 127.0).to(torch.uint8)
            wide = q.to(torch.int32)
            all_reduce(wide)
            p.grad.copy_((wide.float() / self.num_nodes - 127.0) / 127.0 * scale)
        self.optimizer.step()
        super().step()


def test_user_strategy_with_int32_all_reduce_trains_and_is_charged_int32_bytes() -> None:
    k, steps = 2, 20
    model = TinyNet()
    n_elems = sum(p.numel() for p in model.parameters())
    n_tensors = len(list(model.parameters()))
    trainer = Trainer(model, regression_data(n=steps * 8 * k))
    trainer.fit(
        QuantizedReduce(optim_spec=OptimSpec(torch.optim.SGD, lr=0.05)),
        k,
        max_steps=steps,
        batch_size=8,
        log_interval=1,
        **FIT_DEFAULTS,
    )
    rows = [r for r in trainer.history if "train_loss" in r]
    assert rows[-1]["train_loss"] < rows[0]["train_loss"]
    ring = 2 * (k - 1) / k
    per_step = ring * (4 * n_elems + 4 * n_tensors)  # int32 gradients + one fp32 scale per tensor
    assert rows[-1]["bytes_sent"] == pytest.approx(per_step * steps)


class GatherBroadcast(Strategy):
    """Exercises all_gather and broadcast: rank-mean of grads by gather, then rank 0's params."""

    def step(self):
        for p in self.model.parameters():
            parts = [torch.empty_like(p.grad) for _ in range(self.num_nodes)]
            all_gather(parts, p.grad)
            p.grad.copy_(torch.stack(parts).mean(0))
        self.optim.step()
        for p in self.model.parameters():
            broadcast(p.data, src=0)
        super().step()


def test_all_gather_and_broadcast_for_custom_strategies() -> None:
    trainer = Trainer(TinyNet(), regression_data(n=64))
    trainer.fit(
        GatherBroadcast(optim_spec="sgd", lr=0.05), 2, max_steps=4, batch_size=8, log_interval=4, **FIT_DEFAULTS
    )
    model = TinyNet()
    nbytes = sum(p.numel() * 4 for p in model.parameters())
    # all_gather: (n-1)*b each; broadcast: root sends b, the other receives b; mean over 2 nodes.
    expected_sent = 4 * (nbytes + nbytes / 2)
    assert trainer.history[-1]["bytes_sent"] == pytest.approx(expected_sent)


def test_collectives_outside_a_node_raise() -> None:
    with pytest.raises(RuntimeError, match="no ExoGym node is running"):
        all_reduce(torch.zeros(1))


class RawTorchDistributed(Strategy):
    """Calls torch.distributed directly, as code written for a real cluster would."""

    def step(self):
        import torch.distributed as dist

        for p in self.model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
        self.optim.step()
        super().step()


@pytest.mark.parametrize("transport", ["shm", "gloo"])
def test_raw_torch_distributed_calls_work_on_every_transport(transport) -> None:
    from exogym.strategy import SimpleReduceStrategy

    ds = regression_data(n=64)
    sgd = OptimSpec(torch.optim.SGD, lr=0.05)
    raw = Trainer(TinyNet(), ds).fit(
        RawTorchDistributed(optim_spec=sgd), 2, max_steps=4, batch_size=8, transport=transport, **FIT_DEFAULTS
    )
    ddp = Trainer(TinyNet(), ds).fit(
        SimpleReduceStrategy(optim_spec=sgd), 2, max_steps=4, batch_size=8, transport=transport, **FIT_DEFAULTS
    )
    for p, q in zip(raw.parameters(), ddp.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
