"""The docs site: its generated reference is current, and it builds strictly, offline, with broken links refused."""

from __future__ import annotations

import importlib.util
import re
import shutil
import socket
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from mkdocs.commands.build import build
from mkdocs.config import load_config
from mkdocs.exceptions import Abort
from muralist_api.job import spec_problems
from muralist_api.rules.problems import parse_job

from tests.paths import REPO

MKDOCS_YML = REPO / "mkdocs.yml"


def _docs_reference() -> ModuleType:
    """Import hack/docs_reference.py (hack/ is scripts, not a package)."""
    name = "muralist_hack_docs_reference"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "hack" / "docs_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any attempt to resolve a name or open an internet socket fails the build that made it."""

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"the docs build reached for the network: {args!r}")

    real_connect = socket.socket.connect

    def connect(self: socket.socket, address: Any) -> None:
        if self.family != socket.AF_UNIX:
            refused(address)
        real_connect(self, address)

    monkeypatch.setattr(socket, "getaddrinfo", refused)
    monkeypatch.setattr(socket, "create_connection", refused)
    monkeypatch.setattr(socket.socket, "connect", connect)


def _build(site: Path, docs: Path | None = None) -> None:
    overrides: dict[str, Any] = {"site_dir": str(site)}
    if docs is not None:
        overrides["docs_dir"] = str(docs)
    build(load_config(str(MKDOCS_YML), **overrides))


def test_the_committed_reference_is_what_the_models_and_the_chart_generate() -> None:
    stale = [str(path.relative_to(REPO)) for path in _docs_reference().stale_pages()]
    assert stale == [], f"{stale}: run `python hack/docs_reference.py`"


def test_the_reference_lists_every_field_of_the_crd() -> None:
    from muralist_operator.crd import build_crd

    module = _docs_reference()
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    page = (REPO / "docs" / "reference" / "diffusionjob.md").read_text()
    for section in module.object_sections(schema["properties"]["spec"], "DiffusionJob.spec"):
        assert f"## `{section.path}`" in page
        for name in section.node["properties"]:
            assert f"`{name}`" in page.split(f"## `{section.path}`", 1)[1].split("\n## ", 1)[0], (section.path, name)


def test_the_site_builds_strictly_without_the_network(tmp_path: Path, no_network: None) -> None:
    site = tmp_path / "site"
    _build(site)
    pages = list(site.rglob("*.html"))
    assert site / "reference" / "diffusionjob" / "index.html" in pages
    # Nothing a reader's browser would fetch from elsewhere: no web font, script or style sheet off the site.
    remote = re.compile(r"""<(?:link|script|img)\b[^>]*\b(?:href|src)=["']?(?:https?:)?//""")
    offenders = [str(page.relative_to(site)) for page in pages if remote.search(page.read_text())]
    assert offenders == []


def _manifests_written_in_the_docs() -> list[tuple[str, dict[str, Any]]]:
    """Every DiffusionJob typed into a page (the examples a page includes are checked in tests/unit/cli)."""
    fence = re.compile(r"^```yaml[^\n]*\n(.*?)^```", re.M | re.S)
    found = []
    for page in sorted((REPO / "docs").rglob("*.md")):
        for block in fence.findall(page.read_text()):
            if "--8<--" not in block:
                found += [(str(page.relative_to(REPO)), doc) for doc in yaml.safe_load_all(block)
                          if isinstance(doc, dict) and doc.get("kind") == "DiffusionJob"]
    return found


def test_every_job_the_docs_show_is_valid() -> None:
    manifests = _manifests_written_in_the_docs()
    assert manifests, "no page shows a DiffusionJob of its own"
    for page, manifest in manifests:
        assert spec_problems(parse_job(manifest).spec) == [], page


def test_a_broken_link_or_anchor_fails_the_build(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    shutil.copytree(REPO / "docs", docs)
    for broken in ("[gone](concepts/no-such-page.md)", "[gone](concepts/items.md#no-such-anchor)"):
        (docs / "index.md").write_text((REPO / "docs" / "index.md").read_text() + f"\n{broken}\n")
        with pytest.raises(Abort, match="strict mode"):
            _build(tmp_path / "site", docs)


def test_the_readme_and_contributing_link_to_files_that_exist() -> None:
    # They are read on the forge, outside the site, so mkdocs' link check never sees them.
    link = re.compile(r"\]\((?!https?://|#)([^)#\s]+)")
    for name in ("README.md", "CONTRIBUTING.md"):
        targets = link.findall((REPO / name).read_text())
        assert [t for t in targets if not (REPO / t).exists()] == [], name
