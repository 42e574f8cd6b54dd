"""Where bytes live (``rankwise.storage``): a local folder or an object store behind one
interface, below the data and training layers, which read and write through it.

- :class:`Storage` (``store.py``): keys under a URL (:meth:`Storage.stat`: an object's size and
  version tag, :class:`ObjectStat`); a local folder's writes are atomic
  (temporary name, fsync, rename: ``local.py``), an object store is reached through fsspec.
  The one step a backend does its own way is making a finished file visible under a key:
  a rename on disk, an upload to a bucket.
- Locations (``urls.py``): :func:`split_url` and :func:`is_remote_url` refuse a URL that
  cannot be meant as written, naming the fix.
- Failures (``errors.py``, ``retry.py``): :class:`StorageError` names the URL, the cause and
  the fix; transient faults are retried under a :class:`RetryPolicy`, announced by a
  :class:`StorageWarning`.
- Credentials (``secrets.py``): :func:`scrub` keeps them out of every message;
  :func:`redacted` out of config dumps.
"""

from rankwise.storage.errors import StorageError, StorageWarning
from rankwise.storage.retry import RetryPolicy
from rankwise.storage.secrets import REDACTED, redacted, scrub, secret_values
from rankwise.storage.store import ObjectStat, Storage
from rankwise.storage.urls import is_remote_url, split_url

__all__ = [
    "REDACTED",
    "ObjectStat",
    "RetryPolicy",
    "Storage",
    "StorageError",
    "StorageWarning",
    "is_remote_url",
    "redacted",
    "scrub",
    "secret_values",
    "split_url",
]
