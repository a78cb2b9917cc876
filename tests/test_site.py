"""The documentation site: built with `mkdocs build --strict` (a broken link, a missing page or
reference fails), served over HTTP, and read in a real headless browser (Debian's `chromium`,
driven by Playwright with that executable: Playwright's own browser download is not reachable
here). The page renders, with its navigation, and the search finds a word of another page.

Needs the `docs` extra and chromium; without them this skips, loudly, unless
SESSIONLOG_REQUIRE_SITE=1 (CI), which makes the skip a failure."""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import shutil
import socketserver
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _missing(what: str) -> None:
    message = f"SITE TEST NOT RUN: {what} (pip install -e '.[docs]'; apt-get install chromium)"
    if os.environ.get("SESSIONLOG_REQUIRE_SITE"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        import material  # noqa: F401
        import mkdocs  # noqa: F401
    except ImportError:
        _missing("MkDocs with the Material theme is not installed")
    target = tmp_path_factory.mktemp("site") / "site"
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(target)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    return target


@contextlib.contextmanager
def _served(directory: Path) -> Iterator[str]:
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(directory))
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_every_page_of_the_nav_was_built(site: Path) -> None:
    for page in ("index.html", "repositories/index.html", "postgresql/index.html", "api/index.html"):
        assert (site / page).is_file(), page
    api = (site / "api" / "index.html").read_text()
    assert "sessionlog.Session" in api and "commit" in api  # the reference came from the docstrings
    assert (site / "search" / "search_index.json").stat().st_size > 10_000


def test_a_page_renders_and_search_finds_a_word_of_another_page(site: Path) -> None:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("Playwright is not installed")
    browser_path = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser_path is None:
        _missing("no chromium on PATH")
    errors: list[str] = []
    with _served(site) as url, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=browser_path, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.set_default_timeout(90_000)  # beside other work, the search index builds slowly
            page.goto(f"{url}/repositories/")
            assert page.locator("h1").first.inner_text().startswith("Repositories")
            assert page.locator("nav.md-nav").first.is_visible()
            # Typed key by key, as a reader does: Material reads the query on keyup (and when its
            # search worker says it is ready). page.fill sends no keyup, so with the worker ready
            # before the text landed (a loaded machine) the query was never read (CI, 90 s).
            page.locator("input.md-search__input").press_sequentially("pg_terminate_backend")
            page.wait_for_selector(".md-search-result__item", timeout=90_000)  # a loaded machine is slow
            found = " ".join(page.locator(".md-search-result__item").all_inner_texts())
            assert "PostgreSQL" in found, found[:500]
        finally:
            browser.close()
    assert errors == [], errors
