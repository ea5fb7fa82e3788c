"""The lab of the multi-host tests (module-wide: made once, torn down even when a test fails): the hosts'
namespaces, a self-signed certificate, the simulator and the sidecar. Skipped with the reason where
namespaces cannot be made (not root, no `ip netns`); leftovers of a killed earlier run are removed first."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from mh_runs import HOSTS, Hosts, self_signed, start_services
from netlab import Lab, LabUnavailable, check_available, clean_leftovers, namespaces, root_network


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hosts]:
    try:
        check_available()
    except LabUnavailable as exc:
        pytest.skip(f"multi-host lab unavailable: {exc}")
    clean_leftovers()
    network_before = root_network()
    root = tmp_path_factory.mktemp("multihost")
    lab = Lab(dict(HOSTS))
    try:
        lab.up()
        cert, key = self_signed(root / "tls")
        made = Hosts(lab, root, cert, key)
        start_services(made)
        yield made
    finally:
        lab.down()
    assert not [ns for ns in namespaces() if ns.startswith(lab.ns(""))], namespaces()
    assert root_network() == network_before, "the lab changed the root namespace's network"
