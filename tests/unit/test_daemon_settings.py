"""``flightpart serve`` and ``flightpart catalog`` parse into their settings values, every option into its field."""

from __future__ import annotations

import click
import pytest

from flightpart.cli.daemons import catalog_cmd, serve
from flightpart.cli.options import settings_of
from flightpart.server.settings import CatalogSettings, NodeSettings


def parsed(command, args: list[str]):
    return command.make_context(command.name, args).params


def test_no_options_give_the_settings_defaults(monkeypatch):
    monkeypatch.delenv("FLIGHTPART_LEASE", raising=False)
    monkeypatch.delenv("FLIGHTPART_TLS_CA", raising=False)
    assert settings_of(NodeSettings, parsed(serve, [])) == NodeSettings()
    assert settings_of(CatalogSettings, parsed(catalog_cmd, [])) == CatalogSettings()


def test_each_option_reaches_its_field_nested_ones_too(tmp_path):
    key = tmp_path / "key"
    key.write_text("k")
    settings = settings_of(NodeSettings, parsed(serve, [
        "--max-streams", "7", "--stream-idle-timeout", "2.5", "--catalog", "head:8815", "--pending-ttl", "5",
        "--cluster-id", "c1", "--token-file", str(key), "--insecure", "--metrics-port", "9",
        "--node-token-file", str(key), "--scrub-rate", "0"]))
    assert (settings.max_streams, settings.stream_idle_timeout, settings.catalog) == (7, 2.5, "grpc://head:8815")
    assert (settings.lifetimes.pending_ttl, settings.identity.cluster_id, settings.ports.metrics_port) == (5.0, "c1", 9)
    assert settings.security.secret_file == str(key) and settings.security.insecure and settings.scrub_rate == 0
    assert settings.credentials.node_token_file == str(key) and settings.security.node_token_file is None
    embedded = settings.embedded_catalog()
    assert (embedded.lifetimes, embedded.identity, embedded.security) == (settings.lifetimes, settings.identity,
                                                                          settings.credentials)


def test_the_lease_comes_from_the_environment_and_bounds_hold(monkeypatch):
    monkeypatch.setenv("FLIGHTPART_LEASE", "postgresql://fp@db:5432/fp")
    assert settings_of(CatalogSettings, parsed(catalog_cmd, [])).lease == "postgresql://fp@db:5432/fp"
    with pytest.raises(click.BadParameter, match="x>=1.0"):
        parsed(catalog_cmd, ["--lease-seconds", "0.5"])
    with pytest.raises(click.BadParameter, match="x>=0.1"):
        parsed(serve, ["--stream-idle-timeout", "0"])
