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

from adapters.order_cache import OrderCache
from core import claims, lifecycle
from core.models import (
    FIRST_CLAIM_PREFIX,
    AgentRequest,
    AgentResponse,
    Context,
    Nudge,
    OrderRequest,
    OrderState,
    Outcome,
    ProcessState,
    first_claim_key,
)
from core.workflow import Kind
from devtools.orders import order_dict
from scheduler import cancellation, dispatch
from supervisor import supervision
from tests.unit.test_workflow import DEFAULTS, POLICY, World

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


def test_an_empty_reply_to_is_none_so_the_true_response_to_a_first_claim_from_the_nudge_counts():
    """A client may send a ReplyTo of no characters (Service Bus hands it on as such). It names no queue, and the
    table gives an empty text back as none: the state the submission writes and nudges with must say none too, or
    the first claim made from the nudge sends a fence the row as read contradicts, and the agent's true response is
    dropped as forged (the step then waits out its timeout for the supervisor)."""
    w = World()
    order = OrderRequest.model_validate(order_dict("o-1", lines=1))
    made = w.store.create_order(order, workflow=w.definition, reply_to="", now=w.now,
                                pending_timeout=timedelta(seconds=30))
    assert made.state.reply_to is None and made.record.state.reply_to is None
    nudge = Nudge(order_id="o-1", state=made.state, document=order.document())
    request = dispatch.schedule(nudge, scheduler=w.scheduler, now=w.now)
    assert request is not None and request.context.fence == w.state()
    after = w.answer()
    assert after is not None and (after.step, after.attempt) == ("charge", 2)


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


def sealed(w: World, order_id: str = "o-1") -> bool:
    return any(key.startswith(FIRST_CLAIM_PREFIX) for key in w.table.rows(order_id))


def forgery(w: World, submitted: OrderState, document: str, order_id: str = "o-1") -> Nudge:
    """What someone who can send to the scheduler's queue, and has read the row's current ETag and the order's
    document, sends: the submission's snapshot (a new order's fields) with that ETag, and the real document."""
    return Nudge(order_id=order_id, state=submitted.model_copy(update={"etag": w.state(order_id).etag}),
                 document=document)


def sweep(w: World) -> None:
    """The supervisor's sweep at the world's clock (every index row old enough to be read)."""
    supervision.sweep(store=w.store, publisher=w.publisher, nudger=w.nudger, policy=POLICY, now=w.now,
                      alerts_queue="alerts")


def test_a_forged_first_claim_after_a_first_claim_on_the_read_path_is_dropped():
    """The review's first reproduction. The order's first claim is made on the read path (its nudge carries no
    document: an order over 32 KiB, or a first claim that lost its race), its charge line claimed since (attempt
    2); then the submission's snapshot with the row's current ETag and the real document. The seal went with that
    first claim, so the transaction fails whole, and the row, read, tells the snapshot's contents are not its own:
    the charge line stays at attempt 2 and no reserve request is sent again."""
    w = World()
    submitted, document = created(w)
    request = dispatch.schedule(Nudge(order_id="o-1", state=submitted), scheduler=w.scheduler, now=w.now)
    assert request is not None and request.attempt == 1 and not sealed(w)
    w.answer()
    row, sent = w.state(), w.sent()
    assert (row.process_state, row.step, row.attempt) == (ProcessState.PROCESSING, "charge", 2)
    assert dispatch.schedule(forgery(w, submitted, document), scheduler=w.scheduler, now=w.now) is None
    assert w.state() == row and w.sent() == sent


def test_a_forged_first_claim_after_a_cancel_of_a_never_claimed_order_starts_no_step():
    """The review's second reproduction: a cancel recorded on an order never claimed, then a first-claim nudge
    whose snapshot has no cancel (the submission's) with the row's current ETag. The cancel consumed the seal: the
    nudge is dropped as forged, and the cancel's own nudge ends the order on the row, with no call anywhere."""
    w = World()
    submitted, document = created(w)
    cancellation.cancel("o-1", reason="asked", by="ops", store=w.store, publisher=w.publisher, nudger=w.nudger,
                        now=w.now)
    assert not sealed(w)
    row = w.state()
    assert dispatch.schedule(forgery(w, submitted, document), scheduler=w.scheduler, now=w.now) is None
    assert w.state() == row and w.publisher.requests == []
    nudge, _ = w.nudger.nudges[-1]
    assert dispatch.schedule(nudge, scheduler=w.scheduler, now=w.now) is None
    assert w.state().process_state is ProcessState.COMPENSATED and w.publisher.requests == []


def test_a_forged_first_claim_after_a_supervisor_renudge_is_decided_on_the_row():
    """A never-claimed order whose nudge was lost: the supervisor re-nudges it (a write over a Pending row). The
    seal goes with that write, so a first-claim nudge with the row's new ETag is decided on the row as read (one
    partition query): what the row warrants, the first attempt of reserve with the order's own document."""
    w = World()
    submitted, document = created(w)
    w.now = submitted.complete_by + timedelta(seconds=1)
    sweep(w)
    assert w.state().complete_by > w.now and not sealed(w)
    nudge = forgery(w, submitted, document)
    before = w.table.ops.copy()
    request = dispatch.schedule(nudge, scheduler=w.scheduler, now=w.now)
    assert w.table.ops - before == {"transaction": 1, "query": 1, "update": 1}  # the seal's 404, the read, the claim
    assert request is not None and (request.step, request.attempt) == ("reserve", 1)
    assert request.context.order == json.loads(document)


def test_a_forged_first_claim_after_a_supervisor_retry_of_an_order_claimed_before_the_seal_went_with_writes():
    """An order an older version claimed on the read path, leaving its seal: the supervisor resets its timed-out
    reserve line (Pending, one failure) and, reading the partition before it writes, consumes the seal. The
    submission's snapshot with the row's ETag is then dropped as forged, not claimed as attempt 1 again; the
    supervisor's own nudge claims attempt 2."""
    w = World()
    submitted, document = created(w)
    claim = lifecycle.claim(submitted, w.definition, "old", w.now, DEFAULTS, pending_timeout=POLICY.pending_timeout)
    w.store.write(submitted, claim.state)  # the older version's read path: the state row only
    assert sealed(w)
    w.now = claim.state.complete_by + timedelta(seconds=1)
    sweep(w)
    row = w.state()
    assert (row.process_state, row.attempt, row.failure_count) == (ProcessState.PENDING, 1, 1) and not sealed(w)
    assert dispatch.schedule(forgery(w, submitted, document), scheduler=w.scheduler, now=w.now) is None
    assert w.state() == row and w.publisher.requests == []
    nudge, delay = w.nudger.nudges[-1]
    w.now += delay
    request = dispatch.schedule(nudge, scheduler=w.scheduler, now=w.now)
    assert request is not None and (request.step, request.attempt) == ("reserve", 2)


def test_a_first_claim_snapshot_that_names_a_cancel_is_not_a_new_orders():
    """:func:`dispatch.pristine` pins every field a decision reads, the cancel's too: a snapshot naming a cancel
    reason the row has not (the claim's fence would carry it, and the agent's true response be dropped as forged)
    is decided on the row and dropped; the seal stays, and the submission's own nudge still claims with no read."""
    w = World()
    submitted, document = created(w)
    for lie in ({"cancel_reason": "x"}, {"cancelled_by": "x"}, {"cancel_requested_at": w.now}):
        assert dispatch.pristine(submitted) and not dispatch.pristine(submitted.model_copy(update=lie))
    lying = Nudge(order_id="o-1", state=submitted.model_copy(update={"cancel_reason": "not the row's"}),
                  document=document)
    assert dispatch.schedule(lying, scheduler=w.scheduler, now=w.now) is None
    assert w.publisher.requests == [] and sealed(w)
    before = w.table.ops.copy()
    first_claim(w, submitted, document)
    assert w.table.ops - before == {"transaction": 1} and w.last.context.fence.cancel_reason is None


def test_a_first_claim_writes_its_own_times_whatever_times_the_snapshot_names():
    """The claim's MERGE writes what differs from its base. Were the base the snapshot, one naming the claim's own
    CompleteBy and UpdatedAt (its times are not proven) would keep the row's creation times in their place, and the
    row would time out before the request it sent may still act. The claim writes its times whatever the snapshot
    says: the row holds the request's Complete-By."""
    w = World()
    submitted, document = created(w)
    w.now += timedelta(seconds=5)
    own = w.now + timedelta(seconds=DEFAULTS.timeout_seconds)
    assert submitted.complete_by != own
    lying = Nudge(order_id="o-1", state=submitted.model_copy(update={"complete_by": own, "updated_at": w.now}),
                  document=document)
    before = w.table.ops.copy()
    request = dispatch.schedule(lying, scheduler=w.scheduler, now=w.now)
    assert w.table.ops - before == {"transaction": 1}
    row = w.state()
    assert request is not None and row.complete_by == request.complete_by == own and row.updated_at == w.now


def cached_world() -> World:
    return World(cache=OrderCache(max_age=timedelta(minutes=10)))


def submitted_here(w: World) -> tuple[OrderState, str]:
    """An order this scheduler's process submitted: its creation kept in the cache, as scheduler.submission does."""
    order = OrderRequest.model_validate(order_dict("o-1", lines=1))
    made = w.store.create_order(
        order, workflow=w.definition, reply_to="replies", now=w.now, pending_timeout=POLICY.pending_timeout
    )
    w.scheduler.cache.put(made.record, w.now)
    return made.state, order.document()


def first_claim(w: World, submitted: OrderState, document: str) -> None:
    dispatch.schedule(Nudge(order_id="o-1", state=submitted, document=document), scheduler=w.scheduler, now=w.now)


def claim_on_a_read(w: World, submitted: OrderState, document: str) -> None:
    dispatch.schedule(Nudge(order_id="o-1", state=submitted), scheduler=w.scheduler, now=w.now)


def cancel(w: World, *_) -> None:
    cancellation.cancel("o-1", reason="asked", by="ops", store=w.store, publisher=w.publisher, nudger=w.nudger,
                        now=w.now)


def renudge(w: World, submitted: OrderState, _document: str) -> None:
    w.now = submitted.complete_by + timedelta(seconds=1)
    sweep(w)


@pytest.mark.parametrize(
    ("world", "submit", "write"),
    [(World, created, first_claim), (cached_world, submitted_here, first_claim), (World, created, claim_on_a_read),
     (World, created, cancel), (World, created, renudge)],
    ids=["first claim from the nudge", "first claim on the rows this process wrote", "claim on a read", "cancel",
         "supervisor re-nudge"],
)
def test_the_first_write_over_an_order_deletes_its_seal_in_the_same_transaction(world, submit, write):
    w = world()
    submitted, document = submit(w)
    record = w.store.read("o-1")
    assert record.seal == first_claim_key(submitted.workflow, submitted.workflow_version, "replies", document)
    etag = record.state.etag
    write(w, submitted, document)
    assert w.state().etag != etag and not sealed(w) and w.store.read("o-1").seal is None
    if w.scheduler.cache is not None:
        assert w.scheduler.cache.get("o-1", w.now) == w.store.read("o-1")  # as a read shows it: no seal


def claimed_by_an_older_version(w: World) -> tuple[OrderState, str, OrderState]:
    """An order an older version claimed on its read path, which wrote the state row only: the seal is left."""
    submitted, document = created(w)
    claim = lifecycle.claim(submitted, w.definition, "old", w.now, DEFAULTS, pending_timeout=POLICY.pending_timeout)
    claimed = w.store.write(submitted, claim.state)
    assert sealed(w)
    return submitted, document, claimed


def answered(w: World, claimed: OrderState, document: str) -> None:
    response = AgentResponse(
        order_id="o-1", step="reserve", kind=Kind.ACTION, attempt=claimed.attempt, outcome=Outcome.SUCCEEDED,
        result={"confirmation": "r-1"}, context=Context(fence=claimed, order=json.loads(document), results={}),
    )
    assert dispatch.record(response, scheduler=w.scheduler, now=w.now) is not None


def reset(w: World, claimed: OrderState, _document: str) -> None:
    w.now = claimed.complete_by + timedelta(seconds=1)
    sweep(w)


def resubmitted(w: World, claimed: OrderState, _document: str) -> None:
    w.store.write(claimed, lifecycle.fail(claimed, "stopped by an older version", w.now))  # its write: no seal deleted
    supervision.resubmit("o-1", store=w.store, nudger=w.nudger, now=w.now, pending_timeout=POLICY.pending_timeout)


@pytest.mark.parametrize("write", [answered, cancel, reset, resubmitted])
def test_a_seal_an_older_version_left_goes_with_the_next_write(write):
    """Orders written before every write deleted the seal may hold one on a row long claimed; the next write over
    them, whoever writes, deletes it, so the submission's snapshot with the row's ETag cannot claim them again."""
    w = World()
    submitted, document, claimed = claimed_by_an_older_version(w)
    write(w, claimed, document)
    assert not sealed(w)
    row, sent = w.state(), len(w.publisher.requests)
    assert dispatch.schedule(forgery(w, submitted, document), scheduler=w.scheduler, now=w.now) is None
    assert w.state() == row and len(w.publisher.requests) == sent


def without_its_seal(w: World) -> tuple[OrderState, str]:
    """A new order as written before submission wrote a seal: Pending, never claimed, no seal row."""
    submitted, document = created(w)
    w.table.delete_entity("o-1", w.store.read("o-1").seal)
    return submitted, document


@pytest.mark.parametrize(("write", "failed"), [(first_claim, 1), (cancel, 0), (renudge, 0)],
                         ids=["first claim", "cancel", "supervisor re-nudge"])
def test_a_new_order_without_a_seal_is_written_once_after_a_read(write, failed):
    """A row that looks new but has no seal (an order written before seals were): the first claim's transaction
    fails once (404), and it and every other writer go on the partition as read, which shows no seal to delete:
    no loop of 404s, one write (a single MERGE) each."""
    w = World()
    submitted, document = without_its_seal(w)
    before = w.table.ops.copy()
    write(w, submitted, document)
    used = w.table.ops - before
    assert (used["transaction"], used["update"]) == (failed, 1), used
    assert w.state().etag != submitted.etag


def test_a_cached_creation_whose_seal_is_gone_is_claimed_after_one_failed_transaction():
    """The process's own creation says the seal is there, the partition no longer has it (a write of an older
    version, or an operator): the cached claim's transaction fails (404), the entry is dropped, and the claim is
    made on a read, once."""
    w = cached_world()
    submitted, document = submitted_here(w)
    w.table.delete_entity("o-1", w.store.read("o-1").seal)
    before = w.table.ops.copy()
    first_claim(w, submitted, document)
    assert w.table.ops - before == {"transaction": 1, "query": 1, "update": 1}  # the 404, a read, the claim
    assert w.state().process_state is ProcessState.PROCESSING and w.state().attempt == 1
    assert len(w.publisher.requests) == 1


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
