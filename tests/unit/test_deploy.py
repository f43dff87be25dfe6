"""deploy/k8s: the manifests parse, hang together, and only use options forkd really has.

No Kubernetes runs here, so this is what is checked of them: every document is
valid against Kubernetes' own schemas (``kubernetes-validate``, strict: an unknown
field is an error; ``make lint`` runs its CLI too), selectors match their pods'
labels, the host DaemonSet gets /dev/kvm and the privileges forkd needs, every
flag a container passes to ``forkd`` exists on that command, every secret a
pod reads is defined in the example, and every URL of etcd points at its
Service.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import typer
import yaml

from forkd.cli.main import app

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "k8s"


def documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


def all_documents() -> list[dict[str, Any]]:
    listed = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())["resources"]
    return [d for name in listed for d in documents(name)]


def by_kind(kind: str) -> list[dict[str, Any]]:
    return [d for d in all_documents() if d["kind"] == kind]


def one(kind: str, name: str) -> dict[str, Any]:
    [doc] = [d for d in by_kind(kind) if d["metadata"]["name"] == name]
    return doc


def containers(workload: dict[str, Any]) -> list[dict[str, Any]]:
    spec = workload["spec"]["template"]["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def command_options(*path: str) -> set[str]:
    command: Any = typer.main.get_command(app)
    for word in path:
        command = command.commands[word]  # a group's sub-command (typer's own click group type)
    return {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)}


def forkd_invocations(container: dict[str, Any]) -> list[tuple[list[str], set[str]]]:
    """(subcommand path, flags used) of each forkd command line the container runs."""
    words = [*container.get("command", []), *container.get("args", [])]
    text = " ".join(words)
    if container.get("command", [None])[0] == "/bin/sh":
        found = re.findall(r"forkd ((?:[a-z]+ )+)((?:.|\n)*)", text)
        return [(sub.split(), set(re.findall(r"(?<!\S)--[a-z][a-z-]*", rest))) for sub, rest in found]
    args = container.get("args", [])
    sub = [w for w in args if not w.startswith("-")][:2]
    path = sub[:2] if sub[:1] == ["image"] else sub[:1]
    return [(path, {w for w in args if w.startswith("--")})]


def test_every_document_is_a_kubernetes_object() -> None:
    docs = all_documents()
    assert docs
    for doc in docs:
        assert {"apiVersion", "kind", "metadata"} <= set(doc), doc
        assert doc["metadata"].get("name"), doc
    kinds = {d["kind"] for d in docs}
    assert {"Namespace", "StatefulSet", "DaemonSet", "Deployment", "Service"} <= kinds


def test_selectors_match_their_pods() -> None:
    for workload in [*by_kind("DaemonSet"), *by_kind("Deployment"), *by_kind("StatefulSet")]:
        labels = workload["spec"]["template"]["metadata"]["labels"]
        for key, value in workload["spec"]["selector"]["matchLabels"].items():
            assert labels.get(key) == value, workload["metadata"]["name"]
    pods = [w["spec"]["template"]["metadata"]["labels"]
            for w in [*by_kind("DaemonSet"), *by_kind("Deployment"), *by_kind("StatefulSet")]]
    for service in by_kind("Service"):
        selector = service["spec"]["selector"]
        assert any(all(p.get(k) == v for k, v in selector.items()) for p in pods), service["metadata"]["name"]


def test_hosts_get_kvm_and_the_privileges_forkd_needs() -> None:
    hosts = one("DaemonSet", "forkd-host")
    spec = hosts["spec"]["template"]["spec"]
    assert spec["hostNetwork"] is True
    [daemon] = spec["containers"]
    assert daemon["securityContext"]["privileged"] is True
    mounts = {m["name"]: m["mountPath"] for m in daemon["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert mounts["kvm"] == "/dev/kvm"
    assert volumes["kvm"]["hostPath"] == {"path": "/dev/kvm", "type": "CharDevice"}
    assert mounts["data"] == "/var/lib/forkd" and "hostPath" in volumes["data"]
    assert mounts["netns"] == "/run/netns"


@pytest.mark.parametrize("workload", ["forkd-host", "forkd-gateway"])
def test_every_flag_exists_on_the_forkd_command(workload: str) -> None:
    kind = "DaemonSet" if workload == "forkd-host" else "Deployment"
    seen = 0
    for container in containers(one(kind, workload)):
        for path, flags in forkd_invocations(container):
            assert path, container["name"]
            unknown = flags - command_options(*path)
            assert not unknown, f"{workload}/{container['name']}: forkd {' '.join(path)} has no {unknown}"
            seen += 1
    assert seen


def test_fleet_hosts_are_started_as_fleet_members() -> None:
    [daemon] = one("DaemonSet", "forkd-host")["spec"]["template"]["spec"]["containers"]
    [(path, flags)] = forkd_invocations(daemon)
    assert path == ["daemon"]
    assert {"--host-id", "--etcd", "--advertise-url", "--token-file", "--bind"} <= flags
    [gateway] = one("Deployment", "forkd-gateway")["spec"]["template"]["spec"]["containers"]
    assert forkd_invocations(gateway)[0][0] == ["gateway"]


def test_etcd_urls_point_at_the_etcd_service() -> None:
    service = one("Service", "forkd-etcd")
    client_port = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "client")
    text = "\n".join((DEPLOY / n).read_text() for n in ("hosts.yaml", "gateway.yaml"))
    urls = set(re.findall(r"http://forkd-etcd:(\d+)", text))
    assert urls == {str(client_port)}


def test_secrets_the_pods_read_are_in_the_example() -> None:
    defined = {d["metadata"]["name"]: d for d in documents("secrets.example.yaml")}
    for workload in [*by_kind("DaemonSet"), *by_kind("Deployment")]:
        spec = workload["spec"]["template"]["spec"]
        for volume in spec.get("volumes", []):
            if "secret" in volume:
                assert volume["secret"]["secretName"] in defined
        for container in spec["containers"]:
            for source in container.get("envFrom", []):
                assert source["secretRef"]["name"] in defined
    store = defined["forkd-store"]["stringData"]
    assert {"FORKD_STORE", "AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
            "AWS_REGION"} <= set(store)


# The Kubernetes release whose schemas the manifests are checked against (kubernetes-validate's).
K8S_VERSION = kubernetes_validate.latest_version()


@pytest.mark.parametrize("doc", all_documents(), ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_every_manifest_is_valid_against_kubernetes_own_schema(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_the_schema_check_catches_a_misspelt_field() -> None:
    """So that the check above can fail: a field a Deployment does not have is refused."""
    deployment = one("Deployment", "forkd-gateway")
    broken = {**deployment, "spec": {**deployment["spec"], "replica": 2}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)
