"""Communicator modules: the building blocks of ``CommunicateOptimizeStrategy`` pipelines.

Each module is small, does one kind of communication, and charges every byte it would send to
the node's ledger through ``exogym.core.comm.comm.NodeComm``.

* [`AveragingCommunicator`][communicators.AveragingCommunicator]: mean of params or grads,
  optionally in islands / over sampled clients;
* [`SparseCommunicator`][communicators.SparseCommunicator]: SPARTA sparse averaging with shared-seed
  (or top-k) selectors;
* [`DiLoCoCommunicator`][communicators.DiLoCoCommunicator]: DiLoCo's outer step on the averaged
  pseudo-gradient;
* [`StreamingDiLoCoCommunicator`][communicators.StreamingDiLoCoCommunicator]: Streaming DiLoCo, the
  outer step on staggered fragments;
* [`QuantizeCommunicator`][communicators.QuantizeCommunicator]: another module's payload in int8 /
  fp8 / fp16 / bf16 (the wire transforms [`Int8`][communicators.Int8], [`FP8`][communicators.FP8],
  [`FP16`][communicators.FP16], [`BF16`][communicators.BF16] do it for a whole pipeline:
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
* [`ServerCommunicator`][communicators.ServerCommunicator]: the base of asynchronous modules that
  push to and pull from a simulated server on a simulated timeline;
  [`AsyncDiLoCoCommunicator`][communicators.AsyncDiLoCoCommunicator] (asynchronous DiLoCo, delayed
  Nesterov, dynamic local updates), [`FedBuffCommunicator`][communicators.FedBuffCommunicator]
  (buffered asynchronous aggregation), [`HALoSCommunicator`][communicators.HALoSCommunicator]
  (regional and global servers) and
  [`DecoupledDiLoCoCommunicator`][communicators.DecoupledDiLoCoCommunicator] (learners merged by a
  quorum) are built on it.
"""

from communicators.async_diloco import AsyncDiLoCoCommunicator
from communicators.averaging import AveragingCommunicator
from communicators.dct import DCTCompressCommunicator, DCTTopKExchange, DCTTopKReducer
from communicators.decoupled_diloco import DecoupledDiLoCoCommunicator
from communicators.diloco import DiLoCoCommunicator
from communicators.eager import EagerDiLoCoCommunicator
from communicators.fedbuff import FedBuffCommunicator
from communicators.halos import HALoSCommunicator
from communicators.islands import draw_islands, draw_participants
from communicators.noloco import NoLoCoCommunicator
from communicators.optimizer_state import OptimizerStateAveraging
from communicators.powersgd import PowerSGDCommunicator
from communicators.quantize import BF16, FP8, FP16, Int8, Quantize, QuantizeCommunicator
from communicators.server import ServerCommunicator
from communicators.sparse import SparseCommunicator
from communicators.sparseloco import SparseLoCoCommunicator
from communicators.streaming import StreamingDiLoCoCommunicator
from communicators.topk import TopKCommunicator
from communicators.window import During
from exogym.core.pipeline import Communicator, NodeContext, Participation, Pipeline, Wrapper

__all__ = [
    "BF16",
    "FP8",
    "FP16",
    "AsyncDiLoCoCommunicator",
    "AveragingCommunicator",
    "Int8",
    "Participation",
    "Quantize",
    "Wrapper",
    "DCTCompressCommunicator",
    "DCTTopKExchange",
    "DCTTopKReducer",
    "DecoupledDiLoCoCommunicator",
    "Communicator",
    "DiLoCoCommunicator",
    "During",
    "EagerDiLoCoCommunicator",
    "FedBuffCommunicator",
    "HALoSCommunicator",
    "NoLoCoCommunicator",
    "NodeContext",
    "OptimizerStateAveraging",
    "Pipeline",
    "PowerSGDCommunicator",
    "QuantizeCommunicator",
    "ServerCommunicator",
    "SparseCommunicator",
    "SparseLoCoCommunicator",
    "StreamingDiLoCoCommunicator",
    "TopKCommunicator",
    "draw_islands",
    "draw_participants",
]
