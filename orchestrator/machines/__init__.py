"""Reaching one machine: connection kinds, runners (local, SSH), the host agent client and the
stdlib programs it sends. Shared by the inventory checks (a kind's keys) and both backends."""
