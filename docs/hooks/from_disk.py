"""MkDocs hook: the built site opens from disk (``file://``) with no network.

Material's ``offline`` plugin makes the site's index readable from disk and loads a small Web
Worker stand-in (``iframe-worker``) for browsers that refuse a worker from ``file://``; it points
at that script on a CDN. This hook points every page at the copy shipped in
``docs/javascripts/iframe-worker-shim.js`` instead, so the site needs nothing but its folder.
"""

from __future__ import annotations

from typing import Any

CDN_SHIM = "https://unpkg.com/iframe-worker/shim"
SHIPPED_SHIM = "javascripts/iframe-worker-shim.js"


def on_post_page(output: str, page: Any, **_: Any) -> str:
    depth = page.url.count("/")  # pages are .html files: a/b.html is one folder down
    return output.replace(CDN_SHIM, "../" * depth + SHIPPED_SHIM)


def on_post_template(output_content: str, template_name: str, **_: Any) -> str:
    """The pages built from a template alone (``404.html``), at the site's root."""
    return output_content.replace(CDN_SHIM, SHIPPED_SHIM)
