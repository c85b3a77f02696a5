"""``redact(text)``: text with the credentials of every URL in it hidden, for anything shown or logged.

A logdir may be given as a URL that carries secrets: ``http://user:PASSWORD@host/...``, a presigned S3 URL
(``?X-Amz-Signature=...&X-Amz-Credential=...``), an Azure SAS (``?sig=...``) or a ``?token=...``. The dashboard
shows its logdir in the status line and prints it at startup, and error messages quote paths: each goes through
``redact`` first. What it keeps is what a reader needs to recognise the logdir (scheme, user name, host, path,
the names of the query parameters); what it hides becomes ``***``.
"""
from __future__ import annotations

import os
import re

MASK = "***"

# scheme://userinfo@ : userinfo runs up to the first '@' before any '/', '?', '#' or space
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^/?#\s]*)@")
# a query (or fragment) parameter: the name and its value up to the next separator
_PARAMETER = re.compile(r"""(?P<lead>[?&;#])(?P<name>[^=&;#?\s/]+)=(?P<value>[^&;#\s'"<>]*)""")
# a parameter whose name holds one of these (case-insensitive) carries a secret: token, access_token, api_key,
# X-Amz-Signature, X-Amz-Credential, X-Amz-Security-Token, X-Goog-Signature, sig (Azure SAS), password, secret...
_SECRET_NAMES = ("token", "secret", "signature", "sig", "credential", "password", "passwd", "pwd", "key", "auth",
                 "session", "code")


def _userinfo(match):
    user, colon, _ = match["userinfo"].partition(":")
    # "user:password" keeps the user; a lone userinfo is often itself the secret (https://TOKEN@host)
    hidden = f"{user}:{MASK}" if colon else MASK
    return f"{match['scheme']}{hidden}@"


def _parameter(match):
    name = match["name"].lower()
    if match["value"] and any(word in name for word in _SECRET_NAMES):
        return f"{match['lead']}{match['name']}={MASK}"
    return match[0]


def redact(text) -> str:
    """``text`` (a str or path-like; anything else through ``str``) with URL passwords and secret query parameters
    replaced by ``***``: ``http://alice:pw@host/x?token=t&n=1`` -> ``http://alice:***@host/x?token=***&n=1``.
    Only text inside a URL (after ``scheme://``) is touched; plain paths come back unchanged."""
    text = os.fspath(text) if isinstance(text, os.PathLike) else str(text)
    if "://" not in text:
        return text
    text = _USERINFO.sub(_userinfo, text)
    # query parameters only inside URLs: from each scheme:// to the next whitespace
    return re.sub(r"\b[A-Za-z][A-Za-z0-9+.\-]*://\S*", lambda m: _PARAMETER.sub(_parameter, m[0]), text)
