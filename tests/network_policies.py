"""Which pods a NetworkPolicy selects, and which it lets in, asked of the API server itself.

The test control plane has no network plugin to enforce a policy, so the tests check what a
plugin would be handed: every selector of the policy becomes a label-selector query (list pods,
list namespaces), and the API server's own label matching says which pods it names. The rules
of the NetworkPolicy API applied here: a policy selects pods of its own namespace; a peer with a
podSelector alone names pods of the policy's namespace, with a namespaceSelector too, pods of the
namespaces it selects; an ingress rule without `from` admits anyone, one without `ports`
every port. For egress (`egress_denied`, what tests/progress_poster.py obeys), only what a
destination outside the cluster needs: a pod selected by a policy with Egress in its
policyTypes may connect only where an egress rule without `to` lets it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kubernetes import client

Pod = tuple[str, str]  # (namespace, name)
ANYONE = "anyone"


def label_selector(selector: dict[str, Any]) -> str:
    """A LabelSelector (matchLabels, matchExpressions) as the query string of a list call."""
    terms = [f"{key}={value}" for key, value in (selector.get("matchLabels") or {}).items()]
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        terms.append({"In": f"{key} in ({','.join(values)})", "NotIn": f"{key} notin ({','.join(values)})",
                      "Exists": key, "DoesNotExist": f"!{key}"}[op])
    return ",".join(terms)


def pods_matching(core_v1: Any, namespaces: Iterable[str], selector: dict[str, Any]) -> set[Pod]:
    query = label_selector(selector)
    return {(ns, p.metadata.name) for ns in namespaces
            for p in core_v1.list_namespaced_pod(ns, label_selector=query).items}


def selected(core_v1: Any, policy: dict[str, Any]) -> set[Pod]:
    """The pods the policy applies to."""
    return pods_matching(core_v1, [policy["metadata"]["namespace"]], policy["spec"]["podSelector"])


def _port_matches(rule: dict[str, Any], port: int | None) -> bool:
    return port is None or not rule.get("ports") or any(p.get("port") == port for p in rule["ports"])


def admitted(core_v1: Any, policy: dict[str, Any], among: Iterable[str], port: int | None = None) -> set[Pod] | str:
    """The pods, of the namespaces `among` (the test's own: a shared control plane has others),
    that the policy's ingress rules let connect (to `port`, or to any port when None); ANYONE
    when a rule names no peers."""
    among = set(among)
    found: set[Pod] = set()
    for rule in policy["spec"].get("ingress") or []:
        if not _port_matches(rule, port):
            continue
        if "from" not in rule:
            return ANYONE
        for peer in rule["from"]:
            assert "ipBlock" not in peer, f"an ipBlock cannot be checked by labels: {peer}"
            if "namespaceSelector" in peer:
                query = label_selector(peer["namespaceSelector"])
                namespaces = {n.metadata.name for n in core_v1.list_namespace(label_selector=query).items} & among
            else:
                namespaces = {policy["metadata"]["namespace"]} & among
            found |= pods_matching(core_v1, namespaces, peer.get("podSelector") or {})
    return found


def egress_denied(core_v1: Any, namespace: str, pod: str, port: int | None = None) -> bool:
    """Whether the policies of the pod's namespace deny it a connection to an address outside the
    cluster (the operator of these tests listens on this machine): a policy with Egress in its
    policyTypes selects it, and none of those policies has an egress rule without `to` (for `port`)."""
    networking = client.NetworkingV1Api(core_v1.api_client)
    limiting = [p for p in (core_v1.api_client.sanitize_for_serialization(raw)
                            for raw in networking.list_namespaced_network_policy(namespace).items)
                if "Egress" in (p["spec"].get("policyTypes") or []) and (namespace, pod) in selected(core_v1, p)]
    if not limiting:
        return False
    return not any("to" not in rule and _port_matches(rule, port)
                   for policy in limiting for rule in policy["spec"].get("egress") or [])
