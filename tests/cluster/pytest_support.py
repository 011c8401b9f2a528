"""pytest glue for NamespaceCluster: the session's shared cluster and the one skip reason.

The tests of every module that needs namespace hosts share one cluster for the whole session
(tests/conftest.py's `namespace_hosts`; their lane runs in one process): each module asks for
as many hosts as it needs, and gets them reset, not rebuilt:

    @pytest.fixture(scope="module")
    def cluster(namespace_hosts: SharedCluster) -> NamespaceCluster:
        return namespace_hosts.hosts(2)

A test that builds clusters of its own (the subnet is one per machine) first calls
`namespace_hosts.free_subnet()`; the next module that asks builds the shared one again.
"""

from __future__ import annotations

import copy
from collections.abc import Generator
from pathlib import Path

import pytest

from tests import phase_log
from tests.cluster.netns import DEFAULT_PREFIX, NamespaceCluster, cleanup_leftovers
from tests.cluster.netns import unavailable_reason as _unavailable_reason

# Evaluated once at import: root and the tools don't change during a run.
NETNS_UNAVAILABLE = _unavailable_reason()

requires_netns = pytest.mark.skipif(
    NETNS_UNAVAILABLE is not None, reason=NETNS_UNAVAILABLE or "netns cluster available"
)

SHARED_HOSTS = 3  # the most any module uses


class SharedCluster:
    """One started cluster of SHARED_HOSTS hosts, built at the first request; `stop()` at the
    session's end (or `free_subnet()`) tears it down."""

    def __init__(self, base_dir: Path) -> None:
        # World-traversable (0755): another user's sshd session reads authorized_keys in it.
        self.base_dir = base_dir
        self._cluster: NamespaceCluster | None = None
        self.builds = 0

    def hosts(self, count: int) -> NamespaceCluster:
        """The first `count` hosts of the shared cluster, reset (NamespaceCluster.reset): a
        view of it whose `hosts` are those (never stop it: the session does)."""
        if NETNS_UNAVAILABLE is not None:
            pytest.skip(NETNS_UNAVAILABLE)
        if not 1 <= count <= SHARED_HOSTS:
            raise ValueError(f"the shared cluster has {SHARED_HOSTS} hosts, not {count}")
        if self._cluster is None:
            cleanup_leftovers(DEFAULT_PREFIX)  # a crashed earlier run would hold the subnet
            cluster = NamespaceCluster(SHARED_HOSTS, base_dir=self.base_dir / str(self.builds))
            self.builds += 1
            with phase_log.phase("cluster", f"namespace hosts, build {self.builds}"):
                self._cluster = cluster.start()
        else:
            self._cluster.reset()
        view = copy.copy(self._cluster)
        view.hosts = self._cluster.hosts[:count]
        return view

    def free_subnet(self) -> None:
        """Tear the shared cluster down, for a test that builds its own on the same subnet."""
        if self._cluster is not None:
            cluster, self._cluster = self._cluster, None
            cluster.stop()

    def stop(self) -> None:
        self.free_subnet()


def namespace_cluster_fixture(
    count: int = 2, *, base_dir: Path, prefix: str = DEFAULT_PREFIX
) -> Generator[NamespaceCluster, None, None]:
    """Yield a started cluster of `count` hosts of its own; always tear it down, even if the
    test fails (test_netns_cluster.py checks the builder itself with it).

    Skips (not fails) when the machine can't build one. Removes leftovers of crashed earlier
    runs with the same prefix first: they would hold the subnet and make `start()` fail.
    """
    if NETNS_UNAVAILABLE is not None:
        pytest.skip(NETNS_UNAVAILABLE)
    cleanup_leftovers(prefix)
    cluster = NamespaceCluster(count, prefix, base_dir=base_dir)
    try:
        with phase_log.phase("cluster", f"namespace hosts of a test's own ({count})"):
            cluster.start()
        yield cluster
    finally:
        # stop() is idempotent and also removes what a half-finished start() left.
        cluster.stop()
