"""The order saga as a Temporal workflow: the steps of ``core.workflow.CURRENT`` in order.
A refused step was not applied: the steps done before it are undone, last first. A step
whose outcome is unknown (its retries or its deadline ran out) is undone too, before the
ones before it; if it cannot be undone, the order stops in Error. That is the app's rule
(``core/lifecycle.py``: "refused: undo steps < k; gave up: undo steps ≤ k; k cannot be
undone: Error").

Temporal's saga guidance: compensations are idempotent and retried (the same activity and
retry policy); one that still fails is recorded, the others go on, and the order ends in
Error for a person to look at. The imports of the saga's data and of the activity pass
through the workflow sandbox (``workflow.unsafe.imports_passed_through()``), as Temporal's
docs recommend for deterministic modules in other files: imported once, not per workflow.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from benchmarks.temporal_peer.activities import RemoteActivities
    from benchmarks.temporal_peer.saga import PERMANENT, STEPS, WORKFLOW, RemoteCall, SagaInput, SagaResult, SagaStep
    from core.models import ProcessState
    from core.workflow import Kind


def _refused(error: ActivityError) -> bool:
    """The remote refused the call (a 4xx): nothing was applied. Anything else (retries or
    the deadline ran out) leaves the outcome unknown."""
    cause = error.cause
    return isinstance(cause, ApplicationError) and cause.type == PERMANENT


@workflow.defn(name=WORKFLOW)
class OrderSaga:
    @workflow.run
    async def run(self, saga: SagaInput) -> SagaResult:
        outcome = SagaResult(saga.order_id, ProcessState.PROCESSED.value)
        done: list[tuple[SagaStep, dict | None]] = []  # what to undo, with the forward result
        for step in STEPS:
            try:
                outcome.results[step.name] = result = await self._call(saga, step, Kind.ACTION, step.action)
            except ActivityError as error:
                refused = _refused(error)
                outcome.reason = f"{step.name} {'refused' if refused else 'gave up'}: {error.cause or error}"
                if not refused:
                    if step.compensate is None:  # it may have been applied and cannot be undone
                        outcome.state = ProcessState.ERROR.value
                        return outcome
                    done.append((step, None))
                await self._undo(saga, done, outcome)
                return outcome
            if step.compensate is not None:
                done.append((step, result))
        return outcome

    async def _undo(self, saga: SagaInput, done: list[tuple[SagaStep, dict | None]], outcome: SagaResult) -> None:
        """Compensate ``done`` last first; Compensated, or Error if a compensation failed."""
        for step, result in reversed(done):
            try:
                outcome.undone.append(await self._call(saga, step, Kind.COMPENSATION, step.compensate, result))
            except ActivityError:
                outcome.failed.append(step.name)
        outcome.state = (ProcessState.ERROR if outcome.failed else ProcessState.COMPENSATED).value

    async def _call(self, saga: SagaInput, step: SagaStep, kind: Kind, action: str, result: dict | None = None) -> dict:
        call = RemoteCall(saga.order_id, step.name, step.remote, action, kind.value, saga.order, result,
                          lookup=step.lookup and kind is Kind.ACTION)
        return await workflow.execute_activity_method(
            RemoteActivities.call_remote, call, start_to_close_timeout=step.policy.call_timeout,
            schedule_to_close_timeout=step.policy.step_deadline, retry_policy=step.policy.retry,
        )
