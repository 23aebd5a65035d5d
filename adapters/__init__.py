"""Adapters: the app's I/O. Table Storage (the state store), Service Bus and storage-queue
sending, SDK clients, settings from the environment, and the process's wiring.

Everything here talks to something outside the process; the decisions it carries out
live in ``core`` (pure, no ``azure.*`` import).
"""
