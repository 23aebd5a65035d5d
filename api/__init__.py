"""The status API: an HTTP blueprint over the state store (GET an order, list by state, resubmit)."""
