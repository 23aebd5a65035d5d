"""One stamp rule for clients, stated the same everywhere and computed by one function
(``core.names.stamp_of``): docs/clients.md, "Sending orders" (its words and its snippet,
run here), docs/deploy.md and docs/scale.md."""

from __future__ import annotations

import re

from core.names import STAMP_RULE, stamp_of
from tests import ROOT
from tests.infra.test_message_id_rule import CLIENTS, _sending_orders


def _stamp_snippet() -> str:
    (code,) = [block for block in re.findall(r"```python\n(.*?)```", _sending_orders(), re.DOTALL)
               if "NAMESPACES" in block]
    return code


def test_the_documented_client_picks_the_stamp_stamp_of_picks():
    code = _stamp_snippet()
    for stamps in (2, 3, 5):
        for order_id in ("o-1002", "o-1", "ordre-é-42", "x" * 64):
            namespaces = [f"sb-{i}.servicebus.windows.net" for i in range(stamps)]
            run = code.replace('order_id = "o-1002"', f"order_id = {order_id!r}")
            scope: dict = {}
            exec(compile(re.sub(r"NAMESPACES = \[.*?\]", f"NAMESPACES = {namespaces!r}", run),  # noqa: S102
                         "docs/clients.md (Sending orders, stamps)", "exec"), scope)
            assert scope["stamp"] == stamp_of(order_id, stamps), (order_id, stamps)
            assert scope["namespace"] == namespaces[stamp_of(order_id, stamps)]


def test_the_docs_state_the_same_rule():
    for path in (CLIENTS, ROOT / "docs" / "deploy.md", ROOT / "docs" / "scale.md"):
        assert STAMP_RULE in " ".join(path.read_text(encoding="utf-8").split()), path.relative_to(ROOT)
