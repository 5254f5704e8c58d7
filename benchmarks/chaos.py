"""Chaos, timed: a worker of virtual nodes SIGKILLed inside a collective, on shared memory and on
gloo. Reports the seconds from the kill to ``fit``'s ``NodeFailedError``, its first line, and the
run's processes still alive 5 s later.

The run: DDP on 4 nodes, 2 per worker, the MLP 8-16-1 on random regression data. At its third
step node 2's process SIGKILLs itself (a timer, 0.3 s later) while node 0 spends 2 s in its
forward, so the killed worker dies waiting in the step's all-reduce; ``collective_timeout`` is
60 s, so an error before it comes from the parent seeing the death. The full disk and the
damaged ``latest`` are checked by ``tests/test_chaos.py``.

    python benchmarks/chaos.py
"""

from __future__ import annotations

import logging
import os
import signal
import tempfile
import threading
import time

import torch
from torch import nn

from exogym import NodeFailedError, Trainer
from exogym.cli import quiet_interrupt, script_parser
from exogym.core.comm import comm as node_comm
from exogym.strategy import SimpleReduceStrategy

logger = logging.getLogger("benchmarks.chaos")


class KilledAtStep3(nn.Module):
    """An MSE regression MLP whose third forward on node 2 SIGKILLs that node's process 0.3 s
    later (after writing the time of the kill to ``folder``) and, on node 0, sleeps 2 s. Each
    node process writes ``pid-<pid>`` to ``folder``."""

    def __init__(self, folder: str) -> None:
        super().__init__()
        self.folder, self.calls = folder, 0
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        self.calls += 1
        open(os.path.join(self.folder, f"pid-{os.getpid()}"), "w").close()
        rank = node_comm.current().rank if self.calls == 3 else None
        if rank == 2:
            threading.Timer(0.3, self._kill).start()
        if rank == 0:
            time.sleep(2.0)
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def _kill(self) -> None:
        with open(os.path.join(self.folder, "killed-at"), "w") as f:
            f.write(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def killed_worker(transport: str) -> dict:
    """One run whose worker 1 is SIGKILLed in a collective: seconds to the error, its first line,
    processes of the run alive 5 s later."""
    folder = tempfile.mkdtemp(prefix="exogym-chaos-")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1024, 8, generator=g)
    data = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))
    try:
        Trainer(KilledAtStep3(folder), data).fit(
            SimpleReduceStrategy(), num_nodes=4, workers=2, max_steps=50, batch_size=8, transport=transport,
            logger=False, progress=False, val_size=0, collective_timeout=60,
        )  # fmt: skip
    except NodeFailedError as error:
        seconds = time.time() - float(open(os.path.join(folder, "killed-at")).read())
        message = str(error).splitlines()[0]
    else:
        raise RuntimeError("the run ended without the worker's death being reported")
    pids = [int(n[4:]) for n in os.listdir(folder) if n.startswith("pid-") and int(n[4:]) != os.getpid()]
    time.sleep(5.0)
    return {"seconds": seconds, "error": message, "left": [p for p in pids if _alive(p)], "workers": len(pids)}


@quiet_interrupt
def main() -> None:
    script_parser(__doc__).parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for transport in ("shm", "gloo"):
        r = killed_worker(transport)
        logger.info(
            "%s: NodeFailedError %.2f s after the SIGKILL (%s); processes left 5 s later: %d of %d",
            transport, r["seconds"], r["error"], len(r["left"]), r["workers"],
        )  # fmt: skip


if __name__ == "__main__":
    main()
