"""Sample-image helpers for TensorBoard: image detection, scaling to [0, 1], tiling, labels."""

from __future__ import annotations

import numpy as np
import pytest

from worker.images import GRID_PAD, grid_shape, is_image_shape, labels_table, tile, to_unit_range


@pytest.mark.parametrize(
    ("shape", "numeric", "expected"),
    [
        ((16, 16, 1), True, True),
        ((28, 28), True, True),
        ((32, 32, 3), True, True),
        ((8, 8, 4), True, True),
        ((8, 8, 2), True, False),  # tf.summary.image takes 1, 3 or 4 channels
        ((None, None, 3), True, False),  # sizes must be known to tile
        ((10,), True, False),
        ((4, 4, 4, 1), True, False),
        ((), True, False),
        ((16, 16, 1), False, False),  # strings, say
    ],
)
def test_is_image_shape(shape, numeric, expected):
    assert is_image_shape(shape, numeric) is expected


def test_to_unit_range_keeps_unit_floats_and_adds_a_channel():
    images = np.random.default_rng(0).uniform(0, 1, size=(3, 5, 6)).astype(np.float64)
    scaled = to_unit_range(images)
    assert scaled.shape == (3, 5, 6, 1) and scaled.dtype == np.float32
    np.testing.assert_allclose(scaled[..., 0], images, rtol=1e-6)


def test_to_unit_range_reads_uint8_as_0_to_255():
    images = np.array([[[[0], [255]], [[51], [102]]]], dtype=np.uint8)
    np.testing.assert_allclose(to_unit_range(images).ravel(), [0.0, 1.0, 0.2, 0.4])


def test_to_unit_range_rescales_other_values_over_the_batch():
    images = np.array([[[-1.0, 0.0], [1.0, 3.0]]])
    np.testing.assert_allclose(to_unit_range(images).ravel(), [0.0, 0.25, 0.5, 1.0])
    assert not to_unit_range(np.full((2, 3, 3), 7, dtype=np.int64)).any()


@pytest.mark.parametrize(
    ("count", "shape"), [(1, (1, 1)), (2, (1, 2)), (4, (2, 2)), (5, (2, 3)), (16, (4, 4))]
)
def test_grid_shape(count, shape):
    assert grid_shape(count) == shape


def test_tile_places_each_image_row_by_row_between_white_borders():
    images = np.stack([np.full((2, 3, 1), i / 10, dtype=np.float32) for i in range(5)])
    grid = tile(images)
    assert grid.shape == (2 * (2 + GRID_PAD) + GRID_PAD, 3 * (3 + GRID_PAD) + GRID_PAD, 1)
    for index in range(5):
        row, column = divmod(index, 3)
        top, left = GRID_PAD + row * (2 + GRID_PAD), GRID_PAD + column * (3 + GRID_PAD)
        assert (grid[top : top + 2, left : left + 3] == index / 10).all()
    assert (grid[:GRID_PAD] == 1.0).all()  # the border
    assert (grid[-3:-1, -4:-1] == 1.0).all()  # the empty sixth cell stays white


def test_sixteen_16x16_rgb_images_make_one_69x69_grid():
    assert tile(np.zeros((16, 16, 16, 3), dtype=np.float32)).shape == (69, 69, 3)


def test_labels_table_follows_the_grid():
    assert labels_table([3, 1, 0, 2, 2], 3).splitlines() == [
        "| col 1 | col 2 | col 3 |",
        "|---|---|---|",
        "| 3 | 1 | 0 |",
        "| 2 | 2 |  |",
    ]
