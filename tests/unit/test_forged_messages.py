"""Forged and hostile internal messages, as an attacker with send rights on one queue
writes them: the checks at the edge (core/claims.py) refuse what no copy of the app
sends, and the scheduler decides on the row it reads, never on a message's snapshot or
fence, so even a message that passes the checks cannot rewrite an order.

Over the in-memory table that enforces ETags (tests/memtable.py); the blueprints' edge
(parse, check, drop and count) is exercised through the real host in
tests/e2e/test_hostile_messages.py.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from core import claims
from core.models import (
    FIRST_CLAIM_PREFIX,
    AgentRequest,
    AgentResponse,
    Context,
    Nudge,
    OrderRequest,
    Outcome,
    ProcessState,
    first_claim_key,
)
from core.workflow import Kind
from devtools.orders import order_dict
from scheduler import dispatch
from tests.unit.test_workflow import World

ETAG = "W/\"datetime'2026-11-24T23%3A25%3A17.1234567Z'\""


def processed() -> tuple[World, AgentRequest]:
    """An order run to Processed; the last request is the real one for its last step."""
    w = World()
    w.submit()
    w.answer()
    w.answer()
    last = w.last
    w.answer()
    assert w.state().process_state is ProcessState.PROCESSED
    return w, last


def edited(message, **paths):
    """``message`` as JSON with fields changed by dotted path (``context.fence.etag``), parsed back."""
    document = json.loads(message.model_dump_json())
    for path, value in paths.items():
        *parents, leaf = path.split("__")
        target = document
        for part in parents:
            target = target[part]
        target[leaf] = value
    return type(message).model_validate(document)


def response_to(request: AgentRequest, outcome: Outcome = Outcome.FAILED_PERMANENT) -> AgentResponse:
    return AgentResponse(
        order_id=request.order_id, step=request.step, kind=request.kind, attempt=request.attempt, outcome=outcome,
        error="forged" if outcome is not Outcome.SUCCEEDED else None, context=request.context,
    )


@pytest.mark.parametrize("etag", ["", "*", 'W/"abc"', 'W/"datetime\'yesterday\'"', ETAG + " ", "W/\"datetime'2026-11-24T23:25:17Z'\""])
def test_an_etag_that_is_not_of_table_storages_form_is_refused(etag):
    assert claims.concrete_etag(ETAG)
    assert not claims.concrete_etag(etag)
    assert not claims.concrete_etag(None)


def test_the_in_memory_table_gives_etags_of_table_storages_form_unique_and_increasing():
    w = World()
    w.submit()
    etags = [w.state().etag]
    for _ in range(3):
        w.answer()
        etags.append(w.state().etag)
    assert all(claims.concrete_etag(e) for e in etags), etags
    assert len(set(etags)) == len(etags) and etags == sorted(etags)


def test_a_real_response_passes_the_checks():
    w = World()
    w.submit()
    assert claims.check_response(response_to(w.last, Outcome.SUCCEEDED)) is None
    assert claims.check_request(w.last, w.last.remote) is None
    assert claims.check_nudge(Nudge(order_id="o-1", state=w.state())) is None


def test_the_reported_hole_a_wildcard_fence_cannot_undo_a_processed_order():
    """The issue's attack: a response for the last step, refused, whose fence carries
    ETag ``*``. Refused at the edge; and had it got past, the row (Processed) decides."""
    w, last = processed()
    forged = edited(response_to(last), context__fence__etag="*")
    assert "ETag" in claims.check_response(forged)
    before = (w.state(), w.lines(), len(w.publisher.requests))
    assert dispatch.record(forged, scheduler=w.scheduler, now=w.now) is None
    assert (w.state(), w.lines(), len(w.publisher.requests)) == before  # no refund, no release sent


def test_a_fence_with_the_rows_current_etag_and_forged_contents_is_dropped_as_forged():
    """Someone who knows the row's current ETag (here read from the table) and writes a
    fence that says Processing at the last step: the ETag matches, the contents do not."""
    w, last = processed()
    row = w.state()
    forged = edited(response_to(last), context__fence__etag=row.etag)
    assert claims.check_response(forged) is None  # every field is plausible on its own
    assert dispatch.forged(forged.context.fence, row)
    assert dispatch.record(forged, scheduler=w.scheduler, now=w.now) is None
    assert w.state() == row
    assert ("compensation", "refund") not in w.sent() and ("compensation", "release") not in w.sent()


def test_a_replayed_real_response_with_an_edited_outcome_is_stale():
    """A real response of an earlier attempt, sent again with its outcome turned into a
    refusal: its fence is real but old (another ETag), the row has moved on."""
    w = World()
    w.submit()
    first = w.last
    w.answer()
    row = w.state()
    replay = response_to(first)
    assert claims.check_response(replay) is None
    assert dispatch.record(replay, scheduler=w.scheduler, now=w.now) is None
    assert w.state() == row


def test_a_nudge_snapshot_claiming_error_or_a_later_step_moves_nothing():
    """A snapshot is a claim: with the row's current ETag and other contents it is dropped;
    with a stale one the scheduler claims the line the row names, not the snapshot's."""
    w = World()
    w.submit()
    w.answer()
    w.answer(Outcome.POSTPONED)  # the charge line is back to Pending, nudged later
    row = w.state()
    assert row.process_state is ProcessState.PENDING and row.step == "charge"
    sent = len(w.publisher.requests)
    lying = row.model_copy(update={"process_state": ProcessState.ERROR, "gave_up": True})
    assert dispatch.schedule(Nudge(order_id="o-1", state=lying), scheduler=w.scheduler, now=w.now) is None
    assert w.state() == row and len(w.publisher.requests) == sent
    skipping = row.model_copy(update={"step_index": 2, "step": "ship", "etag": ETAG})  # a stale ETag
    request = dispatch.schedule(Nudge(order_id="o-1", state=skipping), scheduler=w.scheduler, now=w.now)
    assert request is not None and request.step == "charge" and w.state().step == "charge"


def created(w: World, order_id: str = "o-1"):
    """An order written as submission writes it, not yet claimed: its state and document."""
    order = OrderRequest.model_validate(order_dict(order_id, lines=1))
    made = w.store.create_order(
        order, workflow=w.definition, reply_to="replies", now=w.now, pending_timeout=timedelta(seconds=30)
    )
    return made.state, order.document()


def test_the_first_claim_from_the_submissions_nudge_reads_nothing_and_consumes_the_seal():
    w = World()
    state, document = created(w)
    assert any(key.startswith(FIRST_CLAIM_PREFIX) for key in w.table.rows("o-1"))
    before = w.table.ops.copy()
    request = dispatch.schedule(Nudge(order_id="o-1", state=state, document=document), scheduler=w.scheduler, now=w.now)
    assert request is not None and request.step == "reserve" and request.attempt == 1
    assert w.table.ops - before == {"transaction": 1}  # the claim's MERGE and the seal's delete, no read
    assert not any(key.startswith(FIRST_CLAIM_PREFIX) for key in w.table.rows("o-1"))
    # The same nudge again (a redelivery): no seal left, so the row is read, and it is not Pending.
    before = w.table.ops.copy()
    assert dispatch.schedule(Nudge(order_id="o-1", state=state, document=document), scheduler=w.scheduler, now=w.now) is None
    assert (w.table.ops - before)["query"] == 1 and len(w.publisher.requests) == 1


@pytest.mark.parametrize(
    "lie",
    [{"document": json.dumps({"order_id": "o-1", "total": "0.01"})}, {"reply_to": "alerts"},
     {"step_index": 2, "step": "ship"}, {"attempt": 0, "etag": "*"}],
)
def test_a_first_claim_nudge_that_lies_is_claimed_as_the_row_says_or_not_at_all(lie):
    """A forged document or ReplyTo fails the seal (the key digests them); a snapshot
    that is not a new order's takes the read path; the order is claimed from its rows."""
    w = World()
    state, document = created(w)
    document = lie.pop("document", document)
    nudge = Nudge(order_id="o-1", state=state.model_copy(update=lie), document=document)
    request = dispatch.schedule(nudge, scheduler=w.scheduler, now=w.now)
    real = json.loads(w.store.read("o-1").document)
    if request is not None:  # claimed from the rows: the real document, the real line
        assert request.step == "reserve" and request.context.order == real
        assert w.publisher.statuses[-1].order_id == "o-1"
    assert w.state().reply_to == "replies" and w.state().step == "reserve"
    assert all(r.context.order == real for _, r in w.publisher.requests)


def test_a_seal_names_the_workflow_the_reply_to_and_the_document():
    keys = {
        first_claim_key("order", 1, "replies", "{}"), first_claim_key("order", 2, "replies", "{}"),
        first_claim_key("order", 1, None, "{}"), first_claim_key("order", 1, "replies", "{ }"),
    }
    assert len(keys) == 4 and all(k.startswith(FIRST_CLAIM_PREFIX) and len(k) < 60 for k in keys)


def reason(check, message, **paths) -> str | None:
    return check(edited(message, **paths))


@pytest.mark.parametrize(
    ("paths", "expected"),
    [
        ({"order_id": "a/b"}, "not a valid order id"),
        ({"order_id": "", "context__fence__order_id": ""}, "not a valid order id"),
        ({"order_id": "o-other"}, "fence is of order"),
        ({"attempt": 2**40, "context__fence__attempt": 2**40}, "attempt"),
        ({"attempt": 0, "context__fence__attempt": 0}, "attempt"),
        ({"step": "nope", "context__fence__step": "nope"}, "is not step"),
        ({"context__fence__step_index": -1}, "step index -1"),
        ({"context__fence__step_index": 7}, "step index 7"),
        ({"step": "charge"}, "not the line it names"),
        ({"kind": "compensation"}, "not the line it names"),
        ({"context__fence__workflow": "other"}, "no workflow other"),
        ({"context__fence__workflow_version": 99}, "no workflow order v99"),
        ({"context__fence__process_state": "Processed"}, "not a claimed"),
        ({"context__fence__etag": None}, "ETag"),
        ({"context__fence__plan": [5]}, "plan or failed"),
        ({"result": {"blob": "x" * 1_000_000}}, "larger than"),
        ({"outcome": "postponed", "retry_after_seconds": 1e308}, "retry_after_seconds"),
        ({"outcome": "postponed", "retry_after_seconds": -5}, "retry_after_seconds"),
    ],
)
def test_a_response_that_no_copy_of_the_app_sends_is_refused_with_its_reason(paths, expected):
    w = World()
    w.submit()
    response = response_to(w.last, Outcome.SUCCEEDED)
    found = reason(claims.check_response, response, **paths)
    assert found is not None and expected in found, found


def test_a_compensation_response_for_a_step_that_has_none_is_refused():
    w, last = processed()  # ship has no compensation
    forged = edited(response_to(last), kind="compensation", context__fence__kind="compensation")
    assert "has no compensation" in claims.check_response(forged)


@pytest.mark.parametrize(
    ("paths", "remote", "expected"),
    [
        ({"action": "../admin"}, "inventory", "is not the action"),
        ({"action": "release"}, "inventory", "is not the action"),
        ({"remote": "payments"}, "inventory", "runs at"),
        ({}, "payments", "runs at"),
    ],
)
def test_a_request_naming_another_action_or_remote_is_refused(paths, remote, expected):
    w = World()
    w.submit()
    found = claims.check_request(edited(w.last, **paths), remote)
    assert found is not None and expected in found, found


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"order_id": "../../x"}, "not a valid order id"),
        ({"state__order_id": "o-9"}, "snapshot is of order"),
        ({"state__etag": "*"}, "ETag"),
        ({"state__etag": ""}, "ETag"),
        ({"state__step_index": 3}, "step index 3"),
        ({"state__failed": [-1]}, "plan or failed"),
    ],
)
def test_a_nudge_that_no_copy_of_the_app_sends_is_refused(changes, expected):
    w = World()
    w.submit()
    nudge = Nudge(order_id="o-1", state=w.state())
    found = reason(claims.check_nudge, nudge, **changes)
    assert found is not None and expected in found, found


def test_a_nudge_snapshot_of_a_workflow_the_app_no_longer_has_is_left_to_the_row():
    """Not refused: the row decides, and an order whose definition is gone ends in Error."""
    w = World()
    w.submit()
    nudge = Nudge(order_id="o-1", state=w.state().model_copy(update={"workflow": "retired"}))
    assert claims.check_nudge(nudge) is None
    assert claims.check_nudge(Nudge(order_id="o-1")) is None


def test_context_carries_nothing_the_scheduler_trusts():
    """The order and results a response echoes are ignored: the next request carries
    the order and the results as the table holds them."""
    w = World()
    w.submit()
    request = w.last
    lie = Context(fence=request.context.fence, order={"order_id": "o-1", "total": "0.01"}, results={"x": {"y": 1}})
    response = AgentResponse(
        order_id="o-1", step="reserve", kind=Kind.ACTION, attempt=request.attempt, outcome=Outcome.SUCCEEDED,
        result={"confirmation": "r-1"}, context=lie,
    )
    dispatch.record(response, scheduler=w.scheduler, now=w.now)
    assert w.last.step == "charge"
    assert w.last.context.order == request.context.order
    assert w.last.context.results == {"reserve": {"confirmation": "r-1"}}


def test_the_hostile_corpus_says_what_the_checks_do_for_each_case():
    """devtools/corpus/hostile_messages.json, offline: each case parses, or not, and passes
    the checks, or not, as its expectation says (the e2e test sends them through the host)."""
    from pydantic import ValidationError

    from devtools.corpus.hostile import INVENTORY_REQUESTS, NUDGES, RESPONSES, base_messages, hostile_body, load_hostile_messages

    w, _ = processed()
    record = w.store.read("o-1")
    bases = base_messages(record.state, record.document, w.now)
    checks = {
        RESPONSES: (AgentResponse, claims.check_response),
        NUDGES: (Nudge, claims.check_nudge),
        INVENTORY_REQUESTS: (AgentRequest, lambda r: claims.check_request(r, "inventory")),
    }
    cases = load_hostile_messages()
    assert {c["queue"] for c in cases} == set(checks)
    assert {c["expect"].get("dropped") for c in cases} >= {"malformed", "untrusted", "forged", None}
    for case in cases:
        model, check = checks[case["queue"]]
        body = hostile_body(case, bases, current_etag=record.state.etag, other_order="o-2")
        try:
            message = model.model_validate_json(body)
        except (ValidationError, ValueError):
            assert case["expect"] == {"dropped": "malformed"}, case["name"]
            continue
        found = check(message)
        if case["expect"].get("dropped") == "untrusted":
            assert found is not None, case["name"]
        else:
            assert found is None and case["expect"] != {"dropped": "malformed"}, (case["name"], found)
            claimed = message.state if isinstance(message, Nudge) else message.context.fence
            assert dispatch.forged(claimed, record.state) == (case["expect"] == {"dropped": "forged"}), case["name"]


@pytest.mark.parametrize(
    "body",
    [b"", b"\xff\xfe", b"null", b"[" * 100_000, b'{"order_id": ' + b"9" * 5000 + b"}", b'{"order_id": NaN}',
     b'{"order_id": "o-1", "state": {"etag": "*"}}', "{\"order_id\": \"\u00e9\"}".encode("utf-16")],
)
def test_no_body_makes_the_edge_raise(body):
    """Whatever bytes arrive on an internal queue, the edge returns None (dropped)."""
    from adapters.wiring import parse_or_drop

    for model, check in ((Nudge, claims.check_nudge), (AgentResponse, claims.check_response),
                         (AgentRequest, lambda r: claims.check_request(r, "inventory"))):
        assert parse_or_drop(model, body, what="test", message_id=None, check=check) is None
