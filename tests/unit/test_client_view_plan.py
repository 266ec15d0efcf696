"""View is a plain immutable value: deriving a view never changes the one it came from. No cluster needed."""
import dataclasses

import pyarrow as pa
import pytest

from flightpart.client.dataset import Dataset
from flightpart.client.view import View
from flightpart.wire import VersionInfo


def test_default_view_selects_everything():
    v = View()
    assert (v.columns, v.rows, v.spmd, v.order, v.filter, v.matched, v.halo) == (None,) * 7


def test_view_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        View().rows = (0, 1)


def test_replace_returns_a_new_view_and_leaves_the_old_one():
    v = View(rows=(0, 10))
    w = v.replace(rows=(2, 5))
    assert v.rows == (0, 10) and w.rows == (2, 5)


def test_replace_keeps_the_fields_it_is_not_given():
    v = View(rows=(0, 10), spmd=(1, 4))
    assert v.replace(matched=(3, 4)) == View(rows=(0, 10), spmd=(1, 4), matched=(3, 4))


def test_replace_refuses_an_unknown_field():
    with pytest.raises(TypeError):
        View().replace(colums=None)


def test_replace_turns_a_list_order_into_a_tuple():
    assert View().replace(order=["b", "a"]).order == ("b", "a")


def test_views_with_the_same_fields_are_equal():
    assert View(rows=(1, 2), order=("a",)) == View(rows=(1, 2), order=("a",))
    assert View(rows=(1, 2)) != View(rows=(1, 3))


def test_rank_and_nranks_come_from_spmd():
    assert (View(spmd=(2, 5)).rank, View(spmd=(2, 5)).nranks) == (2, 5)


def test_rank_and_nranks_are_none_outside_spmd():
    assert (View().rank, View().nranks) == (None, None)


def test_dropping_spmd_clears_rank():
    assert View(spmd=(0, 2)).replace(spmd=None, halo=None).rank is None


def _dataset() -> Dataset:
    """A Dataset over metadata only: nothing here reads data, so no server is involved."""
    schema = pa.schema([("a", pa.int64()), ("b", pa.float64())])
    return Dataset(VersionInfo("d", 1, schema, (10, 2), (1, 1), ()), get=None)


def test_dataset_view_of_a_whole_version_is_the_default_view():
    assert _dataset().view == View()


def test_with_view_keeps_name_version_and_schema():
    d = _dataset().with_view(View(rows=(2, 4)))
    assert (d.name, d.version, d.schema.names) == ("d", 1, ["a", "b"])
    assert d.view.rows == (2, 4)


def test_slicing_derives_a_row_range_and_leaves_the_source():
    d = _dataset()
    s = d[2:5]
    assert s.view.rows == (2, 5) and d.view.rows is None


def test_select_records_the_users_order():
    assert _dataset().select(["b", "a"]).view.order == ("b", "a")


def test_dataset_rank_is_none_without_spmd():
    d = _dataset()
    assert (d.rank, d.nranks) == (None, None)


def test_dataset_rank_follows_its_view():
    d = _dataset().with_view(View(spmd=(1, 3)))
    assert (d.rank, d.nranks) == (1, 3)




def test_filter_then_slice_keeps_the_filter():
    d = _dataset().filter("a > 1")
    assert d.view.filter is not None and d.view.rows is None


def test_with_view_does_not_change_the_source_dataset():
    d = _dataset()
    d.with_view(View(rows=(0, 1), spmd=(0, 2)))
    assert d.view == View() and d.rank is None


def test_views_hash_when_their_fields_do():
    assert hash(View(rows=(1, 2))) == hash(View(rows=(1, 2)))


def test_select_of_an_unknown_column_is_refused_before_any_read():
    with pytest.raises(KeyError, match="no column 'nope'"):
        _dataset().select(["nope"])
