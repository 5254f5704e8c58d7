"""Dormant nodes: the nodes of a run that never train and never take part in a round, run once
per worker.

A client that no round samples (most of 1,000 FedAvg clients sampled 1% for a few rounds) or
that no event of an asynchronous timeline names does the same thing from the first step to
the last as every other such client: it sits every round out, receives what every idle node
receives, and sends the same metric samples. Where the modules say that such a node's calls do
not depend on its rank (``uniform_idle_calls``), a
worker builds and runs only the first of its dormant nodes, the *lead*, and its hub queues
each call the lead makes once more for every other dormant node it hosts, the lead's *twins*
(``mirror``): the collectives see every node's call as
before, and the twins cost neither a thread, a model copy nor a step of their own. The lead
agrees on the steps per epoch for its twins too (their datasets are built for that only).

Only where nothing reads or changes a node's own state apart from its calls: virtual nodes of
a local run, no validation (it reads each node's state), no checkpoints (each node saves its
own), no faults or availability trace (they pick nodes by rank), no wire transform, a run
length known before it starts, a strategy whose methods that a dormant node calls
(``_init_node``, ``finish``, ...) are this library's (a user's subclass that overrides one may
call collectives of its own), and modules that say so for every method a dormant node calls
(a subclass that overrides one without saying it again does not inherit the claim). Results
equal a run whose dormant nodes each run themselves, up to the order in which the hub sums
equal contributions (float rounding of the final average).
"""

from __future__ import annotations

from typing import Any

from exogym.config import FitConfig
from exogym.runtime import schedule


def dormant_nodes(strategy: Any, config: FitConfig) -> frozenset[int]:
    """The ranks that no round of the run lets train or take part in (every statement idles
    them and none lists them among its ``receives``),
    rank 0 aside (its node makes the run's rows), or ``frozenset()`` where the run or its
    strategy does not allow dormant nodes (module docstring). ``strategy`` as bound for the run
    (an asynchronous module states its ticks once it has the run's network). The same answer on
    every machine: it reads the strategy's statements, the seed and the run's settings only."""
    k, steps = config.num_nodes, config.max_steps
    if not _allows(strategy, config) or steps is None:
        return frozenset()
    active: set[int] = {0}
    step = 0
    while step < steps:
        st = schedule.statement(strategy, step, k, config.seed)
        if st is None:  # every node trains in this round
            return frozenset()
        active.update(st.trains)
        if len(active) == k:
            return frozenset()
        step += st.period - step % st.period
    return frozenset(range(k)) - active


#: The strategy's methods that a dormant node calls: a subclass of the user's that overrides one
#: may make calls of its own, which may depend on the node's rank.
_STRATEGY_METHODS = ("_init_node", "zero_grad", "skip_steps", "communicate_phase", "finish")
#: A module's methods that a dormant node calls.
_MODULE_METHODS = ("setup", "_init_node", "bind", "run", "is_due", "communicate", "participation", "finish")


def _library_code(cls: type, names: tuple[str, ...]) -> bool:
    """Whether the methods ``names`` that ``cls`` has are all this library's."""
    found = (getattr(cls, n, None) for n in names)
    return all(f.__module__.split(".")[0] in ("exogym", "communicators") for f in found if f is not None)


def _states_uniform_idle_calls(module: Any) -> bool:
    """Whether ``module`` says its dormant nodes' calls do not depend on their rank, for every
    method they call: a class that overrides one below the class that says so (a user's
    subclass of FedAvg's module that communicates its own way) does not inherit the claim."""
    if not module.uniform_idle_calls:
        return False
    mro = type(module).__mro__
    says = next(c for c in mro if "uniform_idle_calls" in c.__dict__)
    for name in _MODULE_METHODS:
        owner = next((c for c in mro if name in c.__dict__), None)
        if owner is not None and owner not in says.__mro__:
            return False
    return True


def _allows(strategy: Any, config: FitConfig) -> bool:
    """Whether the run and the strategy allow dormant nodes (the module docstring's terms): the
    strategy's node methods are this library's, and its modules say a dormant node's calls do not
    depend on its rank."""
    if config.workers >= config.num_nodes or config.launcher != "exogym":
        return False
    if config.val_size > 0 or config.checkpoint_dir is not None or config.resume_from is not None:
        return False
    if config.faults is not None or config.network.availability is not None:
        return False
    pipeline = getattr(strategy, "pipeline", None)
    if pipeline is None or getattr(strategy, "wire", None) is not None or not pipeline.modules:
        return False
    if not _library_code(type(strategy), _STRATEGY_METHODS):
        return False
    return all(_states_uniform_idle_calls(m) for m in pipeline.modules)


__all__ = ["dormant_nodes"]
