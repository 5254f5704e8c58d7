"""The simulator's core: collectives and their ledger, transports, optimizer specs, LR
schedules, the Strategy base class and the communicator pipeline protocol.

Nothing here knows the concrete communicators (package ``communicators``) or the strategy
presets (package ``exogym.strategy``); both build on this core.
"""
