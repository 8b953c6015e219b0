"""The view definition a speed checkpoint records: what changes it, and the refusal's message."""

from __future__ import annotations

from infra.settings import Settings
from speed_layer.checkpoint_definition import differences, fingerprint, refusal, view_definition


def _with(**views: object) -> Settings:
    base = Settings()
    return base.model_copy(update={"views": base.views.model_copy(update=views)})


def test_slices_and_sketch_sizes_change_the_fingerprint_the_order_of_dims_does_not() -> None:
    base = fingerprint(view_definition(_with(slice_dims=["a", "b"])))
    assert fingerprint(view_definition(_with(slice_dims=["b", "a"]))) == base
    assert fingerprint(view_definition(_with(slice_dims=["a"]))) != base
    assert fingerprint(view_definition(_with(slice_dims=["a", "b"], top_k_items=2048))) != base


def test_the_refusal_names_each_change_and_the_way_out() -> None:
    old, new = view_definition(_with(slice_dims=[])), view_definition(_with(slice_dims=["country"], top_k_items=64))
    assert differences(old.as_json(), new) == ["slice_dims: [] -> ['country']", "top_k_items: 1024 -> 64"]
    text = refusal("/ckpt/speed_view", old.as_json(), new)
    assert "/ckpt/speed_view" in text and "TRENDS_SPEED__QUERY_NAME" in text and "trends batch run" in text
