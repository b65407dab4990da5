"""Which replica reconciles, as kopf decides it, readable outside kopf.

With `--peering`, replicas keep an entry each (priority, lifetime, last seen) in a
(Cluster)KopfPeering object, and kopf pauses a replica's watches while another live replica has
a higher priority, or the same (kopf/_core/engines/peering.py, `process_peering_event`). kopf
does not expose that pause, and the operator's own threads (the clock, the progress endpoint)
must honour it too: `Peering` reads the object now and then and applies the same rule
(`outranked_by`). tests/unit/operator/test_peering.py runs the installed kopf's rule over the
same tables, so a kopf whose rule changed fails there, not in a cluster.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from muralist_operator.decision import parse_time

log = logging.getLogger("muralist.operator.peering")

KOPF_GROUP, KOPF_VERSION = "kopf.dev", "v1"
DEFAULT_LIFETIME = 60
REFRESH_SECONDS = 5.0


def outranked_by(peers: Mapping[str, Any], identity: str, priority: int, now: datetime) -> list[str]:
    """The live peers that pause `identity`: a higher priority, or the same (kopf pauses both)."""
    found = []
    for other, info in peers.items():
        if other == identity or not isinstance(info, Mapping):
            continue
        try:
            their = int(info.get("priority", 0))
            lifetime = int(info.get("lifetime", DEFAULT_LIFETIME))
        except (TypeError, ValueError):
            continue
        seen = parse_time(info.get("lastseen")) or now  # kopf: no lastseen means "just now"
        if seen + timedelta(seconds=lifetime) <= now:
            continue  # dead: kopf ignores it (and cleans it up)
        if their >= priority:
            found.append(other)
    return sorted(found)


class Peering:
    """`active()`: whether this replica reconciles now. Standalone (no peering name): always."""

    def __init__(self, custom_api: Any, name: str | None, identity: str, priority: int,
                 namespaces: list[str] | None = None, refresh: float = REFRESH_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._api = custom_api
        self.name, self.identity, self.priority = name, identity, priority
        self.namespaces = namespaces or []
        self.refresh_seconds = refresh
        self._clock = clock
        self._active = name is None
        self._checked: float | None = None
        self._lock = threading.Lock()
        self.listeners: list[Callable[[bool], None]] = []

    @property
    def standalone(self) -> bool:
        return self.name is None

    def _peers(self) -> list[Mapping[str, Any]]:
        if not self.namespaces:
            obj = self._api.get_cluster_custom_object(KOPF_GROUP, KOPF_VERSION, "clusterkopfpeerings", self.name)
            return [obj.get("status") or {}]
        return [(self._api.get_namespaced_custom_object(KOPF_GROUP, KOPF_VERSION, ns, "kopfpeerings", self.name)
                 .get("status") or {}) for ns in self.namespaces]

    def check(self) -> bool:
        """Read the peering object(s) again and return the verdict; on an error keep the last one."""
        if self.standalone:
            return True
        now = datetime.now(UTC)
        try:
            blockers = sorted({p for peers in self._peers()
                               for p in outranked_by(peers, self.identity, self.priority, now)})
        except Exception as e:  # the API server away: keep the last verdict, kopf does the same
            log.warning("cannot read peering %s: %s", self.name, e)
            return self._active
        active = not blockers
        with self._lock:
            changed, self._active, self._checked = active != self._active, active, self._clock()
        if changed:
            log.info("this replica is %s", "active" if active else f"on standby (outranked by {', '.join(blockers)})")
            for listener in self.listeners:
                try:
                    listener(active)
                except Exception:
                    log.exception("a peering listener failed")
        return active

    def active(self) -> bool:
        """The last verdict, without blocking (the progress endpoint asks on every post); the
        clock thread calls `check` every `refresh_seconds`. Before the first check a peered
        replica is on standby."""
        return self.standalone or self._active

    def due(self) -> bool:
        checked = self._checked
        return not self.standalone and (checked is None or self._clock() - checked >= self.refresh_seconds)
