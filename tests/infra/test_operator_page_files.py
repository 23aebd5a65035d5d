"""The operator page's files (api/static/): the vendored chart library is exactly the
pinned npm package's build, with its licence beside it; the page links only files the
app serves; and they ship with the app (tests/infra/test_package.py checks the folder)."""

from __future__ import annotations

import json
import re

from api import ops
from tests import ROOT

VENDORED = {  # file in api/static -> the same file in the npm package
    "uPlot.iife.min.js": "dist/uPlot.iife.min.js",
    "uPlot.min.css": "dist/uPlot.min.css",
    "uPlot.LICENSE": "LICENSE",
}


def pinned_uplot() -> str:
    package = json.loads((ROOT / "package.json").read_text(encoding="utf-8"))
    lock = json.loads((ROOT / "package-lock.json").read_text(encoding="utf-8"))
    version = package["devDependencies"]["uplot"]
    assert lock["packages"]["node_modules/uplot"]["version"] == version
    assert lock["packages"]["node_modules/uplot"]["license"] == "MIT"
    return version


def test_the_vendored_uplot_is_the_pinned_package():
    version = pinned_uplot()
    banner = (ROOT / "api/static/uPlot.iife.min.js").read_text(encoding="utf-8").splitlines()[0]
    assert f"(v{version})" in banner, banner
    installed = ROOT / "node_modules/uplot"
    assert installed.is_dir(), "node_modules/uplot is missing: `make setup` installs the npm pins (npm ci)"
    assert json.loads((installed / "package.json").read_text(encoding="utf-8"))["version"] == version
    for ours, theirs in VENDORED.items():
        assert (ROOT / "api/static" / ours).read_bytes() == (installed / theirs).read_bytes(), ours
    assert "MIT License" in (ROOT / "api/static/uPlot.LICENSE").read_text(encoding="utf-8")


def test_the_page_links_only_files_the_app_serves():
    html = (ops.STATIC / "ops.html").read_text(encoding="utf-8")
    linked = re.findall(r'(?:src|href)="\{\{base\}\}/ops/static/([^"]+)"', html)
    assert set(linked) == set(ops.ASSETS), linked
    assert not re.findall(r'(?:src|href)="(?!\{\{base\}\}/ops/static/)', html), "the page links elsewhere"
    assert not re.search(r"<[^>]+\son[a-z]+=", html), "an inline event handler: the page's CSP refuses it"
    assert not re.search(r"<script(?![^>]*\bsrc=)", html), "an inline script: the page's CSP refuses it"
    assert {path.name for path in ops.STATIC.iterdir()} == {"ops.html", *ops.ASSETS}
