"""deploy/k8s against the Kubernetes schemas and against the suite's own code.

Every object (as written, and as `kubectl kustomize` builds it) validates against the strict Kubernetes
JSON schemas bundled with kubernetes-validate (no network). Every suite container's command line, with
the values Kubernetes substitutes for `$(NAME)`, is parsed by the parser `python -m loadtest` or
`python -m gpu_sampler` itself uses, and a run's settings pass RunConfig's checks: a renamed flag, a
setting the code refuses, or a stale manifest fails here, not on a cluster. Names wired across objects
(the Service and the workers' --master, ports, selectors, REMOTE_WORKERS and replicas) must agree.
"""

from __future__ import annotations

import argparse
import contextlib
import io
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from k8s_manifests import (
    K8S,
    KUSTOMIZATION,
    Container,
    build,
    buildable_dirs,
    containers,
    expand,
    kubectl,
    kustomize_dirs,
    load,
    raw_objects,
    rel,
)
from kubernetes_validate.utils import latest_version

from gpu_sampler.__main__ import TOKEN_ENV, is_loopback
from gpu_sampler.__main__ import parse_args as sampler_parse_args
from loadtest.commands.main import build_parser
from loadtest.launch.run import config_from_args
from loadtest.settings.checks import ConfigError
from loadtest.settings.options import SECRET_ENV

# The oldest Kubernetes release still commonly run, and the newest the validator knows.
K8S_VERSIONS = ("1.29.0", latest_version())
# Read by the NVIDIA container runtime, not by our code: they make the cards and NVML visible.
RUNTIME_ENV = {"NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES"}
CODE_ENV = set(SECRET_ENV) | {TOKEN_ENV}  # the environment variables the suite's code reads
SECRET_FLAGS = ("--headers", "--gpu-token", "--token", "--metrics-headers")

needs_kubectl = pytest.mark.skipif(
    kubectl() is None, reason="kubectl not found: its kustomize builds are not checked"
)


def simulator_parser() -> Any:
    """simulator.front.cli's parser, imported when a test runs: it imports aiohttp, which imports names from
    ssl that gevent cannot patch once Locust (imported by other test modules at collection) patches."""
    from simulator.front.cli import build_parser

    return build_parser()


def _id(path: Path) -> str:
    return rel(path) or "."


def suite_containers(folder: Path) -> list[Container]:
    return [c for c in containers(build(folder)) if c.is_suite]


# --- files and schemas --------------------------------------------------------------------------------
@pytest.mark.parametrize("folder", kustomize_dirs(), ids=_id)
def test_kustomization_lists_exactly_its_files(folder: Path) -> None:
    spec = load(folder / KUSTOMIZATION)[0]
    named = list(spec.get("resources", [])) + [p["path"] for p in spec.get("patches", []) if "path" in p]
    named += spec.get("components", [])
    files = {n for n in named if (folder / n).is_file()}
    for n in set(named) - files:
        assert (folder / n / KUSTOMIZATION).is_file(), (
            f"{rel(folder)}: {n} is neither a file nor a kustomization"
        )
    present = {p.name for p in folder.glob("*.yaml")} - {KUSTOMIZATION}
    assert files == present, (
        f"{rel(folder)}/{KUSTOMIZATION} names {sorted(files)}, the folder holds {sorted(present)}"
    )


def test_every_object_validates_as_written() -> None:
    objs = raw_objects()
    assert len(objs) >= 10, [rel(p) for p, _ in objs]
    for path, obj in objs:
        for v in K8S_VERSIONS:
            _validate(obj, v, where=rel(path))


@needs_kubectl
@pytest.mark.parametrize("folder", buildable_dirs(), ids=_id)
def test_every_built_object_validates(folder: Path) -> None:
    for obj in build(folder):
        for v in K8S_VERSIONS:
            _validate(obj, v, where=f"kubectl kustomize {rel(folder)}")


def _validate(obj: dict[str, Any], k8s_version: str, where: str) -> None:
    try:
        kubernetes_validate.validate(obj, k8s_version, strict=True)
    except kubernetes_validate.ValidationError as err:
        pytest.fail(f"{where}: {obj['kind']}/{obj['metadata']['name']} is not valid Kubernetes {k8s_version}: "
                    f"{'.'.join(map(str, err.path))}: {err.message}")  # fmt: skip


def test_the_validator_refuses_a_misspelled_field() -> None:
    """The schemas are strict: a field Kubernetes would drop without a word fails the check above."""
    job = load(K8S / "base" / "master-job.yaml")[0]
    job["spec"]["template"]["spec"]["containers"][0]["argz"] = ["run"]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, K8S_VERSIONS[-1], strict=True)


# --- command lines: the suite's own parsers --------------------------------------------------------------
def test_expand_follows_kubernetes() -> None:
    env = {"A": "x", "EMPTY": ""}
    assert expand("$(A)-$(EMPTY)-$(MISSING)-$$(A)", env) == "x--$(MISSING)-$(A)"


@needs_kubectl
@pytest.mark.parametrize("folder", buildable_dirs(), ids=_id)
def test_command_lines_parse_with_the_suites_parsers(folder: Path) -> None:
    checked = suite_containers(folder)
    assert checked, f"{rel(folder)} runs no container of the suite's image"
    for c in checked:
        undefined = c.references - set(c.env)
        assert not undefined, (
            f"{c.owner}: $({', '.join(sorted(undefined))}) is set nowhere: Kubernetes passes it as written"
        )
        command = c.spec.get("command", [])
        if command[:2] == ["python", "-m"] and command[2] == "loadtest":
            _check_loadtest(c, _parse(build_parser().parse_args, command[3:] + c.args, c.owner))
        elif command[:3] == ["python", "-m", "gpu_sampler"]:
            _check_sampler(c, _parse(sampler_parse_args, command[3:] + c.args, c.owner))
        elif command[:3] == ["python", "-m", "simulator"]:
            _parse(simulator_parser().parse_args, command[3:] + c.args, c.owner)
        else:
            assert command == ["sleep", "infinity"] and not c.args, f"{c.owner}: unexpected command {command}"


def _parse(parse: Any, argv: list[str], owner: str) -> argparse.Namespace:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return parse(argv)
    except SystemExit:
        pytest.fail(f"{owner}: the suite refuses its command line {argv}: {err.getvalue().strip()}")


def _check_loadtest(c: Container, ns: argparse.Namespace) -> None:
    if ns.command == "run":
        try:
            cfg = config_from_args(ns)  # RunConfig's own checks: a setting the code refuses fails here
        except ConfigError as err:
            pytest.fail(f"{c.owner}: the suite refuses its settings: {err}")
        assert cfg.host, f"{c.owner}: no HOST"
        assert ns.master_bind_host == "0.0.0.0", (
            f"{c.owner}: the master must listen beyond loopback for the workers"
        )
        assert cfg.workers == 0 and ns.remote_workers >= 1, f"{c.owner}: the users belong on the worker pods"
    else:
        assert ns.command == "worker", f"{c.owner}: unexpected `python -m loadtest {ns.command}`"


def _check_sampler(c: Container, ns: argparse.Namespace) -> None:
    assert ns.command == "serve"
    if not is_loopback(ns.host):  # the sidecar refuses such a bind without a token (gpu_sampler.__main__)
        assert TOKEN_ENV in c.env_names, f"{c.owner}: binds {ns.host} but has no {TOKEN_ENV}"


@needs_kubectl
@pytest.mark.parametrize("folder", buildable_dirs(), ids=_id)
def test_env_names_are_ones_the_code_reads(folder: Path) -> None:
    """Every variable set is read by the suite (or the NVIDIA runtime) or feeds a $(NAME) on the command
    line; no secret rides on a command line (`ps` shows it)."""
    secret_keys = set(load(K8S / "examples" / "secret.yaml")[0]["stringData"])
    for c in suite_containers(folder):
        unused = set(c.env_names) - CODE_ENV - RUNTIME_ENV - c.references
        assert not unused, f"{c.owner}: {sorted(unused)} set, read by nothing"
        for var in c.spec.get("env", []):
            ref = var.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                assert ref["name"] == "ocr-capacity-secrets" and ref["key"] in secret_keys, (
                    f"{c.owner}: {ref}"
                )
        flags = [a for a in c.args if a.split("=")[0] in SECRET_FLAGS]
        assert not flags, f"{c.owner}: a secret on the command line {flags}: use the Secret's variables"


def test_secret_example_holds_no_secret() -> None:
    (secret,) = load(K8S / "examples" / "secret.yaml")
    assert set(secret["stringData"]) <= set(SECRET_ENV), "keys are the variables the master reads"
    assert all(v == "" for v in secret["stringData"].values()), "an example never carries a value"


@needs_kubectl
def test_every_secret_the_code_reads_reaches_the_master() -> None:
    """A secret variable added to the code (loadtest.settings.run_config.SECRET_ENV) and not to the manifests fails here."""
    (master,) = [c for c in suite_containers(K8S / "base") if c.owner == "Job/ocr-capacity-master"]
    missing = set(SECRET_ENV) - set(master.env_names)
    assert not missing, (
        f"the master Job sets no {sorted(missing)}: add it from ocr-capacity-secrets (examples/secret.yaml too)"
    )
