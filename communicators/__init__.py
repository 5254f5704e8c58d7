"""Communicator modules: the building blocks of ``CommunicateOptimizeStrategy`` pipelines.

Each module is small, does one kind of communication, and charges every byte it would send to
the node's ledger through :class:`exogym.core.comm.comm.NodeComm`.

* :class:`AveragingCommunicator`: mean of params or grads, optionally in islands / over sampled clients;
* :class:`SparseCommunicator`: SPARTA sparse averaging with shared-seed (or top-k) selectors;
* :class:`DiLoCoCommunicator`: DiLoCo's outer step on the averaged pseudo-gradient;
* :class:`StreamingDiLoCoCommunicator`: Streaming DiLoCo, the outer step on staggered fragments;
* :class:`QuantizeCommunicator`: another module's payload in int8 / fp8 / fp16 / bf16 (the
  wire transforms :class:`Int8`, :class:`FP8`, :class:`FP16`, :class:`BF16` do it for a whole
  pipeline: ``CommunicateOptimizeStrategy([...], wire=Int8())``);
* :class:`DCTCompressCommunicator`: DeMo's decoupled momentum with DCT top-k and sign-SGD
  (:class:`DCTTopKReducer` compresses DiLoCo's pseudo-gradient the same way);
* :class:`TopKCommunicator`: top-k sparsified gradients with error feedback;
* :class:`PowerSGDCommunicator`: PowerSGD's rank-r gradient compression;
* :class:`During`: another module only on the steps of a window;
* :class:`OptimizerStateAveraging`: the mean of one of the inner optimizer's states (DES-LOC);
* :class:`NoLoCoCommunicator`: NoLoCo's outer step, averaged with one random peer;
* :class:`SparseLoCoCommunicator`: SparseLoCo's chunk-wise top-k, few-bit pseudo-gradients
  with error feedback;
* :class:`EagerDiLoCoCommunicator`: DiLoCo whose all-reduce overlaps the next inner phase
  (eager updates);
* :class:`ServerCommunicator`: the base of asynchronous modules that push to and pull from a
  simulated server on a simulated timeline; :class:`AsyncDiLoCoCommunicator` (asynchronous
  DiLoCo, delayed Nesterov, dynamic local updates), :class:`FedBuffCommunicator` (buffered
  asynchronous aggregation), :class:`HALoSCommunicator` (regional and global servers) and
  :class:`DecoupledDiLoCoCommunicator` (learners merged by a quorum) are built on it.
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
