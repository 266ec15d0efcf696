"""A cluster secret that cannot be guessed, and nothing a handle carries that tests a guess cheaply.

Real daemons on loopback: a weak secret ("x", blanks, "flightpart", short or repeated ones,
a passphrase of a few words) is refused at start by the catalog, by a node and by ``flightpart token``, each
naming ``flightpart secret``; a secret that command writes (mode 600) starts a cluster. From a pickled handle
an attacker gets a capability (a public body and an Ed25519 signature): the key that made it is scrypt's of the
secret, so each guess tested against it costs a derivation of that price, and the cheap derivation of earlier
releases (an HMAC of the secret) reproduces nothing in it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import pickle
import re
import stat
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

import flightpart as fp
from flightpart import tokens

WEAK = ["x", "   ", "flightpart", "FlightPart", "s3cr3t-2024", "ab" * 32, "cluster-secret-for-the-sharing-tests"]
"""Secrets the outside probe tried, and their kin: blank, known, short, repeated, a few words."""


def b64(data: bytes) -> str:
    """URL-safe base64 without padding: how a token writes its signature."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def run_cli(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -m flightpart ...`` as a person types it, with no FLIGHTPART_* variable but those given."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FLIGHTPART_")}
    return subprocess.run([sys.executable, "-m", "flightpart", *args], capture_output=True, text=True, timeout=timeout,
                          env={**environ, **(env or {})})


def secret_file(path, value: str):
    path.write_text(value + "\n")
    path.chmod(0o600)
    return path


def refused_as_weak(done: subprocess.CompletedProcess) -> str:
    """A command that refused a weak secret: non-zero exit, one error line naming the code and the way out."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("Error [CANNOT_START]: "), done.stderr
    assert "too weak" in lines[0] and "flightpart secret" in lines[0] and "128 bits" in lines[0], lines[0]
    return lines[0]


def test_a_weak_secret_is_refused_at_start_by_the_catalog_and_the_node_naming_flightpart_secret(tmp_path):
    for k, value in enumerate(WEAK):
        secret = secret_file(tmp_path / f"weak-{k}", value)
        line = refused_as_weak(run_cli("catalog", "--host", "127.0.0.230", "--port", "0", "--state-dir",
                                       str(tmp_path / "s"), "--secret-file", str(secret)))
        assert f"--secret-file {secret}" in line
    assert "empty or blank" in refused_as_weak(run_cli("catalog", "--host", "127.0.0.230", "--port", "0", "--state-dir",
                                                       str(tmp_path / "s"), env={"FLIGHTPART_SECRET": "   "}))
    for value in ("x", "flightpart", "ab" * 32):
        node = ["serve", "--host", "127.0.0.231", "--port", "0", "--data-dir", str(tmp_path / "d"),
                "--catalog", "grpc://127.0.0.230:9"]
        refused_as_weak(run_cli(*node, "--secret-file", str(secret_file(tmp_path / "weak-node", value))))
        assert "$FLIGHTPART_SECRET" in refused_as_weak(run_cli(*node, env={"FLIGHTPART_SECRET": value}))
    assert not (tmp_path / "s").exists() and not (tmp_path / "d").exists()  # refused before anything was made
    # a token minted from a weak secret would be refused by every daemon: the command says so at once
    refused_as_weak(run_cli("token", "--role", "admin", "--name", "mallory", env={"FLIGHTPART_SECRET": "flightpart"}))


def test_flightpart_secret_writes_one_mode_600_that_a_cluster_starts_with_and_keeps_an_existing_one(
        tmp_path, new_cluster):
    printed = run_cli("secret")
    assert printed.returncode == 0, printed.stderr
    value = printed.stdout.strip()
    assert len(value) >= 43 and tokens.secret_bits(value.encode()) >= tokens.SECRET_MIN_BITS
    assert run_cli("secret").stdout.strip() != value  # fresh every time

    path = tmp_path / "secret"
    done = run_cli("secret", "--out", str(path))
    assert done.returncode == 0 and not done.stdout, done.stderr
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    written = path.read_text().strip()
    again = run_cli("secret", "--out", str(path))
    assert again.returncode != 0 and "exists" in again.stderr and path.read_text().strip() == written

    rows = pa.table({"id": np.arange(1000)})
    with new_cluster(1, process=True, root=tmp_path / "c", extra_args=["--secret-file", str(path)]) as c:
        with fp.connect(c.uri, token=written) as owner:
            owner.put("kept", rows)
        reader = run_cli("token", "--role", "reader", "--name", "alice", "--secret-file", str(path))
        assert reader.returncode == 0, reader.stderr
        with fp.connect(c.uri, token=reader.stdout.strip(), host="127.0.0.99") as alice:
            assert alice.open("kept").to_arrow().equals(rows)
        body = "fp2:admin:mallory:0"  # a token of the earlier format, signed with the key derived the old way
        old_signature = cheap_keys(written.encode())[0].sign(b"flightpart token\0" + body.encode())
        with pytest.raises(fp.Unauthenticated, match="earlier release"):
            with fp.connect(c.uri, token=f"{body}:{b64(old_signature)}") as mallory:
                mallory.drop("kept")
        with fp.connect(c.uri, token=written) as owner:
            assert owner.open("kept").to_arrow().equals(rows)


def scrypt_key(guess: bytes) -> Ed25519PrivateKey:
    """The attacker's one way to test a guess: the derivation the signing key is made by, at its full price."""
    seed = hashlib.scrypt(guess, salt=tokens.KDF_SALT, n=tokens.KDF_N, r=tokens.KDF_R, p=tokens.KDF_P,
                          maxmem=4 * 128 * tokens.KDF_N * tokens.KDF_R, dklen=32)
    return Ed25519PrivateKey.from_private_bytes(seed)


def cheap_keys(guess: bytes) -> list[Ed25519PrivateKey]:
    """Keys a guess gives at the price of a hash: the HMAC earlier releases derived, and plain digests."""
    seeds = [hmac.new(guess, b"flightpart ed25519 signing key", hashlib.sha256).digest(),
             hashlib.sha256(guess).digest(), hashlib.blake2b(guess, digest_size=32).digest(), (guess * 32)[:32]]
    return [Ed25519PrivateKey.from_private_bytes(seed) for seed in seeds]


def raw_public(key: Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def test_testing_a_guess_against_a_pickled_handle_or_the_verify_key_costs_a_full_scrypt_derivation(
        tmp_path, new_cluster):
    path = tmp_path / "secret"
    assert run_cli("secret", "--out", str(path)).returncode == 0
    secret = path.read_text().strip().encode()
    rows = pa.table({"id": np.arange(2000), "x": np.arange(2000) * 0.5})
    with new_cluster(2, process=True, root=tmp_path / "c", extra_args=["--secret-file", str(path)]) as c:
        with fp.connect(c.uri, token=secret.decode()) as owner:
            owner.put("sales", rows, tiling=(2, 1))
        reader = tokens.role_token(secret, "reader", "alice")
        with fp.connect(c.uri, token=reader, host="127.0.0.99") as alice:
            handle = pickle.dumps(alice.open("sales").__partitioned__)
            meta = pickle.loads(handle)  # what the attacker holds reads the version
            assert pa.concat_tables(meta["get"]([p["data"] for p in meta["partitions"].values()])).equals(rows)
        shown = run_cli("verify-key", "--secret-file", str(path))
        assert shown.returncode == 0, shown.stderr

    # what a handle carries of the secret: one capability, a public body and its signature; nothing else
    assert secret not in handle
    found = set(re.findall(rb"fp\d:[A-Za-z]+:[^:\s\x00-\x1f]+:\d+:[A-Za-z0-9_-]{86}", handle))
    assert len(found) == 1, found
    capability = found.pop().decode()
    assert capability.startswith(f"{tokens.TOKEN_PREFIX}:cap:sales@1~#")  # its holder: the reader token
    body, _, signature = capability.rpartition(":")
    message = b"flightpart token\0" + body.encode()

    # the key that made it is scrypt's of the secret (16 MiB, 2^14 rounds a guess); no hash of the secret made it
    assert tokens.KDF_N >= 1 << 14 and 128 * tokens.KDF_N * tokens.KDF_R >= 16 << 20
    assert b64(scrypt_key(secret).sign(message)) == signature
    assert all(b64(key.sign(message)) != signature for key in cheap_keys(secret))
    assert b64(scrypt_key(secret + b"!").sign(message)) != signature  # a wrong guess, tested at full price

    # the verify key (a public file on every node) and a role token: the same key, the same price per guess
    verify = tokens.VerifyKey.parse(shown.stdout.strip())
    assert verify.raw == raw_public(scrypt_key(secret))
    assert all(verify.raw != raw_public(key) for key in cheap_keys(secret))
    token_body, _, token_signature = reader.rpartition(":")
    assert all(b64(key.sign(b"flightpart token\0" + token_body.encode())) != token_signature
               for key in cheap_keys(secret))
