"""TLS, metrics headers and what the master sends its workers, at the config level (no processes but
`make -n`): the CA bundle read once and carried as text, secrets masked or kept off Locust's channel."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from loadtest.commands import main as cli
from loadtest.settings.checks import ConfigError
from loadtest.settings.manifest import public_argv
from loadtest.settings.options import from_namespace, secret_env, to_argv, with_env_secrets, worker_options
from loadtest.settings.run_config import RunConfig, with_ca_pem

REPO = Path(__file__).resolve().parents[2]
PEM = "-----BEGIN CERTIFICATE-----\n{body}\n-----END CERTIFICATE-----\n"


@pytest.fixture(scope="module")
def ca_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import sys

    sys.path.insert(0, str(REPO / "tests" / "integration"))
    from it_certs import make_self_signed

    return make_self_signed(tmp_path_factory.mktemp("ca")).cert


def test_the_ca_bundle_is_read_once_where_the_file_is_and_travels_as_text(ca_file, monkeypatch):
    monkeypatch.chdir(ca_file.parent)
    cfg = RunConfig.from_mapping({"host": "https://gpu:8000", "ca_bundle": ca_file.name})
    assert cfg.ca_bundle == str(ca_file), "made absolute: the Locust master runs in another folder"
    assert cfg.ca_bundle_pem == ca_file.read_text()
    assert cfg.tls().context().verify_mode.name == "CERT_REQUIRED"

    sent = worker_options(cfg)
    assert sent["ocr_ca_bundle_pem"] == ca_file.read_text()
    # a worker on another machine: the path does not exist there, the text it received is used
    worker = RunConfig.from_mapping({"ca_bundle": "/nowhere/ca.pem", "ca_bundle_pem": sent["ocr_ca_bundle_pem"]})
    assert worker.tls() == cfg.tls()
    assert "ca_bundle_pem" not in " ".join(to_argv(cfg)) and "BEGIN CERTIFICATE" not in " ".join(to_argv(cfg))


def test_a_bad_ca_bundle_or_insecure_with_one_is_one_line(ca_file, tmp_path):
    junk = tmp_path / "junk.pem"
    junk.write_text(PEM.format(body="bm90IGEgY2VydA=="))
    cases = {
        str(tmp_path / "missing.pem"): "no such file",
        str(ca_file.with_suffix(".key")): "holds no PEM certificate",
        str(junk): "not a valid PEM CA bundle",
    }
    for path, words in cases.items():
        with pytest.raises(ConfigError, match=words) as err:
            with_ca_pem(RunConfig(ca_bundle=path))
        assert str(err.value).startswith(f"CA_BUNDLE={path}") and "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="INSECURE=1 .* give one"):
        RunConfig.from_mapping({"insecure": True, "ca_bundle": str(ca_file)})
    assert RunConfig(insecure=True).tls().context().verify_mode.name == "CERT_NONE"


def test_metrics_headers_default_to_headers_and_are_secret_like_them():
    cfg = RunConfig(headers="Authorization: Bearer api-1")
    assert cfg.metrics_header_dict() == {"Authorization": "Bearer api-1"}
    cfg = with_env_secrets(cfg, {"OCRCAP_METRICS_HEADERS": "Authorization: Bearer prom-2; X-Org: 7"})
    assert cfg.metrics_header_dict() == {"Authorization": "Bearer prom-2", "X-Org": "7"}
    assert secret_env(cfg)["OCRCAP_METRICS_HEADERS"] == "Authorization: Bearer prom-2; X-Org: 7"
    shown = str(cfg.public_dict()) + " ".join(to_argv(cfg)) + repr(cfg)
    assert "prom-2" not in shown and "api-1" not in shown
    assert cfg.public_dict()["metrics_headers"] == "Authorization: ***; X-Org: ***"
    assert public_argv(["run", "--metrics-headers", "A: b", "--metrics-h=A: c"]) == [
        "run", "--metrics-headers", "***", "--metrics-h=***",
    ]  # fmt: skip
    with pytest.raises(ConfigError, match="bad METRICS_HEADERS entry"):
        RunConfig(metrics_headers="no colon here").checked()


def test_the_master_keeps_secrets_off_the_channel_when_asked():
    cfg = RunConfig(headers="Authorization: Bearer api-1", metrics_headers="X: m", gpu_token="g")
    assert worker_options(cfg)["ocr_headers"] == "Authorization: Bearer api-1"  # the default, as before
    quiet = worker_options(RunConfig(headers="Authorization: Bearer api-1", headers_from_workers=True))
    assert quiet["ocr_headers"] == ""
    for sent in (worker_options(cfg), quiet):
        assert sent["ocr_metrics_headers"] == "" and sent["ocr_gpu_token"] == ""  # only the master scrapes

    # the worker's side: what came over the channel, completed from its own environment
    class Options:
        pass

    options = Options()
    for name, value in {**vars(RunConfig()), **{f"ocr_{k}": v for k, v in vars(RunConfig()).items()}}.items():
        setattr(options, name, value)
    vars(options).update(quiet, ocr_headers_from_workers=True)
    on_worker = with_env_secrets(from_namespace(options), {"OCRCAP_HEADERS": "Authorization: Bearer own-3"})
    assert on_worker.header_dict() == {"Authorization": "Bearer own-3"}


def test_the_cli_takes_insecure_and_headers_from_workers_as_bare_flags():
    ns = cli.build_parser().parse_args(["run", "--insecure", "--headers-from-workers", "--stream", "false"])
    assert ns.ocr_insecure is True and ns.ocr_headers_from_workers is True and ns.ocr_stream is False


def test_make_master_binds_loopback_unless_told_and_keeps_header_secrets_off_its_command_line():
    def master_line(*variables: str) -> str:
        out = subprocess.run(
            ["make", "-n", "master", "HOST=https://gpu:8000", *variables],
            cwd=REPO, capture_output=True, text=True, timeout=30, check=True,
        )  # fmt: skip
        return next(line for line in out.stdout.splitlines() if "-m loadtest run" in line)

    assert "--master-bind-host '127.0.0.1'" in master_line()
    line = master_line(
        "MASTER_BIND=10.0.0.5", "INSECURE=1", "HEADERS_FROM_WORKERS=1", "METRICS_HEADERS=A: zz9", "HEADERS=B: yy8"
    )
    assert "--master-bind-host '10.0.0.5'" in line and "--insecure" in line and "--headers-from-workers" in line
    assert "zz9" not in line and "yy8" not in line, "HEADERS and METRICS_HEADERS go through the environment"
    assert "--insecure" not in master_line("INSECURE=0") and "--ca-bundle 'c.pem'" in master_line("CA_BUNDLE=c.pem")
