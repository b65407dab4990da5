"""The client's configuration: the kubeconfig's context and namespace, and a namespace clash refused
before anything is sent (no API server here: nothing in these tests reaches one)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from muralist import Client

from tests.builders import make_job


def kubeconfig(tmp_path: Path) -> Path:
    cluster = {"name": "lab", "cluster": {"server": "https://127.0.0.1:1"}}
    contexts = [{"name": "team", "context": {"cluster": "lab", "user": "me", "namespace": "team-a"}},
                {"name": "plain", "context": {"cluster": "lab", "user": "me"}}]
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "clusters": [cluster], "contexts": contexts,
                                    "users": [{"name": "me", "user": {"token": "t"}}], "current-context": "team"}))
    return path


def test_the_namespace_is_the_contexts_unless_given(tmp_path: Path) -> None:
    config = kubeconfig(tmp_path)
    assert Client(kubeconfig=config).namespace == "team-a"
    assert Client(kubeconfig=config, context="plain").namespace == "default"
    assert Client(kubeconfig=config, namespace="mine").namespace == "mine"
    with pytest.raises(ValueError, match="no context 'other'"):
        Client(kubeconfig=config, context="other")


def test_a_manifest_naming_another_namespace_than_the_one_given_is_refused(tmp_path: Path) -> None:
    client = Client(kubeconfig=kubeconfig(tmp_path), namespace="mine")
    with pytest.raises(ValueError, match="namespace theirs is not the client's mine"):
        client.create(make_job("cats", namespace="theirs").obj())


def test_without_a_kubeconfig_outside_a_pod_both_reasons_are_given(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from kubernetes.config import ConfigException, kube_config

    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(tmp_path / "none"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ConfigException, match=r"no kubeconfig \(.*\) and not in a pod \(.*\); pass --kubeconfig"):
        Client()
