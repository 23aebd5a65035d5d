"""The HTTP session every storage client of this process shares.

azure-core's ``RequestsTransport`` sends each request through ``requests.Session.request``,
which, before urllib3 sees it, merges the session's cookies, auth, hooks and environment
settings into a new prepared request, and afterwards extracts cookies and looks for
redirects. The storage clients use none of it (no cookies, no proxies, no redirects
followed: azure-core passes ``allow_redirects=False`` and its own RedirectPolicy decides),
and it was about a third of the client CPU of a point read against Azurite (cProfile,
issue 21; the figures are in BENCHMARKS.md, "Where the CPU goes, and what was cut").

:class:`LeanSession` prepares such a request directly (method, URL, the session's default
headers under the request's, body) and hands it to the mounted adapter, as ``Session.send``
does; anything else (cookies, auth, files, proxies, redirects followed) takes requests'
own path. The adapter raises the same ``requests`` exceptions as before, so azure-core
maps a refused or dropped connection and a timeout to the same errors, and the SDKs'
retry policies see them as before.

One session serves every client of the process (:func:`shared_session`): one connection
pool per endpoint for the tables, queues and accounts, kept alive between invocations.
:func:`close_shared_session` closes its connections (on shutdown, adapters.wiring.reset).
"""

from __future__ import annotations

import threading

import requests
from requests.adapters import HTTPAdapter
from requests.structures import CaseInsensitiveDict
from urllib3.util.retry import Retry

from adapters.lean_http import HttpClientAdapter

#: Connections kept open per storage endpoint. The host runs many invocations at once,
#: in threads that share this process's clients; requests keeps 10 by default and, above
#: that, opens a new connection for a call and drops it afterwards (measured: 0.2-0.3 new
#: connections per order with one local host; in Azure each is a TLS handshake).
POOL_CONNECTIONS = 64


class LeanSession(requests.Session):
    """A ``requests.Session`` whose plain requests skip the session-level merging (see the module)."""

    def request(self, method, url, params=None, data=None, headers=None, cookies=None, files=None, auth=None,
                timeout=None, allow_redirects=True, proxies=None, hooks=None, stream=None, verify=None, cert=None,
                json=None):
        if (params or cookies or files or auth or hooks or json is not None or proxies or allow_redirects
                or self.cookies or self.auth or self.params or self.proxies or self.trust_env):
            return super().request(
                method, url, params=params, data=data, headers=headers, cookies=cookies, files=files, auth=auth,
                timeout=timeout, allow_redirects=allow_redirects, proxies=proxies, hooks=hooks, stream=stream,
                verify=verify, cert=cert, json=json,
            )
        merged = CaseInsensitiveDict(self.headers)
        for name, value in (headers or {}).items():
            if value is None:
                merged.pop(name, None)  # as requests' merge_setting: None removes a default
            else:
                merged[name] = value
        prepared = requests.PreparedRequest()
        prepared.prepare_method(method)
        prepared.prepare_url(url, None)
        prepared.prepare_headers(merged)
        prepared.prepare_body(data, None, None)
        prepared.prepare_hooks(None)
        response = self.get_adapter(prepared.url).send(
            prepared, stream=bool(stream), timeout=timeout, verify=self.verify if verify is None else verify,
            cert=cert if cert is not None else self.cert, proxies={},
        )
        if not stream:
            response.content  # noqa: B018 - read the body now, as Session.send does
        return response


def new_session() -> LeanSession:
    """A session with a pool of :data:`POOL_CONNECTIONS` per endpoint, no retries at this layer
    (the SDK's retry policy does them, as with its default transport), and no proxy settings
    read from the environment (skipping that work on every call measured ~25% faster point
    reads against Azurite)."""
    session = LeanSession()
    session.trust_env = False
    adapter = HTTPAdapter(
        pool_maxsize=POOL_CONNECTIONS, max_retries=Retry(total=False, redirect=False, raise_on_status=False)
    )
    # Plain requests straight over http.client, the rest through the adapter (adapters/lean_http.py).
    adapter = HttpClientAdapter(adapter, pool_size=POOL_CONNECTIONS)
    for scheme in ("http://", "https://"):
        session.mount(scheme, adapter)
    return session


_lock = threading.Lock()
_session: LeanSession | None = None


def shared_session() -> LeanSession:
    """This process's session (created on first use, again after :func:`close_shared_session`)."""
    global _session
    with _lock:
        if _session is None:
            _session = new_session()
        return _session


def close_shared_session() -> None:
    """Close the shared session's connections; clients still holding it open new ones if used."""
    global _session
    with _lock:
        session, _session = _session, None
    if session is not None:
        session.close()
