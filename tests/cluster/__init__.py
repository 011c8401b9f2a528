"""Multi-host test clusters on one Linux machine (network namespaces + bridge + sshd per host).

See tests/cluster/netns.py for the design and `python -m tests.cluster --help` for the CLI.
"""

from tests.cluster.netns import (
    ClusterError,
    ClusterHost,
    NamespaceCluster,
    cleanup_leftovers,
    unavailable_reason,
)

__all__ = [
    "ClusterError",
    "ClusterHost",
    "NamespaceCluster",
    "cleanup_leftovers",
    "unavailable_reason",
]
