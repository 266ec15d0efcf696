"""An identity provider's tokens on real daemons: a catalog started with ``--jwks`` (a key set this test makes),
users and groups named by the tokens' claims, through ADBC, the Python client and the nodes."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import time

import jwt
import numpy as np
import pyarrow as pa
import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from jwt.algorithms import ECAlgorithm

import flightpart as fp
from flightpart import tokens

SECRET = tokens.new_secret()
ISSUER = "https://idp.test/"
AUDIENCE = "flightpart-test"
KEY = ec.generate_private_key(ec.SECP256R1())
OTHER_KEY = ec.generate_private_key(ec.SECP256R1())


def token_of(user: str, *, groups: tuple[str, ...] = (), role: str | None = None, key=KEY, expires_in: float = 600,
             issuer: str = ISSUER, audience: str = AUDIENCE) -> str:
    now = int(time.time())
    claims = {"sub": user, "iss": issuer, "aud": audience, "iat": now, "exp": int(now + expires_in),
              "groups": list(groups)}
    if role is not None:
        claims["flightpart_role"] = role
    return jwt.encode(claims, key, algorithm="ES256", headers={"kid": "k1"})


@pytest.fixture(scope="module")
def idp_cluster(tmp_path_factory, make_cluster):
    root = tmp_path_factory.mktemp("idp")
    (root / "secret").write_text(SECRET + "\n")
    (root / "secret").chmod(0o600)
    jwk = {**ECAlgorithm.to_jwk(KEY.public_key(), as_dict=True), "kid": "k1", "alg": "ES256", "use": "sig"}
    (root / "jwks.json").write_text(json.dumps({"keys": [jwk]}))
    catalog_args = ["--jwks", str(root / "jwks.json"), "--jwt-issuer", ISSUER, "--jwt-audience", AUDIENCE,
                    "--jwt-role-claim", "flightpart_role"]
    with make_cluster(2, process=True, root=root, extra_args=["--token-file", str(root / "secret")],
                      catalog_args=catalog_args) as cluster:
        with fp.connect(cluster.uri, token=SECRET, host="127.0.0.99") as admin:
            admin.put("metrics_cpu", pa.table({"v": np.arange(2000)}), tiling=(2, 1))
            admin.put("payroll", pa.table({"v": np.arange(10)}), tiling=(1, 1))
            admin.users.grant("read", "metrics_*", "sre")
            admin.users.grant("write", "metrics_*", "ingest-bots")
        yield cluster


def test_a_provider_token_signs_in_and_its_groups_carry_grants(idp_cluster):
    with fp.connect(idp_cluster.uri, token=token_of("olga", groups=("sre",)), host="127.0.0.99") as olga:
        assert olga.access.token.startswith("fp3:idp:olga~reader~")  # exchanged: nodes take it
        assert [entry.name for entry in olga.list()] == ["metrics_cpu"]
        assert olga.open("metrics_cpu").to_arrow().num_rows == 2000  # rows from the nodes, by capability
        with pytest.raises(fp.Forbidden):
            olga.open("payroll")
    with fp.connect(idp_cluster.uri, token=token_of("pete"), host="127.0.0.99") as pete:  # in no group
        assert pete.list() == []


def test_a_writer_named_by_the_provider_writes_where_granted(idp_cluster):
    bot = token_of("bot-1", groups=("ingest-bots",), role="writer")
    with fp.connect(idp_cluster.uri, token=bot, host="127.0.0.99") as writer:
        writer.put("metrics_mem", pa.table({"v": np.arange(100)}), tiling=(2, 1))
        assert writer.open("metrics_mem").shape == (100, 1)
        with pytest.raises(fp.Forbidden):
            writer.put("payroll", pa.table({"v": np.arange(5)}))


def test_adbc_with_a_provider_token(idp_cluster):
    adbc = pytest.importorskip("adbc_driver_flightsql.dbapi")
    header = f"Bearer {token_of('olga', groups=('sre',))}"
    with adbc.connect(idp_cluster.uri, db_kwargs={"adbc.flight.sql.authorization_header": header}) as conn:
        with conn.cursor() as cur:
            cur.execute("SELECT sum(v) FROM metrics_cpu")
            assert cur.fetchall() == [(sum(range(2000)),)]
            with pytest.raises(adbc.Error) as refused:
                cur.execute("SELECT * FROM payroll")
                cur.fetchall()
            assert "may not read" in str(refused.value)


@pytest.mark.parametrize("bad", ["forged", "expired", "issuer", "audience"])
def test_a_forged_or_expired_provider_token_is_refused(idp_cluster, bad):
    token = {"forged": lambda: token_of("olga", groups=("sre",), key=OTHER_KEY),
             "expired": lambda: token_of("olga", groups=("sre",), expires_in=-3600),
             "issuer": lambda: token_of("olga", groups=("sre",), issuer="https://evil.test/"),
             "audience": lambda: token_of("olga", groups=("sre",), audience="another-service")}[bad]()
    with pytest.raises(fp.Unauthenticated) as refused:
        fp.connect(idp_cluster.uri, token=token, host="127.0.0.99").list()
    assert "JWT refused" in str(refused.value)


def test_a_provider_token_cannot_be_a_local_user_nor_name_one_as_a_group(idp_cluster):
    with fp.connect(idp_cluster.uri, token=SECRET, host="127.0.0.99") as admin:
        admin.users.add("quinn", "quinn-password-long", role="admin")
        admin.users.grant("read", "payroll", "quinn")
    with pytest.raises(fp.Unauthenticated, match="is a user or group of this catalog"):
        fp.connect(idp_cluster.uri, token=token_of("quinn", role="admin"), host="127.0.0.99").list()
    with fp.connect(idp_cluster.uri, token=token_of("zed", groups=("quinn", "sre")), host="127.0.0.99") as zed:
        assert [entry.name for entry in zed.list()] == ["metrics_cpu", "metrics_mem"]
        with pytest.raises(fp.Forbidden):
            zed.open("payroll")
        with pytest.raises(fp.Forbidden):  # a provider's user changes no local user's password
            zed.users.change("quinn", password="taken-over-by-idp", current="whatever-it-was")


def _read_pickled(handle: bytes) -> str:
    code = ("import pickle, sys\nget, refs = pickle.loads(sys.stdin.buffer.read())\n"
            "try:\n    print(sum(t.num_rows for t in get(refs)))\n"
            "except Exception as exc:\n    print(type(exc).__name__, exc)\n")
    return subprocess.run([sys.executable, "-c", code], input=handle, capture_output=True, timeout=120,
                          env={"FLIGHTPART_HOST": "127.0.0.99", "PATH": "/usr/bin:/bin"}).stdout.decode()


def test_a_group_grant_withdrawn_voids_the_provider_users_handles_on_the_nodes(idp_cluster):
    with fp.connect(idp_cluster.uri, token=token_of("olga", groups=("sre",)), host="127.0.0.99") as olga:
        meta = olga.open("metrics_cpu").__partitioned__
    handle = pickle.dumps((meta["get"], [p["data"] for p in meta["partitions"].values()]))
    assert _read_pickled(handle).strip() == "2000"
    with fp.connect(idp_cluster.uri, token=SECRET, host="127.0.0.99") as admin:
        admin.users.revoke("read", "metrics_*", "sre")
        try:
            answer = _read_pickled(handle)
            assert "2000" not in answer and "revoked" in answer, answer
        finally:
            admin.users.grant("read", "metrics_*", "sre")
    with fp.connect(idp_cluster.uri, token=token_of("olga", groups=("sre",)), host="127.0.0.99") as olga:
        assert olga.open("metrics_cpu").to_arrow().num_rows == 2000  # granted again: a new open reads


def test_a_provider_token_cannot_take_a_local_groups_name(idp_cluster):
    with fp.connect(idp_cluster.uri, token=SECRET, host="127.0.0.99") as admin:
        admin.users.add("rita", "rita-password-long")
        admin.users.join("payroll-team", "rita")
        admin.users.grant("read", "payroll", "payroll-team")
    with pytest.raises(fp.Unauthenticated, match="user or group of this catalog"):
        fp.connect(idp_cluster.uri, token=token_of("payroll-team"), host="127.0.0.99").list()
