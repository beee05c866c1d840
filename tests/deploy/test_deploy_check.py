"""``fedflex deploy check`` and the start-up diagnosis: a SuperNode whose transport
(TLS / plain HTTP) does not match the SuperLink's is named with the fix, instead of
retrying for ever without a reason (real SuperLinks on loopback)."""

from __future__ import annotations

import pytest

from fedflex.launch import cli
from fedflex.launch.deploy import DeployError, LocalFederation, free_port, make_certificates, supernode_command


@pytest.fixture(scope="module")
def links(tmp_path_factory):
    """A TLS SuperLink and a plain-HTTP one (no SuperNodes), for the whole module."""
    work = tmp_path_factory.mktemp("links")
    tls = make_certificates(work / "certs")
    secure, plain = LocalFederation(work / "tls", 1, tls=tls), LocalFederation(work / "plain", 1)
    try:
        secure.start_superlink()
        plain.start_superlink()
        yield secure, plain, tls
    finally:
        secure.stop()
        plain.stop()
    assert not secure.leftovers() and not plain.leftovers()


def _check(capsys, *args) -> tuple[int, str]:
    code = cli.main(["deploy", "check", *args])
    return code, capsys.readouterr().err


def test_nothing_listening_is_named(capsys):
    code, err = _check(capsys, f"127.0.0.1:{free_port()}", "--timeout", "1")
    assert code == 1 and "nothing answers at 127.0.0.1:" in err


def test_bad_address_is_a_usage_error(capsys):
    code, err = _check(capsys, "localhost")
    assert code == 2 and "expected HOST:PORT" in err


@pytest.mark.slow
def test_plain_node_against_tls_link_is_refused_with_the_fix(links, capsys):
    secure, _plain, _tls = links
    code, err = _check(capsys, secure.address, "--insecure")
    assert code == 1
    assert "speaks TLS but the SuperNode was started with --insecure" in err and "--root-certificates" in err


@pytest.mark.slow
def test_tls_node_against_plain_link_is_refused(links, capsys):
    _secure, plain, tls = links
    code, err = _check(capsys, plain.address, "--root-certificates", str(tls.ca_cert))
    assert code == 1 and "speaks plain HTTP" in err


@pytest.mark.slow
def test_tls_node_with_the_right_ca_passes(links, capsys):
    secure, _plain, tls = links
    code, err = _check(capsys, secure.address, "--root-certificates", str(tls.ca_cert))
    assert code == 0 and "speaks TLS, certificate valid for 127.0.0.1" in err


@pytest.mark.slow
def test_tls_node_with_another_ca_is_refused(links, capsys, tmp_path):
    secure, _plain, _tls = links
    other = make_certificates(tmp_path / "other")
    code, err = _check(capsys, secure.address, "--root-certificates", str(other.ca_cert))
    assert code == 1 and "certificate is refused" in err


@pytest.mark.slow
def test_start_up_names_a_plain_node_against_a_tls_link(links):
    # Prepare: a SuperNode with --insecure against the TLS SuperLink
    secure, _plain, _tls = links
    cmd = supernode_command(secure.address, 0, 1, free_port())
    secure.nodes[0] = secure.start_extra("plain-node", cmd)
    # Execute / Assert: the wait ends with the reason, not a bare timeout
    with pytest.raises(DeployError, match="speaks TLS but the SuperNode was started with --insecure"):
        secure.wait_supernode(0, timeout=5)
