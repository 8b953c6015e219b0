"""The view definition as a version: its fingerprint (unchanged by the move to views/) and each slice's own."""

from __future__ import annotations

from infra.settings import Settings
from views.definition import (
    GLOBAL_SLICE,
    definition_of,
    fingerprint,
    from_json,
    slice_fingerprint,
    to_json,
    view_definition,
    with_definition,
)


def test_the_fingerprint_is_the_one_checkpoints_recorded_before_the_move() -> None:
    # computed by speed_layer/checkpoint_definition.py before the definition moved to views/: existing checkpoints match
    assert fingerprint(definition_of([], 1024)) == "168d7f574dba9d9b"
    assert fingerprint(definition_of(["country"], 1024)) == "92fdacca06743583"
    assert fingerprint(definition_of(["device", "country"], 64)) == "580d78e35961ec4c"
    assert fingerprint(view_definition(Settings())) == "168d7f574dba9d9b"


def test_adding_a_dimension_keeps_every_existing_slice_and_defines_the_new_one() -> None:
    blue, green = definition_of(["country"], 1024), definition_of(["country", "device"], 1024)
    assert fingerprint(blue) != fingerprint(green)
    assert slice_fingerprint(blue, GLOBAL_SLICE) == slice_fingerprint(green, GLOBAL_SLICE)
    assert slice_fingerprint(blue, "country=US") == slice_fingerprint(green, "country=US") is not None
    assert slice_fingerprint(blue, "device=ios") is None
    assert slice_fingerprint(green, "device=ios") is not None
    # one dimension's slices share its fingerprint; another dimension's differ
    assert slice_fingerprint(green, "device=ios") == slice_fingerprint(green, "device=web")
    assert slice_fingerprint(green, "device=ios") != slice_fingerprint(green, "country=US")
    assert slice_fingerprint(green, GLOBAL_SLICE) != slice_fingerprint(green, "country=US")


def test_a_sketch_parameter_changes_every_slice() -> None:
    small, big = definition_of(["country"], 1024), definition_of(["country"], 2048)
    for slice_ in (GLOBAL_SLICE, "country=US"):
        assert slice_fingerprint(small, slice_) != slice_fingerprint(big, slice_)


def test_a_stored_definition_reads_back_and_becomes_settings() -> None:
    green = definition_of(["device", "country"], 64)
    assert from_json(to_json(green)) == green
    settings = with_definition(Settings(), from_json(to_json(green)))
    assert settings.views.slice_dims == ["country", "device"] and settings.views.top_k_items == 64
    assert fingerprint(view_definition(settings)) == fingerprint(green)


def test_the_row_types_carry_exactly_the_view_columns() -> None:
    """VIEW_COLUMNS is the contract; the row the layers write and the bucket serving merges follow it."""
    from dataclasses import fields

    from serving.served_row import ServedRow
    from views.definition import VIEW_COLUMNS
    from views.store.rows import ViewRow

    assert set(ViewRow._fields) == set(VIEW_COLUMNS)
    sketches = {c for c in VIEW_COLUMNS if c.endswith(("_hll", "_kll", "_fi"))}
    assert sketches <= {f.name for f in fields(ServedRow)}


# A definition as view_definitions stores it (to_json): the fingerprints of stored rows are compared with these.
STORED = (
    '{"bucket": "60 seconds", "columns": ["bucket_start", "slice", "events", "users_hll", "values_kll", "items_fi", '
    '"min_ts", "max_ts"], "global_slice": "*", "hll_lg_k": 12, "kll_k": 200, "slice_dims": ["device", "origin"], '
    '"top_k_items": 1024}'
)


def test_the_stored_form_and_every_fingerprint_stay_byte_identical() -> None:
    # pinned before the definition became a frozen model: stored rows, pointers and epochs name these
    built = definition_of(["origin", "device"], 1024)
    assert to_json(built) == STORED
    for d in (built, from_json(STORED)):
        assert fingerprint(d) == "85dcb4098889101f"
        assert slice_fingerprint(d, GLOBAL_SLICE) == "de92e244fe3410f7"
        assert slice_fingerprint(d, "origin=JFK") == "65ebadf26caefebe"
        assert slice_fingerprint(d, "country=US") is None
    small = definition_of(["origin"], 64)
    assert (fingerprint(small), slice_fingerprint(small, GLOBAL_SLICE), slice_fingerprint(small, "origin=X")) == (
        "563c2549d5e87087",
        "025732b383869218",
        "60acd1424174900e",
    )
