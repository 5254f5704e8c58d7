"""Sampled Federated Averaging as a plain synchronous loop.

McMahan et al. 2017, "Communication-Efficient Learning of Deep Networks from Decentralized Data"
(AISTATS, arXiv 1602.05629), Algorithm 1 (FederatedAveraging), with ExoGym's settings; the K
nodes are the clients. Rounds are synchronous, so no events are needed: with equal client speeds
and links a run of ``max_steps`` ticks is ``max_steps // H`` rounds of ``H`` ticks (the steps of a
trailing partial round never reach the server and are not modelled).

Server (Algorithm 1, server side). Each round ``r`` (from 0) draws ``m = max(1, round(C * K))``
clients (``C`` = ``client_sampling``): ``draw_participants(list(range(K)), C, seed, r)``. The
model becomes the plain mean of the drawn clients' returned parameters (ExoGym's choice: the
paper weights client ``k`` by ``n_k / n``; ExoGym's shards are equal, and it takes the
unweighted mean). Every client, drawn or not, then holds that model.

Islands (``island_size = s``, ExoGym's extension). Each round the K clients are split into
random islands, ``draw_islands(K, s, seed, r)``; in each island the drawn clients are
``draw_participants(island, C, seed, r)``, each trains from the model it holds, and every member
of the island then holds the mean of its drawn clients' results. The run's model is the mean of
all K clients' held models (the island means weighted by island size / K). Without islands every
client holds the same model, so this is the server model above.

Clients (Algorithm 1, ClientUpdate). A drawn client copies its starting model into its own
parameters (``copy_``) and takes ``H`` steps of its own inner optimizer, built once from
``make_inner(params)`` at its first draw and kept, with its state, across the rounds it is drawn
in (a real client keeps its optimizer). A client's ``j``-th step over its whole life uses its
``j``-th batch, ``node_batches(ds, K, k)`` (its shard; batches continue across rounds). The
loss is ``model(batch)``. The draws (``communicators.islands``) are the run's seeded choices,
taken here as given inputs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from communicators.islands import draw_islands, draw_participants
from tests.helpers import TinyNet
from tests.references import batch_stream, train_step


def _mean(models: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    """The unweighted per-tensor mean of ``models`` (each a list of tensors)."""
    return [torch.stack(ts).mean(0) for ts in zip(*models, strict=True)]


def reference_fedavg(
    ds: Any,
    k: int,
    max_steps: int,
    *,
    H: int,
    client_sampling: float = 1.0,
    island_size: int | None = None,
    make_inner: Callable[[Any], torch.optim.Optimizer],
    seed: int = 0,
) -> dict[str, Any]:
    """Run sampled FedAvg on ``k`` TinyNet clients for ``max_steps // H`` rounds.

    Returns ``dict(params, steps, drawn)``: the run's parameters (the mean of the clients' held
    models, a list of tensors in ``model.parameters()`` order), each client's number of steps and,
    per round, the sorted clients drawn. Raises ``ValueError`` naming the argument on bad input.
    """
    if k < 1:
        raise ValueError(f"k={k}: give at least one client")
    if H < 1:
        raise ValueError(f"H={H}: give at least one local step per round")
    if max_steps < 0:
        raise ValueError(f"max_steps={max_steps}: give a number of ticks >= 0")
    if island_size is not None and island_size < 1:
        raise ValueError(f"island_size={island_size}: give at least one client per island, or None")

    initial = [p.detach().clone() for p in TinyNet().parameters()]
    held = [initial] * k  # the model each client holds (tensors are never changed in place)
    models: list[torch.nn.Module | None] = [None] * k
    opts: list[torch.optim.Optimizer | None] = [None] * k
    data = [batch_stream(ds, k, c) for c in range(k)]
    steps, drawn = [0] * k, []

    for r in range(max_steps // H):
        islands = [list(range(k))] if island_size is None else draw_islands(k, island_size, seed, r)
        this_round = []
        for island in islands:
            participants = draw_participants(island, client_sampling, seed, r)
            results = []
            for c in participants:
                if models[c] is None:
                    models[c] = TinyNet()
                    opts[c] = make_inner(models[c].parameters())
                with torch.no_grad():
                    for p, s in zip(models[c].parameters(), held[c], strict=True):
                        p.copy_(s)
                for _ in range(H):
                    train_step(models[c], opts[c], next(data[c]))
                steps[c] += H
                results.append([p.detach().clone() for p in models[c].parameters()])
            mean = _mean(results)
            for c in island:
                held[c] = mean
            this_round += participants
        drawn.append(sorted(this_round))
    return {"params": _mean(held), "steps": steps, "drawn": drawn}
