"""Whether an experiment tracker's server answers, asked once before its run starts.

A misspelt or silent ``MLFLOW_TRACKING_URI`` / ``WANDB_BASE_URL`` then costs
:data:`PROBE_SECONDS` and a warning naming the URL (without its credentials), not the
library's minutes of retries.
"""

from __future__ import annotations

import threading
import urllib.error
import urllib.parse
import urllib.request

__all__ = ["PROBE_SECONDS", "TrackerUnreachableError", "probe", "shown_url"]

# How long a tracker's server has to answer one request before its run starts; past it the
# tracker is switched off at once (its library's own retries can hold a call for minutes).
PROBE_SECONDS = 5.0


class TrackerUnreachableError(ConnectionError):
    """A tracker's server did not answer before its run started (:func:`probe`)."""


def shown_url(url: str) -> str:
    """``url`` as a message may show it: without a user name or password.

    >>> shown_url("https://user:secret@mlflow.example.com:5000/base")
    'https://mlflow.example.com:5000/base'
    """
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    netloc = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def probe(url: str, what: str, seconds: float = PROBE_SECONDS) -> None:
    """Raise :class:`TrackerUnreachableError` unless the HTTP(S) server at ``url`` answers one
    GET within ``seconds`` (name lookup, connection and answer together). Any answer counts,
    an error status too (a server that wants a login has answered); only silence, a refused
    connection or an unknown host do not. ``what`` names the setting the URL came from, for
    the message. Other schemes (``file:``, ``sqlite:``, ``databricks``) are not probed.
    """
    scheme = urllib.parse.urlsplit(url).scheme.lower()
    if scheme not in ("http", "https"):
        return
    outcome: list[BaseException | None] = []

    def ask() -> None:
        try:
            urllib.request.urlopen(url, timeout=seconds).close()
            outcome.append(None)
        except urllib.error.HTTPError:
            outcome.append(None)  # it answered
        except Exception as exc:  # refused, unknown host, timed out, a TLS failure
            outcome.append(exc)

    # A thread with a deadline: a name lookup is not bounded by urlopen's timeout.
    asker = threading.Thread(target=ask, name="rankwise-tracker-probe", daemon=True)
    asker.start()
    asker.join(seconds)
    if outcome and outcome[0] is None:
        return
    if outcome:
        exc = outcome[0]
        reason = getattr(exc, "reason", None) or exc
        why = f"{type(reason).__name__}: {reason}"
    else:
        why = f"no answer within {seconds:g} s"
    raise TrackerUnreachableError(f"{what} {shown_url(url)} does not answer ({why})")
