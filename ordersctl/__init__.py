"""``ordersctl``: the operator's and client's command line (``python -m ordersctl --help``).

Works against the local stack (settings from ``local.settings.json`` or the
environment) and against Azure with identity-based settings
(``AzureWebJobsStorage__accountName``, ``ServiceBusConnection__fullyQualifiedNamespace``
and a signed-in Azure CLI or other credential ``DefaultAzureCredential`` finds).
"""
