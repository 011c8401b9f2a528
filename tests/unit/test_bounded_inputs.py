"""Files and YAML the controller reads are bounded (issue 54): a regular file under its cap,
read with a bound; YAML refused past a depth or an alias-expanded size; a long value described
by its size in a message, never printed whole. Fifos and device links are made in the test's own
temporary directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator.boundedread import check_tree, read_bytes, size_text
from orchestrator.errors import FileRefused
from orchestrator.values import brief_list, describe, integers
from orchestrator.yamlsource import DEPTH_CAP, VALUES_CAP, YamlSyntaxError, parse


def test_a_regular_file_under_its_cap_is_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    assert read_bytes(path, 100) == b"x" * 100


def test_a_file_over_its_cap_is_refused_with_its_size(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 2048)
    with pytest.raises(FileRefused, match=r"2.0 KiB, over the limit of 1.0 KiB"):
        read_bytes(path, 1024)


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(FileRefused, match="a fifo"):
        read_bytes(tmp_path / "pipe", 1024)


def test_a_link_to_a_device_is_refused(tmp_path: Path) -> None:
    (tmp_path / "zero").symlink_to("/dev/zero")
    with pytest.raises(FileRefused, match="a character device, not a regular file") as caught:
        read_bytes(tmp_path / "zero", 1024)
    assert caught.value.filename == str(tmp_path / "zero")


def test_a_tree_names_the_first_file_it_will_not_read(tmp_path: Path) -> None:
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "all.yml").write_text("a: 1\n")
    os.mkfifo(tmp_path / "group_vars" / "workers")
    with pytest.raises(FileRefused, match="a fifo") as caught:
        check_tree(tmp_path, 1024, 10)
    assert caught.value.filename == str(tmp_path / "group_vars" / "workers")


def test_a_tree_of_too_many_files_is_refused(tmp_path: Path) -> None:
    for index in range(5):
        (tmp_path / f"f{index}").write_text("")
    with pytest.raises(FileRefused, match="more than 3 files"):
        check_tree(tmp_path, 1024, 3)


def test_yaml_nested_past_the_cap_is_refused() -> None:
    inside = DEPTH_CAP - 1  # lists inside the top mapping
    assert parse("a: " + "[" * inside + "]" * inside) is not None
    with pytest.raises(YamlSyntaxError, match=f"nested deeper than {DEPTH_CAP}"):
        parse("a: " + "[" * (inside + 1) + "]" * (inside + 1))


def test_yaml_that_expands_past_the_cap_through_aliases_is_refused() -> None:
    lines = ["l0: &l0 [a, b, c, d, e, f, g, h, i]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 7)]
    with pytest.raises(YamlSyntaxError, match=f"more than {VALUES_CAP} values"):
        parse("\n".join(lines))  # 9 ** 7 = 4.8 million values
    assert parse("\n".join(lines[:5])) is not None  # 9 ** 5 = 59 049


def test_a_long_value_is_described_by_its_size() -> None:
    said = describe("x" * 10_000)
    assert said.startswith("a string of 10000 characters starting 'xxx")
    assert len(said) < 120
    assert brief_list([1, 2]) == "[1, 2]"
    assert brief_list([[1]] * 1000) == "a list of 1000 items"


def test_a_list_of_lists_is_refused_without_printing_it() -> None:
    inner = list(range(100_000))
    value, problem = integers(0)([inner] * 9)
    assert value is None and problem is not None
    assert "a list of 9 items" in problem and len(problem) < 200


def test_sizes_read_as_people_read_them() -> None:
    assert size_text(512) == "512 bytes"
    assert size_text(3 * 1024 * 1024) == "3.0 MiB"
