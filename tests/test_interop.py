"""Reading ``__partitioned__`` as producers really emit it, beside the exact validator.

The dicts here are built the way each producer builds them (the Modin
producer of PR 3452 with real Ray ObjectRefs, xgboost_ray's examples,
heat's ``__partitioned__``), with real Ray where they hold Ray objects.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import flightpart as fp
from flightpart import lenient


def frame(rows: int = 12) -> pd.DataFrame:
    return pd.DataFrame({"a": np.arange(rows, dtype=np.int64), "b": np.arange(rows) * 0.5, "c": np.arange(rows) % 3,
                         "d": np.arange(rows) * 2.0})


def modin_style(ray, df: pd.DataFrame) -> dict:
    """As Modin's producer (PR 3452): a 2-D grid, no top-level shape, location a bare IP, get = ray.get(x)[0]."""
    ip = ray.util.get_node_ip_address()
    half_r, half_c = len(df) // 2, df.shape[1] // 2
    parts = {}
    for i, (r0, r1) in enumerate([(0, half_r), (half_r, len(df))]):
        for j, (c0, c1) in enumerate([(0, half_c), (half_c, df.shape[1])]):
            parts[(i, j)] = {"start": (r0, c0), "shape": (r1 - r0, c1 - c0),
                             "data": ray.put(df.iloc[r0:r1, c0:c1].reset_index(drop=True)), "location": ip}
    return {"partition_tiling": (2, 2), "partitions": parts, "get": lambda x: ray.get(x)[0]}


def test_a_modin_style_dict_with_real_ray_object_refs_reads_equal(ray_session):
    df = frame()
    d = modin_style(ray_session, df)
    with pytest.raises(fp.PartitionedError, match="missing key 'shape'"):
        fp.validate(d)  # exact to the spec by default
    spec, used = lenient.as_spec(d)
    assert used == ["location-ip", "no-shape"] and spec["shape"] == (12, 4)
    assert (fp.validate(d, lenient=True)["partitions"][(1, 1)]["location"]
            == [(ray_session.util.get_node_ip_address(), 0)])
    assert fp.from_partitioned(d).to_pandas().equals(df)


def test_an_xgboost_ray_style_dict_reads_equal(ray_session):
    df = frame(9)
    ip = ray_session.util.get_node_ip_address()
    blocks = [(0, 4), (4, 9)]
    d = {"shape": (9, 4), "partition_tiling": (2, 1), "get": ray_session.get,
         "partitions": {(k, 0): {"start": (s, 0), "shape": (e - s, 4), "data": ray_session.put(df.iloc[s:e]),
                                 "location": [ip]} for k, (s, e) in enumerate(blocks)}}
    with pytest.raises(fp.PartitionedError, match=r"location\[0\]: expected a tuple"):
        fp.validate(d)
    assert lenient.as_spec(d)[1] == ["location-ip"]
    assert fp.from_partitioned(d).to_pandas().equals(df)


def test_a_heat_style_spmd_dict_reads_equal():
    values = np.arange(24.0).reshape(6, 4)
    d = {"shape": (6, 4), "partition_tiling": (1, 1), "dtype": "float64", "locals": [(0, 0)],
         "partitions": {(0, 0): {"start": (0, 0), "shape": (6, 4), "data": 0, "location": [0], "dtype": "float64",
                                 "device": "cpu"}},
         "get": lambda handle: values}  # a lambda for one handle; the MPI rank as location
    with pytest.raises(fp.PartitionedError, match="unknown key 'dtype'"):
        fp.validate(d)
    assert lenient.as_spec(d)[1] == ["extra-keys", "extra-partition-keys", "location-rank"]
    np.testing.assert_array_equal(np.column_stack([c.to_numpy() for c in fp.from_partitioned(d).columns]), values)


@pytest.mark.interop
def test_a_torch_part_is_read_through_dlpack():
    torch = pytest.importorskip("torch",
                                reason="torch is not installed: pip install 'flightpart[interop]' (heat brings it)")
    values = torch.arange(12, dtype=torch.float64).reshape(6, 2)
    d = {"shape": (6, 2), "partition_tiling": (1, 1), "get": fp.IdentityGet(),
         "partitions": {(0, 0): {"start": (0, 0), "shape": (6, 2), "data": values,
                                 "location": [fp.protocol.this_process()]}}}
    out = fp.from_partitioned(d)
    np.testing.assert_array_equal(np.column_stack([c.to_numpy() for c in out.columns]), values.numpy())


class ModinLike:
    def __init__(self, d: dict):
        self.d = d

    @property
    def __partitioned__(self) -> dict:
        return self.d


def test_client_put_takes_any_partitioned_object(ray_session):
    df = frame(20)
    with fp.connect() as client:
        ds = client.put("from-modin", ModinLike(modin_style(ray_session, df)))
        assert ds.to_pandas().equals(df)


def test_every_form_is_documented():
    text = open("docs/protocol.md").read()
    for key in lenient.FORMS:
        assert f"`{key}`" in text, key


# --------------------------------------------------------------------------- xgboost_ray, the real package


@pytest.mark.interop
def test_xgboost_ray_trains_on_a_dataset_with_a_named_label_and_keeps_locality(ray_session):
    xgboost_ray = pytest.importorskip("xgboost_ray",
                                      reason="xgboost_ray is not installed: pip install 'flightpart[interop]'")
    from xgboost_ray.data_sources.partitioned import Partitioned

    rng = np.random.default_rng(7)
    x = rng.normal(size=(400, 3))
    df = pd.DataFrame({"f_a": x[:, 0], "f_b": x[:, 1], "f_c": x[:, 2], "y": x @ np.array([1.0, -2.0, 0.5])})
    with fp.connect() as client:
        ds = client.put("train", df, tiling=(4, 1))
        view = fp.ray.for_consumers(ds)
        ip = ray_session.util.get_node_ip_address()
        # Ray's name of this host
        assert {e["location"][0] for e in view.__partitioned__["partitions"].values()} == {ip}

        @ray_session.remote(num_cpus=0)
        class Actor:
            def ip(self) -> str:
                return ray_session.util.get_node_ip_address()

        actors = [Actor.remote() for _ in range(2)]
        parted, shards = Partitioned.get_actor_shards(view, actors)
        assigned = [e for hs in shards.values() for h in hs for e in parted["partitions"].values() if e["data"] == h]
        assert len(assigned) == 4 and all(e["location"][0] == ip for e in assigned)  # each to an actor on its host
        frame = Partitioned.load_data(parted, indices=shards[0])
        assert list(frame.columns) == ["f_a", "f_b", "f_c", "y"]  # names kept: a label is found by name

        dtrain = xgboost_ray.RayDMatrix(view, label="y")
        result: dict = {}
        xgboost_ray.train({"objective": "reg:squarederror", "eval_metric": "rmse", "nthread": 1}, dtrain,
                          num_boost_round=5, evals=[(dtrain, "train")], evals_result=result,
                          ray_params=xgboost_ray.RayParams(num_actors=2, cpus_per_actor=1))
        rmse = result["train"]["rmse"]
        assert len(rmse) == 5 and np.isfinite(rmse).all() and rmse[-1] < rmse[0]


@pytest.mark.interop
def test_xgboost_ray_trains_with_a_text_column(ray_session):
    xgboost_ray = pytest.importorskip("xgboost_ray",
                                      reason="xgboost_ray is not installed: pip install 'flightpart[interop]'")
    rng = np.random.default_rng(3)
    kinds = np.array(["alpha", "beta", "gamma"])
    k = rng.integers(0, 3, 300)
    x = rng.normal(size=300)
    df = pd.DataFrame({"x": x, "kind": kinds[k], "y": x + np.array([0.0, 5.0, -5.0])[k]})
    with fp.connect() as client:
        ds = client.put("train-text", df, tiling=(3, 1))
        as_categories = fp.ray.for_consumers(ds, text="categories").__partitioned__
        frames = as_categories["get"]([e["data"] for e in as_categories["partitions"].values()])
        combined = pd.concat(frames)  # what an actor does with its shards: the categories survive it
        assert isinstance(combined["kind"].dtype, pd.CategoricalDtype)
        assert list(combined["kind"].cat.categories) == ["alpha", "beta", "gamma"]
        assert combined["kind"].astype(str).tolist() == df["kind"].tolist()
        view = fp.ray.for_consumers(ds)  # codes: xgboost 2.0.3 cannot read categoricals under NumPy 2
        parts = view.__partitioned__
        codes = pd.concat(parts["get"]([e["data"] for e in parts["partitions"].values()]))["kind"]
        assert codes.tolist() == k.tolist()  # alpha, beta, gamma -> 0, 1, 2 in every part
        dtrain = xgboost_ray.RayDMatrix(view, label="y")
        result: dict = {}
        xgboost_ray.train({"objective": "reg:squarederror", "eval_metric": "rmse", "tree_method": "hist", "nthread": 1},
                          dtrain, num_boost_round=8, evals=[(dtrain, "train")], evals_result=result,
                          ray_params=xgboost_ray.RayParams(num_actors=2, cpus_per_actor=1))
        rmse = result["train"]["rmse"]
        assert np.isfinite(rmse).all() and rmse[-1] < rmse[0] / 2  # the category carries most of y: it was learnt


def test_views_give_numpy_parts_and_owner_ranks_for_spmd_consumers():
    values = np.arange(40.0).reshape(20, 2)
    with fp.connect() as client:
        client.put("spmd", pd.DataFrame(values, columns=["a", "b"]), tiling=(4, 1))
        for rank in range(2):
            view = client.open("spmd", rank=rank, nranks=2).as_partitioned(frames="numpy", location="rank")
            d = view.__partitioned__
            assert {pos: e["location"] for pos, e in d["partitions"].items()} == {(i, 0): [i % 2] for i in range(4)}
            mine = [pos for pos in d["locals"]]
            parts = d["get"]([d["partitions"][pos]["data"] for pos in mine])
            for pos, part in zip(mine, parts):
                start = d["partitions"][pos]["start"][0]
                assert isinstance(part, np.ndarray) and np.array_equal(part, values[start : start + len(part)])
        with pytest.raises(fp.PartitionedError, match="needs the SPMD view"):
            client.open("spmd").as_partitioned(location="rank")
        with pytest.raises(ValueError, match="frames must be one of"):
            client.open("spmd").as_partitioned(frames="polars")


@pytest.mark.parametrize("lie, message", [
    ({"location": {"ip": "10.0.0.1"}}, r"location: expected a list"),
    ({"start": (5, 0)}, r"reach past shape|the partitions (gap|overlap)"),
    ({"shape": "wide"}, r"partitions\[\(0, 0\)\]\.shape: expected a tuple"),
])
def test_lenient_reading_still_refuses_what_no_producer_means(lie, message):
    d = {"shape": (3, 1), "partition_tiling": (1, 1), "get": fp.IdentityGet(),
         "partitions": {(0, 0): {"start": (0, 0), "shape": (3, 1), "data": np.zeros((3, 1)), "location": "10.0.0.1",
                                 **lie}}}
    with pytest.raises(fp.PartitionedError, match=message):
        fp.from_partitioned(d)
    with pytest.raises(fp.PartitionedError, match=message):
        fp.validate(d, lenient=True)
