"""Which replica reconciles: kopf's peering rule, read from the peering object (a table)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from muralist_operator.peering import Peering, outranked_by

from tests.views import NOW


def peer(priority: int, seen_ago: float = 0, lifetime: int = 60) -> dict[str, Any]:
    return {"priority": priority, "lifetime": lifetime, "lastseen": (NOW - timedelta(seconds=seen_ago)).isoformat()}


@pytest.mark.parametrize(
    ("peers", "expected"),
    [
        ({}, []),
        ({"me": peer(50)}, []),  # only ourselves
        ({"me": peer(50), "b": peer(10)}, []),  # a lower priority stands by
        ({"me": peer(50), "b": peer(90)}, ["b"]),  # a higher one reconciles
        ({"me": peer(50), "b": peer(50)}, ["b"]),  # the same: kopf pauses both
        ({"me": peer(50), "b": peer(90, seen_ago=61)}, []),  # dead (lifetime passed): ignored
        ({"me": peer(50), "b": peer(90, seen_ago=30)}, ["b"]),
        ({"me": peer(50), "b": {"priority": 90}}, ["b"]),  # no lastseen: kopf takes "now"
        ({"me": peer(50), "b": "garbage", "c": {"priority": "x"}}, []),
    ],
    ids=["empty", "alone", "lower", "higher", "same", "dead", "alive", "no-lastseen", "malformed"],
)
def test_outranked_by(peers: dict[str, Any], expected: list[str]) -> None:
    assert outranked_by(peers, "me", 50, NOW) == expected


class FakeCustom:
    def __init__(self, status: dict[str, Any]) -> None:
        self.status, self.reads = status, 0

    def get_cluster_custom_object(self, group: str, version: str, plural: str, name: str) -> dict[str, Any]:
        assert (group, plural, name) == ("kopf.dev", "clusterkopfpeerings", "muralist")
        self.reads += 1
        return {"status": self.status}


def test_a_standby_replica_becomes_active_when_the_other_goes() -> None:
    from datetime import UTC, datetime

    now = datetime.now(UTC)
    api = FakeCustom({"me": {"priority": 5}, "other": {"priority": 9, "lastseen": now.isoformat(), "lifetime": 60}})
    peering = Peering(api, "muralist", "me", 5)
    seen: list[bool] = []
    peering.listeners.append(seen.append)
    assert not peering.active() and peering.due()  # standby until the first check
    assert peering.check() is False and not peering.active() and not peering.due()
    del api.status["other"]
    assert peering.check() is True and peering.active()
    assert seen == [True]  # one change, one call
    assert Peering(api, None, "me", 5).active()  # standalone: always


# -- the same rule as the installed kopf applies it: fails when kopf's rule changes


def _kopf_pauses(peers: dict[str, Any], identity: str, priority: int) -> bool:
    """Whether kopf (its private peering engine, as installed) pauses `identity` on this table."""
    import asyncio

    import kopf
    from kopf._cogs.aiokits.aiotoggles import Toggle
    from kopf._core.engines.peering import Identity, process_peering_event

    async def decide() -> bool:
        settings = kopf.OperatorSettings()
        settings.peering.name, settings.peering.priority = "muralist", priority
        paused = Toggle(False)
        awake = asyncio.Event()
        awake.set()  # kopf then sleeps not at all before it returns
        event = {"type": "MODIFIED", "object": {"metadata": {"name": "muralist"}, "status": peers}}
        await process_peering_event(raw_event=event, namespace=None, resource=None,  # type: ignore[arg-type]
                                    identity=Identity(identity), settings=settings, autoclean=False,
                                    stream_pressure=awake, conflicts_found=paused)
        return paused.is_on()

    return asyncio.run(decide())


@pytest.mark.parametrize(
    "table",
    [
        {},
        {"me": {"priority": 50}},
        {"me": {"priority": 50}, "b": {"priority": 10, "lifetime": 60, "seen_ago": 0}},
        {"me": {"priority": 50}, "b": {"priority": 90, "lifetime": 60, "seen_ago": 0}},
        {"me": {"priority": 50}, "b": {"priority": 50, "lifetime": 60, "seen_ago": 0}},
        {"me": {"priority": 50}, "b": {"priority": 90, "lifetime": 60, "seen_ago": 61}},
        {"me": {"priority": 50}, "b": {"priority": 90, "lifetime": 60, "seen_ago": 30}},
        {"me": {"priority": 50}, "b": {"priority": 90}},
        {"me": {"priority": 50}, "b": {"priority": 50, "lifetime": 5, "seen_ago": 10}, "c": {"priority": 40}},
        {"me": {"priority": 50}, "b": {"priority": 51, "lifetime": 120, "seen_ago": 90}},
    ],
    ids=["empty", "alone", "lower", "higher", "same", "dead", "alive", "no-lastseen", "dead-same-and-lower",
         "higher-long-lived"],
)
def test_our_rule_is_the_installed_kopfs(table: dict[str, dict[str, int]]) -> None:
    """outranked_by re-implements kopf's pause (kopf/_core/engines/peering.py, process_peering_event),
    which kopf does not expose: the operator's own threads must pause with kopf's watches."""
    from datetime import UTC, datetime

    now = datetime.now(UTC)
    peers: dict[str, Any] = {}
    for name, info in table.items():
        entry: dict[str, Any] = {k: v for k, v in info.items() if k != "seen_ago"}
        if "seen_ago" in info:
            entry["lastseen"] = (now - timedelta(seconds=info["seen_ago"])).isoformat()
        peers[name] = entry
    assert bool(outranked_by(peers, "me", 50, now)) == _kopf_pauses(peers, "me", 50)
