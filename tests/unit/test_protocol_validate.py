"""fp.validate: the spec's rules, each malformation refused by name."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import flightpart as fp


class Holder:
    def __init__(self, value):
        self.__partitioned__ = value


def base() -> dict:
    """A valid 8x8 dict on a 2x2 grid of NumPy blocks (SPMD-free)."""
    full = np.arange(64.0).reshape(8, 8)
    parts = {}
    for i in range(2):
        for j in range(2):
            parts[(i, j)] = {
                "start": (4 * i, 4 * j),
                "shape": (4, 4),
                "data": full[4 * i : 4 * i + 4, 4 * j : 4 * j + 4],
                "location": [(f"10.0.0.{i + 1}", 100 + j)],
            }
    return {"shape": (8, 8), "partition_tiling": (2, 2), "partitions": parts, "get": fp.IdentityGet()}


def spmd() -> dict:
    d = base()
    d["partitions"][(1, 0)]["data"] = None
    d["partitions"][(1, 1)]["data"] = None
    d["locals"] = [(0, 0), (0, 1)]
    return d


def setp(pos, key, value):
    def mutate(d):
        d["partitions"][pos][key] = value
        return d

    return mutate


def setk(key, value):
    def mutate(d):
        d[key] = value
        return d

    return mutate


def delk(key):
    def mutate(d):
        del d[key]
        return d

    return mutate


def both(*mutations):
    def mutate(d):
        for m in mutations:
            d = m(d)
        return d

    return mutate


def move(old, new):
    def mutate(d):
        d["partitions"][new] = d["partitions"].pop(old)
        return d

    return mutate


MALFORMED = [
    ("not a dict", lambda d: Holder([d]), "__partitioned__: expected a dict, got list"),
    ("missing shape", delk("shape"), "__partitioned__: missing key 'shape'"),
    ("missing tiling", delk("partition_tiling"), "missing key 'partition_tiling'"),
    ("missing partitions", delk("partitions"), "missing key 'partitions'"),
    ("missing get", delk("get"), "missing key 'get'"),
    ("unknown key", setk("extra", 1), "unknown key 'extra'"),
    ("shape list", setk("shape", [8, 8]), "shape: expected a tuple of integers, got [8, 8] (list)"),
    ("shape negative", setk("shape", (-8, 8)), "shape[0]: expected an integer >= 0, got -8"),
    ("shape float", setk("shape", (8, 8.0)), "shape[1]: expected an integer, got 8.0"),
    ("shape bool", setk("shape", (8, True)), "shape[1]: expected an integer"),
    ("shape empty", setk("shape", ()), "shape: expected at least one dimension"),
    ("tiling length", setk("partition_tiling", (2,)),
     "partition_tiling: expected 2 entries like shape (8, 8), got (2,)"),
    ("tiling zero", setk("partition_tiling", (0, 2)), "partition_tiling[0]: expected an integer >= 1, got 0"),
    ("partitions list", setk("partitions", []), "partitions: expected a dict keyed by grid position, got list"),
    ("position missing", lambda d: (d["partitions"].pop((1, 1)), d)[1], "partitions: position (1, 1) is missing"),
    ("key dimensionality", move((1, 1), (1,)), "partitions: key (1,) is not a grid position (a tuple of 2 integers)"),
    ("key outside grid", move((1, 1), (2, 0)), "partitions: key (2, 0) lies outside the grid (2, 2)"),
    ("key string", move((1, 1), "1,1"), "partitions: key '1,1' is not a grid position"),
    ("entry not dict", setk("partitions", {**base()["partitions"], (0, 0): 5}), "partitions[(0, 0)]: expected a dict"),
    ("entry missing start", lambda d: (d["partitions"][(0, 1)].pop("start"), d)[1],
     "partitions[(0, 1)]: missing key 'start'"),
    ("entry missing location", lambda d: (d["partitions"][(0, 1)].pop("location"), d)[1],
     "partitions[(0, 1)]: missing key 'location'"),
    ("entry unknown key", setp((0, 0), "owner", 3), "partitions[(0, 0)]: unknown key 'owner'"),
    ("start length", setp((1, 0), "start", (4,)), "partitions[(1, 0)].start: expected 2 integers, got (4,)"),
    ("start list", setp((1, 0), "start", [4, 0]),
     "partitions[(1, 0)].start: expected a tuple of 2 integers, got [4, 0] (list)"),
    ("start str", setp((1, 0), "start", (4, "0")), "partitions[(1, 0)].start[1]: expected an integer, got '0'"),
    ("shape negative entry", setp((0, 1), "shape", (4, -4)),
     "partitions[(0, 1)].shape[1]: expected an integer >= 0, got -4"),
    ("overlap", both(setp((1, 0), "start", (3, 0)), setp((1, 1), "start", (3, 4))),
     "partitions[(1, 0)].start[0]: expected 4 (the prefix sum of the shapes before it along axis 0), got 3: the "
     "partitions overlap"),
    ("gap", both(setk("shape", (8, 9)), setp((0, 1), "start", (0, 5)), setp((1, 1), "start", (4, 5))),
     "partitions[(0, 1)].start[1]: expected 4 (the prefix sum of the shapes before it along axis 1), got 5: "
     "the partitions gap"),
    ("extents short", setk("shape", (9, 8)), "partitions: extents along axis 0 add up to 8, but shape[0] is 9"),
    ("past the shape", setp((1, 0), "shape", (5, 4)),
     "partitions[(1, 0)]: rows 4..9 along axis 0 reach past shape[0] = 8"),
    ("slab disagrees", both(setk("shape", (8, 8)), setp((1, 1), "shape", (3, 4))),
     "partitions[(1, 1)].shape[0]: 3 differs from 4 of partitions[(1, 0)]"),
    ("slab start disagrees",
     both(setp((1, 1), "start", (4, 4)), setp((0, 1), "start", (0, 3)), setp((0, 1), "shape", (4, 5))),
     "partitions[(1, 1)].shape[1]: 4 differs from 5 of partitions[(0, 1)]"),
    ("location not list", setp((0, 0), "location", "10.0.0.1"),
     "partitions[(0, 0)].location: expected a list of (IP, PID[, device]) tuples"),
    ("location empty", setp((0, 0), "location", []),
     "partitions[(0, 0)].location: expected at least one (IP, PID[, device]) tuple"),
    ("location arity", setp((0, 0), "location", [("10.0.0.1",)]),
     "partitions[(0, 0)].location[0]: expected a tuple (IP, PID[, device])"),
    ("location too long", setp((0, 0), "location", [("10.0.0.1", 1, "kDLCPU", 4)]),
     "partitions[(0, 0)].location[0]: expected a tuple"),
    ("ip not str", setp((0, 0), "location", [(10, 1)]),
     "partitions[(0, 0)].location[0]: IP must be a non-empty string, got 10"),
    ("ip empty", setp((0, 0), "location", [("", 1)]), "location[0]: IP must be a non-empty string"),
    ("pid negative", setp((1, 1), "location", [("10.0.0.1", -1)]),
     "partitions[(1, 1)].location[0]: PID must be a non-negative integer, got -1"),
    ("pid str", setp((1, 1), "location", [("10.0.0.1", "77")]), "PID must be a non-negative integer, got '77'"),
    ("device unknown", setp((0, 0), "location", [("10.0.0.1", 1, "GPU0")]),
     "partitions[(0, 0)].location[0]: device must be a DLPack device name"),
    ("device bad index", setp((0, 0), "location", [("10.0.0.1", 1, "kDLCUDA:x")]),
     "device must be a DLPack device name such as 'kDLCPU' or 'kDLCUDA:0', got 'kDLCUDA:x'"),
    ("second location bad", setp((0, 0), "location", [("10.0.0.1", 1), ("10.0.0.2", 1.5)]),
     "partitions[(0, 0)].location[1]: PID"),
    ("locals unknown", lambda d: {**spmd(), "locals": [(5, 5)]}, "locals[0]: (5, 5) is not a position in partitions"),
    ("locals twice", lambda d: {**spmd(), "locals": [(0, 0), (0, 0)]}, "locals[1]: (0, 0) is listed twice"),
    ("locals not list", lambda d: {**spmd(), "locals": "0,0"}, "locals: expected a list of grid positions, got str"),
    ("data None without locals", setp((0, 0), "data", None),
     "partitions[(0, 0)].data: is None, which only an SPMD view"),
    ("local data None", lambda d: {**spmd(), "locals": [(0, 0), (0, 1), (1, 0)]},
     "partitions[(1, 0)].data: is None although (1, 0) is in locals"),
    ("mixed data types", setp((1, 1), "data", [[1.0] * 4] * 4),
     "partitions[(1, 1)].data: a list, but partitions[(0, 0)].data is a ndarray"),
    ("get not callable", setk("get", "ray.get"), "get: expected a callable, got 'ray.get'"),
]


@pytest.mark.parametrize("case,mutate,message", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformation_is_refused_naming_the_field(case, mutate, message):
    with pytest.raises(fp.PartitionedError) as info:
        fp.validate(mutate(base()))
    assert message in str(info.value)


def test_at_least_thirty_distinct_malformations():
    assert len({m[2] for m in MALFORMED}) >= 30


def test_partitioned_error_is_a_value_error():
    assert issubclass(fp.PartitionedError, ValueError)


def test_valid_dicts_pass_and_are_returned():
    d = base()
    assert fp.validate(d) is d
    assert fp.validate(spmd())["locals"] == [(0, 0), (0, 1)]


def test_accepts_locations_with_devices_and_numpy_integers():
    d = base()
    d["partitions"][(0, 0)]["location"] = [("10.0.0.1", np.int64(5), "kDLCUDA:0"), ("h2", 6, "kDLCPU")]
    d["partitions"][(0, 0)]["start"] = (np.int64(0), 0)
    fp.validate(d)


def test_object_without_the_attribute():
    with pytest.raises(fp.PartitionedError, match="has no __partitioned__ attribute"):
        fp.validate(object())


def test_a_raising_property_becomes_a_partitioned_error():
    class Broken:
        @property
        def __partitioned__(self):
            raise RuntimeError("backend gone")

    with pytest.raises(fp.PartitionedError, match="could not be checked: RuntimeError: backend gone"):
        fp.validate(Broken())


def test_lambda_get_is_accepted_but_does_not_pickle():
    d = base()
    d["get"] = lambda x: x
    fp.validate(d)
    with pytest.raises(fp.PartitionedError, match=r"must pickle: get: .*use a module-level callable"):
        fp.validate(d, require_pickle=True)


def test_our_dicts_pickle():
    d = fp.validate(base(), require_pickle=True)
    back = pickle.loads(pickle.dumps(d))
    assert back["get"] == fp.IdentityGet()
    np.testing.assert_array_equal(back["partitions"][(1, 1)]["data"], d["partitions"][(1, 1)]["data"])


def test_huge_declared_grid_is_refused_without_enumerating_it():
    d = base()
    d["partition_tiling"] = (10**12, 10**12)
    d["shape"] = (10**12, 10**12)
    with pytest.raises(fp.PartitionedError, match="missing; a"):
        fp.validate(d)


def test_the_top_level_exports_client_and_dataset_but_not_the_wire_module():
    import subprocess
    import sys

    code = ("import sys, flightpart as fp; assert 'flightpart.client' not in sys.modules; "
            "from flightpart.client import Client, Dataset; assert fp.Client is Client and fp.Dataset is Dataset; "
            "assert {'Client', 'Dataset'} <= set(fp.__all__) and 'wire' not in fp.__all__")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
