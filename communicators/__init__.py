"""Communicator modules: the building blocks of ``CommunicateOptimizeStrategy`` pipelines.

Each module is small, does one kind of communication, and charges every byte it would send to
the node's ledger through ``exogym.core.comm.comm.NodeComm``.

* [`AveragingCommunicator`][communicators.AveragingCommunicator]: mean of params or grads,
  optionally in islands;
* [`SparseCommunicator`][communicators.SparseCommunicator]: SPARTA sparse averaging with shared-seed
  (or top-k) selectors;
* [`DiLoCoCommunicator`][communicators.DiLoCoCommunicator]: DiLoCo's outer step on the averaged
  pseudo-gradient;
* [`StreamingDiLoCoCommunicator`][communicators.StreamingDiLoCoCommunicator]: Streaming DiLoCo, the
  outer step on staggered fragments;
* [`QuantizeCommunicator`][communicators.QuantizeCommunicator]: another module's payload in int8 /
  fp8 / fp4 / fp16 / bf16 (the wire transforms [`Int8`][communicators.Int8], [`FP8`][communicators.FP8],
  [`FP4`][communicators.FP4], [`FP16`][communicators.FP16], [`BF16`][communicators.BF16] do it for a whole pipeline:
  ``CommunicateOptimizeStrategy([...], wire=Int8())``);
* [`DCTCompressCommunicator`][communicators.DCTCompressCommunicator]: DeMo's decoupled momentum with
  DCT top-k and sign-SGD ([`DCTTopKReducer`][communicators.DCTTopKReducer] compresses DiLoCo's
  pseudo-gradient the same way);
* [`TopKCommunicator`][communicators.TopKCommunicator]: top-k sparsified gradients with error
  feedback;
* [`PowerSGDCommunicator`][communicators.PowerSGDCommunicator]: PowerSGD's rank-r gradient
  compression;
* [`During`][communicators.During]: another module only on the steps of a window;
* [`OptimizerStateAveraging`][communicators.OptimizerStateAveraging]: the mean of one of the inner
  optimizer's states (DES-LOC);
* [`NoLoCoCommunicator`][communicators.NoLoCoCommunicator]: NoLoCo's outer step, averaged with one
  random peer;
* [`SparseLoCoCommunicator`][communicators.SparseLoCoCommunicator]: SparseLoCo's chunk-wise top-k,
  few-bit pseudo-gradients with error feedback;
* [`EagerDiLoCoCommunicator`][communicators.EagerDiLoCoCommunicator]: DiLoCo whose all-reduce
  overlaps the next inner phase (eager updates);
* servers on the simulated clock ([`Server`][exogym.Server]):
  [`AsyncDiLoCoServer`][communicators.AsyncDiLoCoServer] (asynchronous DiLoCo, delayed Nesterov,
  dynamic local updates), [`FedAvgServer`][communicators.FedAvgServer] (federated averaging of
  sampled clients), [`FedBuffServer`][communicators.FedBuffServer] (buffered asynchronous
  aggregation), [`HALoSServer`][communicators.HALoSServer] (regional and global servers) and
  [`DecoupledDiLoCoServer`][communicators.DecoupledDiLoCoServer] (learners merged by a quorum).
"""

from communicators.async_diloco import AsyncDiLoCoServer
from communicators.averaging import AveragingCommunicator
from communicators.dct import DCTCompressCommunicator, DCTTopKExchange, DCTTopKReducer
from communicators.decoupled_diloco import DecoupledDiLoCoServer
from communicators.diloco import DiLoCoCommunicator
from communicators.eager import EagerDiLoCoCommunicator
from communicators.fedavg import FedAvgServer
from communicators.fedbuff import FedBuffServer
from communicators.halos import HALoSServer
from communicators.islands import draw_islands, draw_participants
from communicators.noloco import NoLoCoCommunicator
from communicators.optimizer_state import OptimizerStateAveraging
from communicators.powersgd import PowerSGDCommunicator
from communicators.quantize import BF16, FP4, FP8, FP16, Int8, Quantize, QuantizeCommunicator
from communicators.sparse import SparseCommunicator
from communicators.sparseloco import SparseLoCoCommunicator
from communicators.streaming import StreamingDiLoCoCommunicator
from communicators.topk import TopKCommunicator
from communicators.window import During
from exogym.core.pipeline import Communicator, NodeContext, Pipeline, Wrapper

__all__ = [
    "BF16",
    "FP4",
    "FP8",
    "FP16",
    "AsyncDiLoCoServer",
    "AveragingCommunicator",
    "Int8",
    "Quantize",
    "Wrapper",
    "DCTCompressCommunicator",
    "DCTTopKExchange",
    "DCTTopKReducer",
    "DecoupledDiLoCoServer",
    "Communicator",
    "DiLoCoCommunicator",
    "During",
    "EagerDiLoCoCommunicator",
    "FedAvgServer",
    "FedBuffServer",
    "HALoSServer",
    "NoLoCoCommunicator",
    "NodeContext",
    "OptimizerStateAveraging",
    "Pipeline",
    "PowerSGDCommunicator",
    "QuantizeCommunicator",
    "SparseCommunicator",
    "SparseLoCoCommunicator",
    "StreamingDiLoCoCommunicator",
    "TopKCommunicator",
    "draw_islands",
    "draw_participants",
]
