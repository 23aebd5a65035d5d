"""The bad-input corpus (``bad_orders.json``) and its builder; read it with ``devtools.orders``."""
