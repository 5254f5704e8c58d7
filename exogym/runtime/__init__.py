"""How nodes run: the launcher (processes, rendezvous, teardown), the node loop and the
minibatch memory probe."""
