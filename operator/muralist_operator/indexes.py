"""kopf's in-memory indexes of the DiffusionJobs and their children, as the operator reads them.

handlers.py registers one kopf index per `Index`, under that name (the handler's id), and kopf
hands every handler each index by that name; `Indexes` keeps them and reads them from the
operator's own threads (the clock's reconciles, the progress endpoint). One name in one place: a
name the handlers registered and the reader did not know (or the other way round) would read as
an empty index, never as an error (tests/unit/operator/test_handlers.py checks kopf's registry
against `Index`).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

Key = tuple[str, str]  # (namespace, name): a DiffusionJob's, or a pod's (POD_INFO)


class Index(enum.StrEnum):
    """Each index by its name, and what it maps a key to."""

    DIFFUSION_JOBS = "muralist_diffusionjobs"  # a DiffusionJob -> True
    JOBS = "muralist_jobs"  # a DiffusionJob -> its Jobs (observe.JobView)
    PODS = "muralist_pods"  # a Job (named as its DiffusionJob) -> its worker pods (observe.PodView)
    POD_INFO = "muralist_pod_info"  # a pod, by its own name -> who may post progress (progress.auth.PodInfo)
    SERVICES = "muralist_services"  # a DiffusionJob -> its Services (observe.ChildView)
    CONFIG_MAPS = "muralist_config_maps"  # ... its ConfigMaps
    NETWORK_POLICIES = "muralist_network_policies"  # ... its NetworkPolicies


# What a job owns besides its Job: each is created again when it is gone.
CHILD_INDEXES = (Index.SERVICES, Index.CONFIG_MAPS, Index.NETWORK_POLICIES)


class Indexes:
    """The indexes kopf hands to its handlers, kept to be read from other threads."""

    def __init__(self) -> None:
        self.stores: dict[Index, Mapping[Any, Any]] = {}
        self.listed = False

    def remember(self, kwargs: Mapping[str, Any], listed: bool = True) -> None:
        """kopf hands its indexes to every handler. It runs the first resource handler only once
        every index is filled from its first listing: from then on `listed` holds."""
        for index in Index:
            if index in kwargs:
                self.stores[index] = kwargs[index]
        self.listed = self.listed or listed

    def has(self, *indexes: Index) -> bool:
        return all(index in self.stores for index in indexes)

    def values(self, index: Index, key: Any) -> list[Any]:
        """What `index` holds under `key` (nothing while kopf has not handed it over)."""
        store = self.stores.get(index)
        if store is None:
            return []
        for _ in range(3):  # kopf changes its indexes on its own thread
            try:
                return list(store.get(key, ())) if key in store else []
            except RuntimeError:
                continue
        return []
