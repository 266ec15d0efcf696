"""A prepared query's schema is kept per version of the datasets it names: a new version, or a dataset dropped and
put again with other types, is never answered with the schema of the one before. The datasets a query opens are kept
per FlightInfo the catalog gives: a new version, a drop, a replica added or a node's death opens them again."""

from __future__ import annotations

import pyarrow as pa
import pytest

import flightpart as fp
from flightpart.sql.schemas import SchemaCache


@pytest.fixture(scope="module")
def sql_cluster(make_cluster):
    return make_cluster(1)


def test_a_schema_is_kept_per_version_and_follows_new_versions_and_a_dataset_put_again(sql_cluster):
    gateway = sql_cluster.catalog.gateway
    query = "SELECT x + 1 AS y, count(*) AS n FROM kept GROUP BY 1"
    with fp.connect(sql_cluster.uri) as client:
        client.put("kept", pa.table({"x": pa.array([1, 2], pa.int32())}))
        assert gateway.schema(query).field("y").type == pa.int32()
        assert len(gateway.schemas) >= 1 and gateway.schema(query).field("y").type == pa.int32()  # kept, the same
        client.put("kept", pa.table({"x": pa.array([1.5, 2.5])}))  # a new version of other types
        assert gateway.schema(query).field("y").type == pa.float64()
        client.drop("kept")
        client.put("kept", pa.table({"x": pa.array(["a", "b"])}))  # dropped, then put again with text
        assert gateway.schema("SELECT x || 'z' AS y FROM kept GROUP BY 1").field("y").type == pa.string()
        with pytest.raises(fp.FlightpartError):
            gateway.schema(query)  # text + 1: refused, not answered with a kept float64


def test_a_query_that_lists_tables_is_never_kept(sql_cluster):
    gateway = sql_cluster.catalog.gateway
    before = len(gateway.schemas)
    gateway.schema("SELECT table_name FROM information_schema.tables")
    assert len(gateway.schemas) == before


def test_the_cache_keeps_the_most_recently_used():
    cache = SchemaCache(kept=2)
    a, b, c = (pa.schema([(name, pa.int8())]) for name in "abc")
    cache.put("a", a)
    cache.put("b", b)
    assert cache.get("a") == a  # used: b is now the least recent
    cache.put("c", c)
    assert cache.get("b") is None and cache.get("a") == a and cache.get("c") == c and len(cache) == 2


def test_answers_follow_new_versions_of_other_types_through_the_kept_planning(sql_cluster):
    """The planners keep DuckDB's types of a query per version too: the answer of the same text over a new version,
    or a dataset dropped and put again, has the new types and values."""
    gateway = sql_cluster.catalog.gateway
    query = "SELECT max(x) AS top, count(*) AS n FROM planned WHERE x > 1"
    with fp.connect(sql_cluster.uri) as client:
        client.put("planned", pa.table({"x": pa.array([1, 2, 3], pa.int32())}))
        first = client.sql(query).to_arrow()
        assert first.to_pylist() == [{"top": 3, "n": 2}] and first.schema.field("top").type == pa.int32()
        assert len(gateway.expected) >= 1 and client.sql(query).to_arrow().equals(first)  # kept, the same answer
        client.put("planned", pa.table({"x": pa.array([1.5, 2.5, 9.25])}))
        second = client.sql(query).to_arrow()
        assert second.to_pylist() == [{"top": 9.25, "n": 3}] and second.schema.field("top").type == pa.float64()
        client.drop("planned")
        client.put("planned", pa.table({"x": pa.array([5, 7], pa.int64())}))
        assert client.sql(query).to_arrow().schema.field("top").type == pa.int64()


def test_the_datasets_a_query_opens_follow_versions_drops_and_replicas(sql_cluster):
    gateway = sql_cluster.catalog.gateway
    count = "SELECT count(*) AS n, sum(x) AS total FROM opened"
    with fp.connect(sql_cluster.uri) as client:
        client.put("opened", pa.table({"x": list(range(10))}), tiling=(2, 1))
        assert client.sql(count).to_arrow().to_pylist() == [{"n": 10, "total": 45}]
        first = gateway.opened("opened")
        assert gateway.opened("opened") is first  # kept: the same FlightInfo
        client.put("opened", pa.table({"x": list(range(20))}), tiling=(4, 1))
        assert client.sql(count).to_arrow().to_pylist() == [{"n": 20, "total": 190}]
        assert gateway.opened("opened") is not first and gateway.opened("opened@1").version == 1
        assert client.sql("SELECT count(*) AS n FROM \"opened@1\"").to_arrow().to_pylist() == [{"n": 10}]
        second = gateway.opened("opened")
        sql_cluster.catalog.after_action("replicate")  # what a repair or a node's change does to the FlightInfos
        assert gateway.opened("opened") is not second
        client.drop("opened")
        with pytest.raises(fp.DatasetNotFound):
            client.sql(count).to_arrow()
