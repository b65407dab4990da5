"""Worlds that span pods restart together.

A context-parallel group larger than a pod spans `contract.pods_per_world` pods, and only
those meet (one torchrun world). When one of them fails, the others would wait in a collective
until `collectiveTimeoutSeconds` and fail on their own; the Job would retry the failed one
into a world whose other members are gone. So the operator stops the others at once (the Job
retries each, like any failure): the world starts again, together. Pods of a world of one pod
(every other layout) are never touched.

Only a failure of the pod's own is passed on, not one the operator caused (a stopped peer
would stop the others' new pods in turn), and only to pods that started before it failed.
"""

from __future__ import annotations

from dataclasses import dataclass

from muralist_api import contract
from muralist_api.job import Parallelism

from muralist_operator.decision import REASON_WORLD_FAILED
from muralist_operator.observe import ByIndex, PodView, by_index


@dataclass(frozen=True)
class PeerStop:
    pod: PodView
    failed: PodView  # the world's pod that failed

    @property
    def note(self) -> str:
        return f"index {self.failed.index} of its world (pod {self.failed.name}) failed"


def pods_per_world(par: Parallelism) -> int:
    return contract.pods_per_world(par.group_size, par.resolved_processes_per_node)


def peers_to_stop(par: Parallelism, pods: list[PodView], indexes: ByIndex | None = None) -> list[PeerStop]:
    """`indexes`: by_index(pods), when the caller has it already."""
    k = pods_per_world(par)
    if k == 1:
        return []
    latest = {i: s.newest for i, s in (by_index(pods) if indexes is None else indexes).items()}
    found: list[PeerStop] = []
    for index, pod in sorted(latest.items()):
        if not pod.counted_failure or pod.stop_reason == REASON_WORLD_FAILED:
            continue
        first = index // k * k
        for peer_index in range(first, first + k):
            peer = latest.get(peer_index)
            if peer is None or peer_index == index or peer.terminal or peer.deleting:
                continue
            if pod.finished and peer.created and peer.created > pod.finished:
                continue  # started after the failure: the world is already starting again
            found.append(PeerStop(peer, pod))
    unique = {s.pod.name: s for s in found}
    return sorted(unique.values(), key=lambda s: s.pod.index)
