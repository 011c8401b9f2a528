"""A script that imports a module of the user's that was not shipped with it (job.files)."""

import shapes_helpers  # noqa: F401

print("unreachable")
