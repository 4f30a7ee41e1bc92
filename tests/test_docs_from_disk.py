"""The documentation site opened from disk (``file://``) in a real headless browser: the
navigation reaches the pages (``.html`` files, not folders a browser lists), and the site's
search box finds pages with no network and no server.

The site is the one ``make test`` built just before (its ``docs`` step, ``mkdocs build
--strict``, named by ``BUILT_SITE``), or else built here the same way (about 20 s), and read back
through Chromium's ``--dump-dom``, which prints a page's DOM after its scripts ran. Without
Chromium on the PATH (``apt-get install chromium`` on Debian) the test is skipped, saying so; CI
installs it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BROWSERS = ("chromium", "chromium-browser", "google-chrome")
NAV_LINK = re.compile(r'<a href="([^"#?]+)"[^>]*class="md-nav__link')
RESULT_LINK = re.compile(r'<a href="file://([^"#?]+)[^"]*" class="md-search-result__link"')
BUILT_SITE = "STAGEFRONTIER_BUILT_SITE"
"""The variable by which ``make test`` names the site its ``docs`` step built from this checkout
a moment before, so that one strict build serves the step and these tests."""


def _browser() -> str:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    pytest.skip(f"no headless browser on the PATH (looked for {', '.join(BROWSERS)})")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    built = os.environ.get(BUILT_SITE)
    if built:
        assert (Path(built) / "index.html").is_file(), f"{BUILT_SITE}={built} holds no site"
        return Path(built)
    pytest.importorskip("mkdocs", reason="the docs extra builds the site")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(out)],
        cwd=ROOT,
        env=env,
        check=True,
        timeout=600,
    )
    return out


def _dom(browser: str, url: str, profile: Path) -> str:
    """The page's DOM once its scripts ran (virtual time lets the index worker finish)."""
    done = subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",  # run as root in CI
            "--disable-gpu",
            f"--user-data-dir={profile}",
            "--virtual-time-budget=10000",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_the_site_opened_from_disk_navigates_to_pages_and_finds_them(
    site: Path, tmp_path: Path
) -> None:
    browser = _browser()
    index = _dom(browser, (site / "index.html").as_uri(), tmp_path / "profile")
    links = sorted(set(NAV_LINK.findall(index)))
    assert len(links) >= 10, links
    # Every navigation link is a page file that exists, not a folder.
    assert all(link.endswith(".html") and (site / link).is_file() for link in links), links
    assert "getting-started.html" in links

    page = _dom(browser, (site / "getting-started.html").as_uri(), tmp_path / "profile")
    assert "<h1" in page and "Getting started" in page and "make demo" in page

    # The search box, given a query in the address (?q=), lists matching pages from disk.
    found = _dom(browser, (site / "index.html").as_uri() + "?q=frontier", tmp_path / "profile")
    count = re.search(r'md-search-result__meta">(\d+) matching document', found)
    assert count and int(count.group(1)) >= 3, found[-3000:]
    results = RESULT_LINK.findall(found)
    assert results and all(Path(link).is_file() for link in results), results
    # Nothing the pages load comes from the network.
    for html in site.glob("*.html"):
        assert "unpkg.com/iframe-worker" not in html.read_text(encoding="utf-8"), html.name


def test_the_site_holds_no_build_hook(site: Path) -> None:
    """The hooks that write parts of the pages at build time are not copied into the site."""
    assert (site / "index.html").is_file()
    assert not list(site.rglob("*.py")), sorted(str(p) for p in site.rglob("*.py"))
