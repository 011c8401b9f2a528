"""Golden files: the correct `orchestrate export` output, byte for byte (issue 42).

Issue 42 computes one worker definition for every launcher and export; its decision is that
the exports stay byte-identical where they were right. Each row of ROWS is an inventory of
golden/inventories/; each is exported in every format of the CLI (cli/export.py's FORMATS:
sbatch, tfjob, trainjob) by the `export` command itself, in-process (click's CliRunner), and the
output is compared with golden/<format>/<job>.<ext>.

| job          | what it covers                                  | sbatch   | tfjob    | trainjob |
| ------------ | ----------------------------------------------- | -------- | -------- | -------- |
| task         | job.task, env, secret_env, --namespace, --pvc   | stored   | stored   | stored   |
| script       | job.script, args, env, secret_env, exit codes   | stored   | stored   | stored   |
| steps        | job.script with steps: (its target)             | stored   | stored   | stored   |
| legacy       | keras: legacy (a script)                        | stored   | stored   | stored   |
| gpus         | slurm: with gpus_per_node (a task)              | stored   | stored   | stored   |
| visible-gpus | hosts' visible_gpus, gpu_memory_growth (a task) | stored   | stored   | stored   |
| ps           | chief, ps, worker, evaluator (PS script), --pvc | stored   | stored   | refused  |
| evaluator    | two workers and an evaluator (a task), --pvc    | stored   | stored   | refused  |
| jax          | keras: jax (a Keras 3 script on JAX)            | stored   | refused  | stored   |

Known drift: a cell whose output is wrong, so no golden file freezes it (none today; issue 42
fixed the four it found: legacy x tfjob had no TF_USE_LEGACY_KERAS; visible-gpus x sbatch asked
Slurm for no GPU and passed no GPU flag; ps and evaluator x sbatch ran every role as a worker).
A row's `drift` names such a cell, and test_the_known_drift_is_still_there fails once it is
fixed: then store its golden file (--update, below) and take it out of the row's `drift`.
Every launcher and export renders one worker definition (engine/workers/launch.py);
test_worker_renderers.py checks that they start the same workers.

Refused, rightly (exit 2, ExportRefused; test_the_refusals_stand checks that they still are):
- ps x trainjob and evaluator x trainjob: a TrainJob's pods are all workers.
- jax x tfjob (issue 57): a TFJob's operator writes TF_CONFIG, not the JAX cluster's variables.
  jax x sbatch and jax x trainjob were refused until their launchers wrote them (from Slurm's
  node list; from the Trainer's jax policy and the pods' names).
ps x sbatch and evaluator x sbatch were refused until issue 45 (roles on Slurm): each task of
the batch script's plan now carries its role, and the launcher writes its TF_CONFIG from it.

The inputs make the output deterministic; nothing is rewritten after the export:
- each inventory is loaded (so validated) from golden/inventories/ and re-rooted at ROOT (its
  path, base_dir and job.script), so a script's absolute path in the sbatch plan does not name
  the checkout's directory;
- the launchers the sbatch script and the TrainingRuntime embed (hostside/slurm_launcher.py and
  hostside/pod_launcher.py, tens of KB, tested in test_slurm_plan.py and
  test_trainjob_export.py) are replaced by short stubs (the modules' LAUNCHER_SOURCE);
  test_the_stubs_stand_where_the_launchers_do checks that nothing else differs.

After an intended change of an export, regenerate every golden file and review the diff:

    .venv/bin/python -m tests.unit.test_export_golden --update
    git diff tests/unit/golden
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from unittest import mock

import pytest
import yaml
from click.testing import CliRunner

from orchestrator.backends.registry import load_inventory
from orchestrator.backends.slurm import script as slurm_script
from orchestrator.cli import export as cli_export
from orchestrator.errors import ExportRefused
from orchestrator.export import trainjob as trainjob_export
from orchestrator.model.inventory import Inventory

REPO = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).with_name("golden")
INVENTORIES = GOLDEN / "inventories"
ROOT = "/srv/golden"  # where the inventories are as the exports see them
FORMATS = cli_export.FORMATS
EXTENSIONS = {"sbatch": "sh", "tfjob": "yaml", "trainjob": "yaml"}
IMAGE = ("--image", "registry.example/train:1")
SECRET = ("--secret", "train-secrets")
PVC = ("--pvc", "ckpt")
SLURM_STUB = "# hostside/slurm_launcher.py: the golden files hold this stub in its place\n"
POD_STUB = "# hostside/pod_launcher.py:\n# the golden files hold this stub in its place\n"
REGENERATE = ".venv/bin/python -m tests.unit.test_export_golden --update"


@dataclass(frozen=True)
class Drift:
    """A cell whose output is wrong today: what is wrong, and whether an output still is."""

    what: str
    still: Callable[[str], bool]


@dataclass(frozen=True)
class Row:
    job: str  # golden/inventories/{job}.yaml
    kubernetes: tuple[str, ...] = IMAGE  # tfjob's and trainjob's options
    drift: Mapping[str, Drift] = field(default_factory=dict)
    refused: Mapping[str, str] = field(default_factory=dict)  # format -> what the refusal says


ROLES_REFUSED = {"trainjob": "a TrainJob's pods are all workers"}
ROWS = (
    Row("task", (*IMAGE, *SECRET, "--namespace", "ml", *PVC)),
    Row("script", (*IMAGE, *SECRET)),
    Row("steps"),
    Row("legacy"),
    Row("gpus"),
    Row("visible-gpus"),
    Row("ps", (*IMAGE, *PVC), refused=ROLES_REFUSED),
    Row("evaluator", (*IMAGE, *PVC), refused=ROLES_REFUSED),
    Row("jax", refused={"tfjob": "job.keras: jax cannot be exported as a TFJob"}),
)
CELLS = [(row, fmt) for row in ROWS for fmt in FORMATS]
STORED = [(r, f) for r, f in CELLS if f not in r.drift and f not in r.refused]
DRIFTING = [(r, f) for r, f in CELLS if f in r.drift]
REFUSED = [(r, f) for r, f in CELLS if f in r.refused]


def golden_path(row: Row, fmt: str) -> Path:
    return GOLDEN / fmt / f"{row.job}.{EXTENSIONS[fmt]}"


def rooted(inventory: Inventory) -> Inventory:
    """The inventory as if its file were in ROOT (the paths the loader made absolute)."""
    real = PurePosixPath(inventory.base_dir)

    def move(path: str) -> str:
        return str(PurePosixPath(ROOT) / PurePosixPath(path).relative_to(real))

    job = inventory.job
    job = replace(job, script=move(job.script) if job.script else None,
                  files=tuple(move(path) for path in job.files))  # fmt: skip
    return replace(inventory, path=move(inventory.path), base_dir=ROOT, job=job)


@contextmanager
def stubbed(stubs: bool = True) -> Iterator[None]:
    """The CLI's export loading re-rooted inventories; with `stubs`, launchers stubbed."""
    with mock.patch.object(cli_export, "load_inventory", lambda path: rooted(load_inventory(path))):
        if not stubs:
            yield
            return
        with mock.patch.object(slurm_script, "LAUNCHER_SOURCE", SLURM_STUB), \
                mock.patch.object(trainjob_export, "LAUNCHER_SOURCE", POD_STUB):  # fmt: skip
            yield


def export(row: Row, fmt: str, *, stubs: bool = True) -> tuple[str, BaseException | None]:
    """`orchestrate export INVENTORY --format FMT ...`'s stdout, and what it raised if it did."""
    options = () if fmt == "sbatch" else row.kubernetes
    args = [str(INVENTORIES / f"{row.job}.yaml"), "--format", fmt, *options]
    with stubbed(stubs):
        result = CliRunner().invoke(cli_export.export, args)
    raised = result.exception if result.exit_code != 0 else None
    return result.stdout, raised


def command(row: Row, fmt: str) -> str:
    options = "" if fmt == "sbatch" else " " + " ".join(row.kubernetes)
    return (
        f"orchestrate export {INVENTORIES.relative_to(REPO)}/{row.job}.yaml --format {fmt}{options}"
    )


def cell_id(cell: tuple[Row, str]) -> str:
    return f"{cell[0].job}-{cell[1]}"


@pytest.mark.parametrize("cell", STORED, ids=cell_id)
def test_the_export_is_its_golden_file(cell: tuple[Row, str]) -> None:
    row, fmt = cell
    path = golden_path(row, fmt)
    output, raised = export(row, fmt)
    assert raised is None, f"{command(row, fmt)} failed: {raised!r}"
    if not path.exists():
        pytest.fail(f"{path.relative_to(REPO)} is missing; write it with: {REGENERATE}")
    expected = path.read_bytes().decode("utf-8")  # bytes: no newline translation
    if output != expected:
        diff = list(difflib.unified_diff(expected.splitlines(), output.splitlines(),
                                         "golden", "today", lineterm="", n=2))  # fmt: skip
        shown = "\n".join(diff[:60]) + ("\n..." if len(diff) > 60 else "")
        pytest.fail(
            f"{path.relative_to(REPO)} is no longer what `{command(row, fmt)}` "
            f"prints (issue 42: exports stay byte-identical where they were right).\n{shown}\n"
            f"If the change is intended, regenerate with: {REGENERATE} and review the diff.",
            pytrace=False,
        )


def test_the_known_drift_is_still_there() -> None:
    """One test over every drifting cell (none today: a parametrized test would be skipped)."""
    for row, fmt in DRIFTING:
        output, raised = export(row, fmt)
        assert raised is None, f"{command(row, fmt)} failed: {raised!r}"
        assert row.drift[fmt].still(output), (
            f"{row.job} x {fmt} ({row.drift[fmt].what}) looks fixed: check the output, remove "
            f"the drift from its row in {Path(__file__).name} and its docstring, then: "
            f"{REGENERATE}"
        )
        assert not golden_path(row, fmt).exists(), "a known drift has no golden file"


@pytest.mark.parametrize("cell", REFUSED, ids=cell_id)
def test_the_refusals_stand(cell: tuple[Row, str]) -> None:
    row, fmt = cell
    output, raised = export(row, fmt)
    assert isinstance(raised, ExportRefused) and raised.exit_code == 2, raised
    assert row.refused[fmt] in raised.message and output == ""
    assert not golden_path(row, fmt).exists(), "a refused export has no golden file"


def test_the_golden_folders_hold_the_tables_files_and_no_other() -> None:
    stored = {golden_path(row, fmt) for row, fmt in STORED}
    found = {path for fmt in FORMATS for path in (GOLDEN / fmt).glob("*")}
    assert found == stored, f"stale or missing golden files; regenerate with: {REGENERATE}"
    assert {p.stem for p in INVENTORIES.glob("*.yaml")} == {row.job for row in ROWS}


def test_the_stubs_stand_where_the_launchers_do() -> None:
    slurm = next(row for row in ROWS if row.job == "gpus")
    sbatch, _ = export(slurm, "sbatch")
    assert sbatch.count(SLURM_STUB) == 1
    real = sbatch.replace(SLURM_STUB.rstrip("\n"), slurm_script.LAUNCHER_SOURCE.rstrip("\n"))
    assert export(slurm, "sbatch", stubs=False)[0] == real
    stubbed_documents = list(yaml.safe_load_all(export(slurm, "trainjob")[0]))
    spec = stubbed_documents[0]["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]
    container = spec["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][-1] == POD_STUB
    container["command"][-1] = trainjob_export.LAUNCHER_SOURCE
    assert list(yaml.safe_load_all(export(slurm, "trainjob", stubs=False)[0])) == (
        stubbed_documents
    )


def update() -> None:
    """Write every stored cell's golden file and remove the folders' other files."""
    wanted = {golden_path(row, fmt) for row, fmt in STORED}
    for row, fmt in STORED:
        output, raised = export(row, fmt)
        if raised is not None:
            raise SystemExit(f"{command(row, fmt)} failed: {raised!r}")
        path = golden_path(row, fmt)
        path.parent.mkdir(parents=True, exist_ok=True)
        old = path.read_bytes() if path.exists() else None
        if old != output.encode("utf-8"):
            path.write_bytes(output.encode("utf-8"))
            print(f"{'wrote' if old is None else 'updated'} {path}")
    for fmt in FORMATS:
        for path in sorted((GOLDEN / fmt).glob("*")):
            if path not in wanted:
                path.unlink()
                print(f"removed {path}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        raise SystemExit(f"usage: {REGENERATE}")
    update()
