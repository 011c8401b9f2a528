"""Sample input images for TensorBoard: scaling to [0, 1] and tiling into one grid image.

numpy only (no TensorFlow, no matplotlib), so the arithmetic is unit-tested on its own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

GRID_PAD = 1  # pixels of white between tiles and around the grid, so tiles stay apart
IMAGE_CHANNELS = (1, 3, 4)  # what tf.summary.image accepts: grayscale, RGB, RGBA


def is_image_shape(shape: Sequence[int | None], dtype_is_numeric: bool) -> bool:
    """One example's features look like an image: HxW or HxWxC (C in 1, 3, 4), sizes known."""
    if not dtype_is_numeric or len(shape) not in (2, 3) or any(d is None for d in shape):
        return False
    return len(shape) == 2 or shape[2] in IMAGE_CHANNELS


def to_unit_range(images: np.ndarray) -> np.ndarray:
    """float32 [N, H, W, C] in [0, 1], from any numeric batch of HxW or HxWxC images.

    uint8 is read as 0..255. Other values already within [0, 1] are kept as they are; anything else
    (standardised inputs, raw 0..255 floats) is min-max scaled over the whole batch, so the
    tiles stay comparable with each other.
    """
    if images.ndim == 3:
        images = images[..., np.newaxis]
    if images.dtype == np.uint8:
        return images.astype(np.float32) / 255.0
    images = images.astype(np.float32)
    low, high = float(images.min()), float(images.max())
    if low >= 0.0 and high <= 1.0:
        return images
    if high == low:
        return np.zeros_like(images)
    return (images - low) / (high - low)


def grid_shape(count: int) -> tuple[int, int]:
    """(rows, columns) of a near-square grid: 16 -> (4, 4), 5 -> (2, 3)."""
    columns = math.ceil(math.sqrt(count))
    return math.ceil(count / columns), columns


def tile(images: np.ndarray) -> np.ndarray:
    """[N, H, W, C] in [0, 1] -> one [rows*(H+pad)+pad, columns*(W+pad)+pad, C] image."""
    count, height, width, channels = images.shape
    rows, columns = grid_shape(count)
    grid = np.ones(
        (rows * (height + GRID_PAD) + GRID_PAD, columns * (width + GRID_PAD) + GRID_PAD, channels),
        dtype=np.float32,
    )
    for index in range(count):
        top = GRID_PAD + (index // columns) * (height + GRID_PAD)
        left = GRID_PAD + (index % columns) * (width + GRID_PAD)
        grid[top : top + height, left : left + width] = images[index]
    return grid


def labels_table(labels: Sequence[object], columns: int) -> str:
    """The labels laid out like the grid, as a Markdown table (TensorBoard renders descriptions)."""
    cells = [str(label) for label in labels]
    rows = [cells[i : i + columns] for i in range(0, len(cells), columns)]
    header = "| " + " | ".join(f"col {c + 1}" for c in range(columns)) + " |"
    lines = [header, "|" + "---|" * columns]
    lines += ["| " + " | ".join(row + [""] * (columns - len(row))) + " |" for row in rows]
    return "\n".join(lines)
