"""Small TrainingTask modules for tests: `python -m worker --task tests.tasks.MODULE:task`.

Run from the repository root (the tests start workers with it as the current directory).
"""
