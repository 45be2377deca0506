"""Owning sessions in a process: leases and mailboxes (host), taking and adopting sessions
(worker), creating and ending them, loading the agent, and running a service until SIGTERM."""
