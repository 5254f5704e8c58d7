"""Communication: the per-node comm object and its ledger, transports (shared memory, the
process group), the network model that prices the ledger, and flat buffers."""
