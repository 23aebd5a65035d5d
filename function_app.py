"""The Function app: builds FunctionApp() and registers the blueprints. No logic here."""

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
