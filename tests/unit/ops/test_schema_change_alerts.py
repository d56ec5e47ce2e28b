"""Schema changes by kind, and the `schema_changed` alert they hold for a while, then let clear."""

from __future__ import annotations

import time

from ingest.config import AlertsConfig
from ingest.events import ColumnShape, RelationShape
from ingest.ops.health import AlertKind
from ingest.ops.metrics import REGISTRY
from ingest.ops.watch import SHAPE_CHANGES, Watcher
from ingest.sources.postgres.schema_changes import shape_change_kinds

INT4, INT8, TEXT = 23, 20, 25


def shape(*cols: tuple[str, int, int | None], identity: str = "d") -> RelationShape:
    """A shape of (name, type oid, key position) columns."""
    return RelationShape(
        1,
        "public",
        "t",
        identity,
        tuple(ColumnShape(n, oid, str(oid), -1, pk is not None, pk, "text") for n, oid, pk in cols),
        0,
    )


BASE = shape(("id", INT4, 1), ("name", TEXT, None), ("qty", INT4, None))


def test_each_kind_is_told_apart() -> None:
    added = shape(("id", INT4, 1), ("name", TEXT, None), ("qty", INT4, None), ("note", TEXT, None))
    assert shape_change_kinds(BASE, added) == {"added": ["note"]}
    assert shape_change_kinds(BASE, shape(("id", INT4, 1), ("qty", INT4, None))) == {"dropped": ["name"]}
    renamed_retyped = shape(("id", INT4, 1), ("title", TEXT, None), ("qty", INT8, None))
    assert shape_change_kinds(BASE, renamed_retyped) == {"renamed": ["name -> title"], "retyped": ["qty"]}
    # A key column renamed is the same key; another key (or identity) is a key change.
    assert shape_change_kinds(BASE, shape(("key", INT4, 1), ("name", TEXT, None), ("qty", INT4, None))) == {
        "renamed": ["id -> key"]
    }
    rekeyed = shape(("id", INT4, 1), ("name", TEXT, 2), ("qty", INT4, None))
    assert shape_change_kinds(BASE, rekeyed) == {"key_changed": ["(id) -> (id, name)"]}
    assert shape_change_kinds(BASE, shape(*[(c.name, c.type_oid, c.pk_position) for c in BASE.columns], identity="f"))
    # Dropping one column and adding another in one step: not a rename (the column counts differ).
    swapped = shape(("id", INT4, 1), ("qty", INT4, None), ("title", TEXT, None), ("x", INT4, None))
    assert shape_change_kinds(BASE, swapped) == {"added": ["title", "x"], "dropped": ["name"]}
    # A column a rule began to exclude left the shape, not the table; a masked one is no change.
    assert shape_change_kinds(BASE, shape(("id", INT4, 1), ("qty", INT4, None)), excluded=["name"]) == {}


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_a_change_holds_the_alert_then_it_clears() -> None:
    told: list[tuple[str, bool]] = []
    w = Watcher(
        "sc_src",
        AlertsConfig(),
        lambda: [],
        positions_interval_s=0,
        notify=lambda s, a, started: told.append((a.message, started)),
        schema_hold_s=0.5,
    )
    SHAPE_CHANGES.record("sc_src", "public.t", {"added": ["note"]})
    SHAPE_CHANGES.record("sc_src", "public.t", {})  # nothing a user sees: no report
    SHAPE_CHANGES.record("other_src", "public.t", {"dropped": ["x"]})
    w.poll()
    assert [(a.kind, a.table) for a in w.alerts] == [(AlertKind.SCHEMA_CHANGED, "public.t")]
    assert sample("changelake_alert_active", source="sc_src", alert="schema_changed") == 1
    assert sample("changelake_schema_changes_total", source="sc_src", table="public.t", kind="added") == 1
    SHAPE_CHANGES.record("sc_src", "public.t", {"renamed": ["a -> b"]})
    w.poll()  # the same table again while held: counted, the alert goes on, no second notice
    assert told == [("table public.t changed shape: added note", True)]
    assert sample("changelake_schema_changes_total", source="sc_src", table="public.t", kind="renamed") == 1
    time.sleep(0.6)
    w.poll()
    assert w.alerts == [] and [s for _m, s in told] == [True, False]
    assert sample("changelake_alert_active", source="sc_src", alert="schema_changed") == 0
