"""The scheduler: takes orders in, claims them, hands steps to agents, records the outcome.

- ``submission``: an order message -> order row + Pending state row (+ a nudge), or a kept rejection.
- ``dispatch``: a nudge -> claim -> agent request; an agent response -> Processed or Error.
- ``blueprint``: the Functions bindings over those plain functions.
"""
