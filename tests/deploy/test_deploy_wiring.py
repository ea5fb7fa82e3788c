"""deploy/k8s: the names that tie the objects together agree (Service, selectors, ports, the workers'
master, REMOTE_WORKERS and replicas), every suite pod runs as deploy/Dockerfile's user, and the image tag
is the suite's version (a master refuses workers of another version)."""

from __future__ import annotations

import re
from importlib.metadata import version
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
from k8s_manifests import (
    K8S,
    KUSTOMIZATION,
    REPO,
    build,
    buildable_dirs,
    containers,
    kubectl,
    load,
    one,
    pod_labels,
    pod_spec,
    rel,
)

from gpu_sampler.__main__ import parse_args as sampler_parse_args
from loadtest.commands.main import build_parser

pytestmark = pytest.mark.skipif(
    kubectl() is None, reason="kubectl not found: its kustomize builds are not checked"
)
SUITE_UID = 10001  # the user deploy/Dockerfile creates
IMAGE_WORKDIR = "/app"  # its WORKDIR
RUNS = [K8S / "base", K8S / "examples" / "simulator", K8S / "overlays" / "three-workers"]  # they start a run


def simulator_parser() -> Any:
    """simulator.front.cli's parser, imported when a test runs: it imports aiohttp, which imports names from
    ssl that gevent cannot patch once Locust (imported by other test modules at collection) patches."""
    from simulator.front.cli import build_parser

    return build_parser()


def _id(path: Path) -> str:
    return rel(path)


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def _container(obj: dict[str, Any], name: str) -> dict[str, Any]:
    spec = pod_spec(obj)
    assert spec is not None
    (found,) = [c for c in spec["containers"] if c["name"] == name]
    return found


def _run_args(objs: tuple[dict[str, Any], ...], owner: str) -> Any:
    (c,) = [c for c in containers(objs) if c.owner == owner]
    return build_parser().parse_args(c.spec["command"][3:] + c.args)


def test_runs_are_every_folder_with_a_master() -> None:
    with_master = [d for d in buildable_dirs() if any(o["kind"] == "Job" for o in build(d))]
    assert with_master == RUNS


@pytest.mark.parametrize("folder", RUNS, ids=_id)
def test_service_selects_the_master_and_only_it(folder: Path) -> None:
    objs = build(folder)
    service = one(objs, "Service", "ocr-capacity")
    selector = service["spec"]["selector"]
    master, worker = one(objs, "Job", "ocr-capacity-master"), one(objs, "Deployment", "ocr-capacity-worker")
    assert _selects(selector, pod_labels(master)) and not _selects(selector, pod_labels(worker))
    policy = one(objs, "NetworkPolicy", "ocr-capacity-master")["spec"]
    assert _selects(policy["podSelector"]["matchLabels"], pod_labels(master))
    (rule,) = policy["ingress"]
    (source,) = rule["from"]
    assert _selects(source["podSelector"]["matchLabels"], pod_labels(worker))
    assert not _selects(source["podSelector"]["matchLabels"], pod_labels(master))


@pytest.mark.parametrize("folder", buildable_dirs(), ids=_id)
def test_selectors_match_their_pods(folder: Path) -> None:
    for obj in build(folder):
        if obj["kind"] in ("Deployment", "DaemonSet"):
            selector = obj["spec"]["selector"]["matchLabels"]
            assert selector and _selects(selector, pod_labels(obj)), (
                f"{obj['kind']}/{obj['metadata']['name']}"
            )
        if obj["kind"] == "Service":  # any Service built selects some pod of the same build
            assert any(_selects(obj["spec"]["selector"], pod_labels(o)) for o in build(folder) if pod_spec(o))


@pytest.mark.parametrize("folder", RUNS, ids=_id)
def test_ports_and_master_address_agree(folder: Path) -> None:
    objs = build(folder)
    run = _run_args(objs, "Job/ocr-capacity-master")
    worker = _run_args(objs, "Deployment/ocr-capacity-worker")
    (port,) = one(objs, "Service", "ocr-capacity")["spec"]["ports"]
    master = _container(one(objs, "Job", "ocr-capacity-master"), "master")
    named = {p["name"]: p["containerPort"] for p in master["ports"]}
    assert port["port"] == run.master_port == named.get(port["targetPort"], port["targetPort"])
    assert (worker.master, worker.master_port) == ("ocr-capacity", port["port"])  # the Service's name
    (rule,) = one(objs, "NetworkPolicy", "ocr-capacity-master")["spec"]["ingress"]
    assert [p["port"] for p in rule["ports"]] == [run.master_port]


@pytest.mark.parametrize("folder", RUNS, ids=_id)
def test_master_waits_for_as_many_workers_as_run(folder: Path) -> None:
    objs = build(folder)
    run = _run_args(objs, "Job/ocr-capacity-master")
    replicas = one(objs, "Deployment", "ocr-capacity-worker")["spec"]["replicas"]
    assert run.remote_workers == replicas, "REMOTE_WORKERS (settings.yaml) must equal the workers' replicas"
    assert run.ocr_out == "/runs"
    mounts = {
        m["mountPath"]: m["name"]
        for m in _container(one(objs, "Job", "ocr-capacity-master"), "master")["volumeMounts"]
    }
    volumes = {v["name"]: v for v in pod_spec(one(objs, "Job", "ocr-capacity-master"))["volumes"]}  # type: ignore[index]
    claim = volumes[mounts[run.ocr_out]]["persistentVolumeClaim"]["claimName"]
    one(objs, "PersistentVolumeClaim", claim)


@pytest.mark.parametrize("folder", RUNS, ids=_id)
def test_worker_keeps_its_copy_on_its_own_volume(folder: Path) -> None:
    """A worker's safety copy of its rows lands on an emptyDir of its own, never the master's claim: under
    --worker-dir against its working directory where the CLI has that flag, else under the master's
    run folder path (the code before --worker-dir)."""
    objs = build(folder)
    worker = _run_args(objs, "Deployment/ocr-capacity-worker")
    deployment = one(objs, "Deployment", "ocr-capacity-worker")
    c = _container(deployment, "worker")
    if hasattr(worker, "worker_dir"):
        where = PurePosixPath(c.get("workingDir", IMAGE_WORKDIR)) / worker.worker_dir
    else:
        where = PurePosixPath(_run_args(objs, "Job/ocr-capacity-master").ocr_out)
    volumes = {v["name"]: v for v in pod_spec(deployment)["volumes"]}  # type: ignore[index]
    mounts = [m for m in c["volumeMounts"] if where.is_relative_to(m["mountPath"])]
    assert mounts and "emptyDir" in volumes[mounts[-1]["name"]], f"{where} is on no emptyDir of the worker"


def test_the_fetch_pod_mounts_the_runs_claim() -> None:
    pod = one(build(K8S / "fetch"), "Pod", "ocr-capacity-runs")
    (claim,) = [
        v["persistentVolumeClaim"]["claimName"]
        for v in pod["spec"]["volumes"]
        if "persistentVolumeClaim" in v
    ]
    one(build(K8S / "base"), "PersistentVolumeClaim", claim)


def test_sidecar_sits_beside_the_server_and_scrapes_it() -> None:
    objs = build(K8S / "examples" / "ocr-server")
    server = one(objs, "Deployment", "ocr-server")
    names = [c["name"] for c in pod_spec(server)["containers"]]  # type: ignore[index]
    assert sorted(names) == ["gpu-sampler", "server"]
    sampler = _container(server, "gpu-sampler")
    ns = sampler_parse_args(sampler["command"][3:] + sampler["args"])
    assert ns.server_metrics.startswith(("http://127.0.0.1:", "http://localhost:"))
    ports = {p["port"] for p in one(objs, "Service", "ocr-server")["spec"]["ports"]}
    assert ns.port in ports and ns.port == sampler["ports"][0]["containerPort"]
    settings = one(build(K8S / "base"), "ConfigMap", "ocr-capacity-settings")["data"]
    assert settings["GPU"] == f"sidecar:http://ocr-server:{ns.port}"  # the default reaches this sampler


def test_simulator_example_points_the_run_at_the_simulator() -> None:
    objs = build(K8S / "examples" / "simulator")
    sim = _container(one(objs, "Deployment", "ocr-server"), "server")
    ns = simulator_parser().parse_args(sim["args"])
    run = _run_args(objs, "Job/ocr-capacity-master")
    assert ns.host == "0.0.0.0"
    assert run.ocr_host == f"http://ocr-server:{ns.port}"
    assert run.ocr_gpu == f"dcgm:http://ocr-server:{ns.dcgm_port}/metrics"
    ports = {p["port"] for p in one(objs, "Service", "ocr-server")["spec"]["ports"]}
    assert {ns.port, ns.dcgm_port} <= ports


@pytest.mark.parametrize("folder", buildable_dirs(), ids=_id)
def test_suite_pods_run_as_the_images_user(folder: Path) -> None:
    for obj in build(folder):
        spec = pod_spec(obj)
        for c in (spec or {}).get("containers", []):
            if not str(c.get("image", "")).startswith("ocr-capacity"):
                continue
            ctx = {**(spec or {}).get("securityContext", {}), **c.get("securityContext", {})}
            where = f"{obj['kind']}/{obj['metadata']['name']}/{c['name']}"
            assert ctx.get("runAsNonRoot") and ctx.get("runAsUser") == SUITE_UID, where
            assert ctx.get("allowPrivilegeEscalation") is False and ctx.get("readOnlyRootFilesystem"), where
            assert (
                "/tmp" in {m["mountPath"] for m in c.get("volumeMounts", [])} or c["name"] == "gpu-sampler"
            ), where


def test_image_tag_is_the_suites_version() -> None:
    tag = version("ocr-capacity")
    for folder in buildable_dirs():
        for image in load(folder / KUSTOMIZATION)[0].get("images", []):
            assert image["newTag"] == tag, (
                f"{rel(folder)}: ocr-capacity:{image['newTag']}, the suite is {tag}"
            )
    patch = (K8S / "sampler" / "sidecar" / "sampler-container.yaml").read_text(encoding="utf-8")
    assert re.findall(r"image: ocr-capacity:(\S+)", patch) == [tag]


def test_dockerfile_installs_the_suite_as_its_user() -> None:
    text = (REPO / "deploy" / "Dockerfile").read_text(encoding="utf-8")
    assert re.search(r"^FROM python:3\.11-slim\b", text, re.M)
    assert re.search(r"^RUN pip install -e /app\b", text, re.M)
    assert re.search(rf"useradd --uid {SUITE_UID}\b", text)
    assert re.findall(r"^USER (\S+)", text, re.M) == [f"{SUITE_UID}:{SUITE_UID}"]
    assert re.findall(r"^WORKDIR (\S+)", text, re.M) == [IMAGE_WORKDIR]
