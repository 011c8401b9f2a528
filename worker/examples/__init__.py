"""Example tasks bundled with the worker; they need no downloads (training hosts may be offline)."""
