"""HTTP as ingero's own clients speak it (the CLI to echod, fleetd to a webhook): a redirect is
never followed. Following one could carry a token or a signed notice to another host, or onto
plain HTTP; the 3xx is the answer, raised as the HTTPError it is."""

from __future__ import annotations

import urllib.request


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def opener(*handlers: urllib.request.BaseHandler) -> urllib.request.OpenerDirector:
    """An opener that follows no redirect, with ``handlers`` (TLS settings, say)."""
    return urllib.request.build_opener(NoRedirect, *handlers)
