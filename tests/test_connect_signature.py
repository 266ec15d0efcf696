"""fp.connect has one full signature: every keyword reaches the cluster it names, or the call is refused."""

from __future__ import annotations

import inspect

import pyarrow as pa
import pytest

import flightpart as fp
import flightpart.client as fpc


def test_an_unknown_keyword_is_a_type_error_with_or_without_an_address(monkeypatch):
    monkeypatch.delenv("FLIGHTPART_CATALOG", raising=False)
    with pytest.raises(TypeError, match="bogus"):
        fp.connect(bogus=1)
    with pytest.raises(TypeError, match="bogus"):
        fp.connect("grpc://127.0.0.1:1", bogus=1)


def test_the_embedded_cluster_takes_the_clients_keywords(monkeypatch, tmp_path):
    monkeypatch.delenv("FLIGHTPART_CATALOG", raising=False)
    with fp.connect(compression="off", timeout=5, idle_timeout=3.0, streams_per_partition=2,
                    data_dir=str(tmp_path)) as client:
        assert (client.compression, client.timeout, client.idle_timeout,
                client.streams_per_partition) == ("off", 5, 3.0, 2)
        assert client.put("kept", pa.table({"x": [1, 2, 3]})).to_arrow().column("x").to_pylist() == [1, 2, 3]
    assert any(tmp_path.rglob("*.arrow")), "data_dir did not hold the embedded node's partitions"


def test_a_bad_value_for_the_embedded_cluster_is_refused_like_for_any_other(monkeypatch):
    monkeypatch.delenv("FLIGHTPART_CATALOG", raising=False)
    with pytest.raises(ValueError, match="compression"):
        fp.connect(compression="gzip9")


@pytest.mark.parametrize("credential", ["token", "tls_root_certs", "access"])
def test_credentials_without_an_address_are_refused_not_dropped(monkeypatch, credential):
    monkeypatch.delenv("FLIGHTPART_CATALOG", raising=False)
    value = fpc.Access() if credential == "access" else ("fp2:x" if credential == "token" else b"pem")
    with pytest.raises(TypeError, match=credential):
        fp.connect(**{credential: value})


def test_a_data_dir_with_an_address_is_refused():
    with pytest.raises(TypeError, match="data_dir"):
        fp.connect("grpc://127.0.0.1:1", data_dir="/tmp/x")


def test_fp_connect_names_every_keyword_of_the_client_connect():
    ours = set(inspect.signature(fp.connect).parameters)
    theirs = set(inspect.signature(fpc.connect).parameters)
    assert theirs <= ours and ours - theirs == {"data_dir"}
