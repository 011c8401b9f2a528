"""What the test scripts share: tiny generated data, a small model, and the weights checksum.

Imported by the scripts (they run with the tests directory on sys.path), never by pytest.
"""

import hashlib
import json
import os

import numpy as np

FEATURES, CLASSES, EXAMPLES = 8, 3, 256


def data(seed: int = 7):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(EXAMPLES, FEATURES)).astype("float32")
    y = (x[:, 0] > 0).astype("int64") + (x[:, 1] > 1).astype("int64")
    return x, y


def build_model(keras):
    return keras.Sequential(
        [
            keras.layers.Input(shape=(FEATURES,)),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(CLASSES),
        ]
    )


def write_checksum(model, **extra) -> None:
    """Every worker writes the digest of its final weights into its run directory: workers in
    sync hold bit-identical variables (equal logged losses prove nothing, they are all-reduced)."""
    digest = hashlib.sha256()
    for weight in model.get_weights():
        digest.update(np.ascontiguousarray(weight, dtype=np.float32).tobytes())
    path = os.path.join(os.environ.get("ORCHESTRATE_RUN_DIR", "."), "checksum.json")
    with open(path, "w") as file:
        json.dump({"sha256": digest.hexdigest(), **extra}, file)
    print("checksum", digest.hexdigest(), flush=True)
