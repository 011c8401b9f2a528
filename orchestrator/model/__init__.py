"""Plain data: the inventory, a worker's spec and the host layout, typed host answers, preflight
findings and run records. Imports nothing of orchestrator above the leaf helpers."""
