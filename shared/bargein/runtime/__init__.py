"""One session in the process that owns it: the session runtime, the route executors, a turn,
the delivery ledger and the checkpoint codec. The same code runs in process and distributed."""
