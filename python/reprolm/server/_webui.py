"""The chat page at ``GET /``: one HTML file shipped in the package (``webui/index.html``,
its CSS and JavaScript inline), served with a Content-Security-Policy that lets the browser
run exactly that script and style and talk to this server only."""

from __future__ import annotations

import base64
import hashlib
import re
from importlib import resources
from typing import Optional

from starlette.responses import Response

__all__ = ["page_response"]


def _inline(tag: str, html: str) -> str:
    """The text inside the page's one ``<tag>`` element."""
    found = re.findall(rf"<{tag}>(.*?)</{tag}>", html, flags=re.DOTALL)
    if len(found) != 1:
        raise RuntimeError(f"the chat page must hold exactly one <{tag}> element, found {len(found)}")
    return str(found[0])


_PAGE: Optional[tuple[bytes, str]] = None


def _sha256_source(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def _page() -> tuple[bytes, str]:
    """The page's bytes and its Content-Security-Policy (read once, on the first request)."""
    global _PAGE
    if _PAGE is not None:
        return _PAGE
    html = resources.files("reprolm.server").joinpath("webui").joinpath("index.html").read_text(encoding="utf-8")
    policy = "; ".join([
        "default-src 'none'",
        f"script-src {_sha256_source(_inline('script', html))}",
        f"style-src {_sha256_source(_inline('style', html))}",
        "connect-src 'self'",
        "img-src data:",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    ])
    _PAGE = html.encode(), policy
    return _PAGE


def page_response() -> Response:
    body, policy = _page()
    return Response(body, media_type="text/html; charset=utf-8", headers={
        "Content-Security-Policy": policy,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-cache",
    })
