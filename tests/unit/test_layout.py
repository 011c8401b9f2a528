"""docs/design.md's map of the folders is the tree: every module of orchestrator/ is listed in
its folder's row, and every listed module exists; every module of worker/ is named in the
worker's paragraph."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROW = re.compile(r"^\| `(orchestrator/[a-z/]*)` \| .* \| ([a-z_, ]+) \|$")


def listed() -> dict[str, set[str]]:
    text = (REPO / "docs" / "design.md").read_text(encoding="utf-8")
    section = text.split("## Map", 1)[1].split("\n## ", 1)[0]
    rows = (ROW.match(line) for line in section.splitlines())
    return {m[1]: {name.strip() for name in m[2].split(",")} for m in rows if m}


def in_tree() -> dict[str, set[str]]:
    folders: dict[str, set[str]] = {}
    for path in (REPO / "orchestrator").rglob("*.py"):
        folder = path.parent.relative_to(REPO).as_posix() + "/"
        folders.setdefault(folder, set())
        if path.name not in ("__init__.py", "__main__.py"):
            folders[folder].add(path.stem)
    # A folder that holds only its parts (engine/: start/, supervision/, ...) has no row of its
    # own: its parts' rows say it.
    return {folder: modules for folder, modules in folders.items() if modules}


def test_the_design_map_lists_every_module_of_every_folder() -> None:
    assert listed() == in_tree()


def test_every_test_module_has_its_own_name() -> None:
    # pytest imports test files by basename (tests/ has no packages): a second test_x.py in
    # another folder stops the whole collection with "import file mismatch".
    seen: dict[str, list[str]] = {}
    for path in (REPO / "tests").rglob("test_*.py"):
        seen.setdefault(path.name, []).append(path.relative_to(REPO).as_posix())
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}


def test_the_design_map_names_every_worker_module() -> None:
    text = (REPO / "docs" / "design.md").read_text(encoding="utf-8")
    section = text.split("## Map", 1)[1].split("\n## ", 1)[0]
    worker = section.split("Worker (`worker/`", 1)[1].split("\n### ", 1)[0]
    named = set(re.findall(r"`([a-z_]+)`", worker))
    modules = {p.stem for p in (REPO / "worker").glob("*.py")} - {"__init__", "__main__"}
    assert modules - named == set()
