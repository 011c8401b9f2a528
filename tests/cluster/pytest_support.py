"""pytest glue for NamespaceCluster: a fixture body and the one skip reason.

Wire it into a conftest like this:

    from tests.cluster.pytest_support import namespace_cluster_fixture

    @pytest.fixture
    def netns_cluster(tmp_path: Path) -> Iterator[NamespaceCluster]:
        yield from namespace_cluster_fixture(2, base_dir=tmp_path / "cluster")
"""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path

import pytest

from tests.cluster.netns import DEFAULT_PREFIX, NamespaceCluster, cleanup_leftovers
from tests.cluster.netns import unavailable_reason as _unavailable_reason

# Evaluated once at import: root and the tools don't change during a run.
NETNS_UNAVAILABLE = _unavailable_reason()

requires_netns = pytest.mark.skipif(
    NETNS_UNAVAILABLE is not None, reason=NETNS_UNAVAILABLE or "netns cluster available"
)


def namespace_cluster_fixture(
    count: int = 2, *, base_dir: Path, prefix: str = DEFAULT_PREFIX
) -> Generator[NamespaceCluster, None, None]:
    """Yield a started cluster of `count` hosts; always tear it down, even if the test fails.

    Skips (not fails) when the machine can't build one. Removes leftovers of crashed earlier
    runs with the same prefix first: they would hold the subnet and make `start()` fail.
    """
    if NETNS_UNAVAILABLE is not None:
        pytest.skip(NETNS_UNAVAILABLE)
    cleanup_leftovers(prefix)
    cluster = NamespaceCluster(count, prefix, base_dir=base_dir)
    try:
        cluster.start()
        yield cluster
    finally:
        # stop() is idempotent and also removes what a half-finished start() left.
        cluster.stop()
