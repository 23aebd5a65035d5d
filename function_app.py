"""The Function app: builds FunctionApp() and registers the blueprints. No logic here."""

import gc

import azure.functions as func

from agents.blueprint import bp as agents
from api.blueprint import bp as api
from scheduler.blueprint import bp as scheduler
from supervisor.blueprint import bp as supervisor
from supervisor.retention import bp as retention

app = func.FunctionApp()
app.register_functions(scheduler)
app.register_functions(agents)
app.register_functions(supervisor)
app.register_functions(api)
app.register_functions(retention)

# What the imports above built (~90,000 objects: the SDKs, models, schemas) lives as long as
# the worker does: kept out of the garbage collector's full collections, which otherwise walk
# all of it each time, on whichever function's thread allocates past the threshold (issue 21:
# ~0.5-0.8 ms of the functions' CPU per order, BENCHMARKS.md). An import leaves no garbage to
# collect first (gc.collect() finds none here).
gc.freeze()
