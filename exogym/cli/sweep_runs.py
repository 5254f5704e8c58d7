"""A sweep's runs one at a time: train one (or read it back, finished by an earlier sweep) and
keep its outcome (``exogym.cli.sweep``)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from exogym.cli.compare import _summary_row
from exogym.cli.grid import Point
from exogym.cli.point import run_point
from exogym.cli.sweep_store import RunStore
from exogym.core.comm.network import Network, resolve_network
from exogym.core.strategy import Strategy
from exogym.strategy.registry import call_factory
from exogym.tasks import Task

logger = logging.getLogger(__name__)

__all__ = ["Outcome", "Runner", "keep", "network_of"]


def network_of(point: Point, flops_per_second: float | None, seed: int) -> Network:
    """The run's network: the point's network and compute settings, drawn from ``seed``, at
    ``flops_per_second`` when given."""
    net = resolve_network(point.run["network"], point.run["compute"], num_nodes=point.run["nodes"], seed=seed)
    return net if flops_per_second is None else dataclasses.replace(net, flops_per_second=flops_per_second)


@dataclass
class Outcome:
    """A run's outcome: its summary row and history, or the exception that stopped it.

    Attributes:
        point: the run's grid point, strategy and seed.
        key: its key in the store (``exogym.cli.sweep_store.run_key``).
        row: its summary row (``exogym.cli.sweep.RUN_COLUMNS``); empty for a failure.
        history: its ``Trainer.history`` rows.
        error: the exception that stopped it, or ``None``.
        reused: finished by an earlier sweep and read back.
    """

    point: Point
    key: str
    row: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    error: Exception | None = None
    reused: bool = False


@dataclass
class Runner:
    """Trains a sweep's runs (or reads them back, finished by an earlier sweep).

    Attributes:
        spec, device, flops_per_second: the sweep's task and settings.
        store: where finished runs are kept.
        progress: show each run's progress bar.
        packed: runs train side by side (a log line tells when each finishes).
    """

    spec: Task
    store: RunStore
    device: str
    flops_per_second: float | None
    progress: bool
    packed: bool

    def reuse(self, point: Point, key: str, counter: str, stored: dict[str, Any]) -> Outcome:
        """The run of ``key``, finished by an earlier sweep and read back (``stored``, from
        ``RunStore.load``)."""
        logger.info("%s %s: finished before (%s)", counter, point.label(), self.store.folder(key))
        return Outcome(point, key, stored["row"], stored["history"], reused=True)

    def train(
        self, point: Point, factory: Callable[..., Strategy], config: dict[str, Any], key: str, counter: str
    ) -> Outcome:
        """Train ``point`` and record it as finished in the store; a run that raises an
        ``Exception`` comes back with it as ``error`` (not recorded as finished: its folder gets
        a ``FAILED`` file holding the error)."""
        logger.info("%s %s", counter, point.label())
        self.store.clear(key)
        try:
            history, wall = self._train(point, factory, key)
        except Exception as e:  # noqa: BLE001 - the sweep goes on; the error is reported with the run
            self.store.mark_failed(key, e)
            return Outcome(point, key, error=e)
        row = {k: v for k, v in _summary_row(point.strategy, history, wall).items() if k != "strategy"}
        self.store.save(key, config, row, history)
        if self.packed:
            logger.info("%s %s: finished in %.1f s", counter, point.label(), wall)
        return Outcome(point, key, row, history)

    def _train(self, point: Point, factory: Callable[..., Strategy], key: str) -> tuple[list[dict[str, Any]], float]:
        run, network = point.run, network_of(point, self.flops_per_second, point.seed)
        done = run_point(
            self.spec, call_factory(factory, point.params), name=key, log_dir=self.store.root, nodes=run["nodes"],
            steps=run["steps"], batch_size=run["batch_size"], network=network,
            seed=point.seed, val_size=run["val_size"], progress=self.progress, device=self.device,
            workers=run["workers"], fit_args=point.fit_args,
        )  # fmt: skip
        return done.history, done.wall


def keep(outcomes: dict[int, Outcome], index: int, done: Outcome, stop_on_failure: bool) -> bool:
    """Keep run ``index``'s outcome; whether the sweep goes on."""
    outcomes[index] = done
    if done.error is None:
        return True
    if not stop_on_failure:
        logger.error("%s failed (the other runs go on):", done.point.label(), exc_info=done.error)
    return not stop_on_failure
