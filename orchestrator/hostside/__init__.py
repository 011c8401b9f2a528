"""The stdlib-only programs sent to a host as `python -c SOURCE` (never imported here)."""
