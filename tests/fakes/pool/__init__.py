"""A fourth backend, written in the test tree: a pool of local processes (see backend.py)."""
