"""Strategies: the ``Strategy`` base, the communicator pipeline, the presets, and the handle of a
non-blocking collective.

Presets are [`CommunicateOptimizeStrategy`][exogym.strategy.CommunicateOptimizeStrategy] pipelines
of modules from the top-level ``communicators`` package. Each name is imported when first used
(importing this package does not import torch; see ``exogym._lazy``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from exogym._lazy import lazy_exports

__all__ = [
    "AsyncDiLoCoStrategy",
    "CollectiveHandle",
    "CommunicateOptimizeStrategy",
    "Communicator",
    "DESLOCStrategy",
    "DecoupledDiLoCoStrategy",
    "DeMoStrategy",
    "DiLoCoCommunicator",
    "DiLoCoStrategy",
    "EagerDiLoCoStrategy",
    "FedAvgStrategy",
    "FedBuffStrategy",
    "HALoSStrategy",
    "MuLoCoStrategy",
    "MuonAdamW",
    "NoLoCoStrategy",
    "OptimSpec",
    "PowerSGDStrategy",
    "SPARTADiLoCoStrategy",
    "SPARTAStrategy",
    "SimpleReduceStrategy",
    "SparseLoCoStrategy",
    "Strategy",
    "StreamingDiLoCoStrategy",
    "TopKEFStrategy",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "AsyncDiLoCoStrategy": "exogym.strategy.async_diloco",
        "CollectiveHandle": "exogym.core.comm.handles",
        "CommunicateOptimizeStrategy": "exogym.core.pipeline",
        "Communicator": "exogym.core.pipeline",
        "DESLOCStrategy": "exogym.strategy.desloc",
        "DecoupledDiLoCoStrategy": "exogym.strategy.decoupled_diloco",
        "DeMoStrategy": "exogym.strategy.demo",
        "DiLoCoCommunicator": "communicators.diloco",
        "DiLoCoStrategy": "exogym.strategy.diloco",
        "EagerDiLoCoStrategy": "exogym.strategy.eager_diloco",
        "FedAvgStrategy": "exogym.strategy.federated_averaging",
        "FedBuffStrategy": "exogym.strategy.fedbuff",
        "HALoSStrategy": "exogym.strategy.halos",
        "MuLoCoStrategy": "exogym.strategy.muloco",
        "MuonAdamW": "exogym.core.muon",
        "NoLoCoStrategy": "exogym.strategy.noloco",
        "PowerSGDStrategy": "exogym.strategy.powersgd",
        "OptimSpec": "exogym.core.optim",
        "SPARTADiLoCoStrategy": "exogym.strategy.sparta",
        "SPARTAStrategy": "exogym.strategy.sparta",
        "SimpleReduceStrategy": "exogym.strategy.simple_reduce",
        "SparseLoCoStrategy": "exogym.strategy.sparseloco",
        "Strategy": "exogym.core.strategy",
        "StreamingDiLoCoStrategy": "exogym.strategy.streaming_diloco",
        "TopKEFStrategy": "exogym.strategy.topk_ef",
    },
)

if TYPE_CHECKING:
    from communicators.diloco import DiLoCoCommunicator
    from exogym.core.comm.handles import CollectiveHandle
    from exogym.core.muon import MuonAdamW
    from exogym.core.optim import OptimSpec
    from exogym.core.pipeline import CommunicateOptimizeStrategy, Communicator
    from exogym.core.strategy import Strategy
    from exogym.strategy.async_diloco import AsyncDiLoCoStrategy
    from exogym.strategy.decoupled_diloco import DecoupledDiLoCoStrategy
    from exogym.strategy.demo import DeMoStrategy
    from exogym.strategy.desloc import DESLOCStrategy
    from exogym.strategy.diloco import DiLoCoStrategy
    from exogym.strategy.eager_diloco import EagerDiLoCoStrategy
    from exogym.strategy.fedbuff import FedBuffStrategy
    from exogym.strategy.federated_averaging import FedAvgStrategy
    from exogym.strategy.halos import HALoSStrategy
    from exogym.strategy.muloco import MuLoCoStrategy
    from exogym.strategy.noloco import NoLoCoStrategy
    from exogym.strategy.powersgd import PowerSGDStrategy
    from exogym.strategy.simple_reduce import SimpleReduceStrategy
    from exogym.strategy.sparseloco import SparseLoCoStrategy
    from exogym.strategy.sparta import SPARTADiLoCoStrategy, SPARTAStrategy
    from exogym.strategy.streaming_diloco import StreamingDiLoCoStrategy
    from exogym.strategy.topk_ef import TopKEFStrategy
