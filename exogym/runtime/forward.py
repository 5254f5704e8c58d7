"""How a node calls the model on a batch and reads the loss from what it returns.

ExoGym's contract: ``model(batch)`` returns the scalar loss of the batch (its mean), whatever
the batch is (``(inputs, labels)``, a tensor, a tuple of several), so the model decides how to
read its data.

A batch that is a mapping follows the Hugging Face convention, as that library's ``Trainer``
does: it is passed as keyword arguments, ``model(**batch)`` (``{"input_ids": ..., "labels":
...}`` becomes ``model(input_ids=..., labels=...)``), and an output that is not a tensor gives
its ``loss``: an attribute (``transformers``' ``ModelOutput``) or the key ``"loss"`` of a
mapping. A ``transformers`` model computes that loss when the batch holds its ``labels``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode


def call(model: torch.nn.Module, batch: Any) -> Any:
    """``model(**batch)`` for a mapping batch, else ``model(batch)``; what the model returns."""
    return model(**batch) if isinstance(batch, Mapping) else model(batch)


def described_call(batch: Any) -> str:
    """How ``call`` calls the model on ``batch``, for messages: ``model(**batch)`` or
    ``model(batch)``."""
    return "model(**batch)" if isinstance(batch, Mapping) else "model(batch)"


def loss_of(output: Any, batch: Any) -> torch.Tensor:
    """The scalar loss in ``output``, what ``call`` returned for ``batch``, as a 0-d tensor:
    ``output`` itself when it is a tensor, else its ``"loss"`` key or ``loss`` attribute.

    Raises ``TypeError`` naming what the model returned: a tensor of more than one element, an
    output whose loss is ``None`` (a ``transformers`` model given no ``labels``), or an object
    with no loss at all.
    """
    loss = output
    if not isinstance(output, torch.Tensor):
        loss = output.get("loss") if isinstance(output, Mapping) else None
        if loss is None:
            loss = getattr(output, "loss", None)
        if loss is None:
            raise TypeError(_no_loss(output, batch))
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        of = "" if loss is output else f" as the loss of the {type(output).__name__} it returned"
        raise TypeError(
            f"{described_call(batch)} must return a scalar loss tensor (the mean loss over the batch), got "
            f"{shape}{of}; compute the loss inside forward()"
        )
    return loss.reshape(())


def _no_loss(output: Any, batch: Any) -> str:
    """The message for an output without a loss: a model output that left it out (it has a
    ``loss`` field or logits) needs labels; anything else is not a loss."""
    how = described_call(batch)
    fields = output.keys() if isinstance(output, Mapping) else ()
    if hasattr(output, "loss") or hasattr(output, "logits") or "logits" in fields:
        return (
            f"{how} returned a {type(output).__name__} without a loss: give the batch the labels the model computes "
            "its loss from (for a transformers model, a 'labels' key: for a causal language model, the input_ids "
            "themselves)"
        )
    return (
        f"{how} must return a scalar loss tensor (the mean loss over the batch), or an output with a 'loss' key or "
        f"attribute, got {type(output).__name__}; compute the loss inside forward()"
    )


def forward_loss(model: torch.nn.Module, batch: Any) -> torch.Tensor:
    """``model``'s scalar loss on ``batch`` (``call``, then ``loss_of``), a 0-d tensor."""
    return loss_of(call(model, batch), batch)


def backward(
    forward: Callable[[Any], torch.Tensor],
    batch: Any,
    accumulation: int,
    device: torch.device,
    count_flops: bool = False,
) -> tuple[float, float | None]:
    """One training step's forward and backward passes on ``batch``: ``forward`` (the loss of a
    batch, under autocast where the run asks for it) on each of its ``accumulation`` minibatches,
    ``(loss / accumulation).backward()``, so the gradients are the batch mean. The losses
    summed, and with ``count_flops`` the step's FLOPs (``torch.utils.flop_counter``), else
    ``None``."""
    from exogym import data as D

    if accumulation == 1 and not count_flops:  # most steps: no tensor bookkeeping around them
        loss = forward(D.to_device(batch, device))
        loss.backward()
        return loss.item(), None
    counter = FlopCounterMode(display=False) if count_flops else None
    loss_sum = torch.zeros((), dtype=torch.float64)
    with counter or contextlib.nullcontext():
        for mb in D.split_batch(batch, accumulation):
            loss = forward(D.to_device(mb, device))
            (loss / accumulation).backward()
            loss_sum += loss.detach().double().cpu()
    return loss_sum.item(), None if counter is None else float(counter.get_total_flops())
