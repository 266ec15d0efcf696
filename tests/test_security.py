"""Tokens on every RPC, TLS and mutual TLS, between every pair of processes."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pytest

import flightpart as fp

from certs import make_pki

TOKEN = "s3cret-token-for-tests"


@pytest.fixture(scope="module")
def token_cluster(tmp_path_factory, make_cluster):
    root = tmp_path_factory.mktemp("token")
    (root / "token").write_text(TOKEN + "\n")
    (root / "token").chmod(0o600)  # a credential file others can read is refused
    with make_cluster(2, process=True, root=root, extra_args=["--token-file", str(root / "token")]) as c:
        yield c


def test_with_the_token_everything_works_between_all_daemons(token_cluster):
    table = pa.table({"a": np.arange(1000)})
    with fp.connect(token_cluster.uri, token=TOKEN, host="127.0.0.99") as client:
        assert len([n for n in client.nodes() if n.alive]) == 2  # nodes registered with the token
        client.put("guarded", table, tiling=(2, 1))                 # the catalog verified with the nodes
        assert client.open("guarded").to_arrow().equals(table)


@pytest.mark.parametrize("token", [None, "wrong"], ids=["no-token", "wrong-token"])
def test_without_the_token_every_call_is_unauthenticated(token_cluster, token):
    options = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {token}".encode())] if token else [])
    catalog = flight.connect(token_cluster.uri)
    node = flight.connect(token_cluster.nodes[0].uri)
    calls = [
        lambda: list(catalog.list_flights(options=options)),
        lambda: catalog.get_flight_info(flight.FlightDescriptor.for_path("guarded"), options=options),
        lambda: list(catalog.do_action(flight.Action("nodes", b""), options=options)),
        lambda: list(catalog.list_actions(options=options)),
        lambda: node.do_get(flight.Ticket(json.dumps({"dataset": "guarded", "version": 1, "part": [0, 0]}).encode()),
                            options=options).read_all(),
        lambda: list(node.do_action(flight.Action("stats", b""), options=options)),
        lambda: node.do_put(flight.FlightDescriptor.for_path("x", "1", "0", "0"), pa.schema([("a", pa.int64())]),
                            options=options)[0].close(),
    ]
    for call in calls:
        with pytest.raises(flight.FlightUnauthenticatedError) as info:
            call()
        assert "guarded" not in str(info.value)
    with fp.connect(token_cluster.uri, token=token) as client:
        with pytest.raises(fp.Unauthenticated):
            client.list()
        with pytest.raises(fp.Unauthenticated):
            client.open("guarded")


def test_tls_with_client_certificates(tmp_path, monkeypatch, new_cluster):
    pki = make_pki(tmp_path / "pki", ["127.0.0.1", "127.0.0.32", "127.0.0.33"])
    args = ["--tls-cert", str(pki["server"]), "--tls-key", str(pki["server_key"]), "--tls-client-ca", str(pki["ca"]),
            "--tls-ca", str(pki["ca"])]
    # pinned: the certificate names the nodes' addresses
    with new_cluster(2, process=True, first_ip=32, root=tmp_path / "c", extra_args=args) as c:
        assert c.uri.startswith("grpc+tls://") and c.nodes[0].uri.startswith("grpc+tls://")
        monkeypatch.setenv("FLIGHTPART_TLS_CERT", str(pki["client"]))
        monkeypatch.setenv("FLIGHTPART_TLS_KEY", str(pki["client_key"]))
        table = pa.table({"v": np.arange(5000) * 1.5})
        with fp.connect(c.uri, host="127.0.0.99", tls_root_certs=pki["ca"].read_bytes()) as client:
            assert sorted(n.ip for n in client.nodes() if n.alive) == ["127.0.0.32", "127.0.0.33"]
            client.put("secure", table, tiling=(2, 1))
            assert client.open("secure").to_arrow().equals(table)
        # a client that does not present a certificate is turned away
        anonymous = flight.FlightClient(c.uri, tls_root_certs=pki["ca"].read_bytes())
        with pytest.raises(flight.FlightError):
            list(anonymous.list_flights(options=flight.FlightCallOptions(timeout=5)))
        # a client that does not trust the CA refuses the server
        with fp.connect(c.uri, tls_root_certs=None, cert_chain=pki["client"].read_bytes(),
                        private_key=pki["client_key"].read_bytes()) as plain:
            with pytest.raises((flight.FlightError, fp.FlightpartError)):
                list(plain.pool.client(c.uri).list_flights(options=plain.pool.options(5)))


def test_mutual_tls_with_explicit_certificates_and_no_environment(tmp_path, monkeypatch, new_cluster):
    """The client's own certificate reaches every connection it makes, reads included."""
    for var in ("FLIGHTPART_TLS_CERT", "FLIGHTPART_TLS_KEY", "FLIGHTPART_TLS_CA", "FLIGHTPART_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    pki = make_pki(tmp_path / "pki", ["127.0.0.1", "127.0.0.34", "127.0.0.35"])
    args = ["--tls-cert", str(pki["server"]), "--tls-key", str(pki["server_key"]), "--tls-client-ca", str(pki["ca"]),
            "--tls-ca", str(pki["ca"])]
    table = pa.table({"v": np.arange(6000) * 0.5, "k": np.arange(6000) % 7})
    key = pki["client_key"].read_bytes()
    # pinned: the certificate names the nodes' addresses
    with new_cluster(2, process=True, first_ip=34, root=tmp_path / "c", extra_args=args) as c:
        with fp.connect(c.uri, host="127.0.0.99", tls_root_certs=pki["ca"].read_bytes(),
                        cert_chain=pki["client"].read_bytes(), private_key=key) as client:
            client.put("mtls", table, tiling=(3, 1))
            ds = client.open("mtls")
            assert ds.to_arrow().equals(table)                      # streamed from both nodes over mutual TLS
            assert ds.to_dask().compute().reset_index(drop=True).equals(table.to_pandas())
            handle = pickle.dumps(ds.__partitioned__)
            assert key not in handle and b"PRIVATE KEY" not in handle  # the key never travels in a handle
            # a copy unpickled in this process still reads: the certificate comes back from this process
            again = pickle.loads(handle)
            parts = again["get"]([p["data"] for p in again["partitions"].values()])
            assert sum(t.num_rows for t in parts) == table.num_rows
        # a closed client refuses work with a clear error instead of dialling again
        with pytest.raises(fp.ClientClosed, match="closed"):
            client.list()
        with pytest.raises(fp.ClientClosed):
            client.open("mtls")
        # what it opened before stays readable, like any handle
        assert ds.to_arrow().equals(table)
