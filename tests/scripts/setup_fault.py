"""A fault at a continue-mode group's set-up, for the worker scripts (member_worker.py,
continue_worker.py).

``on_group_setup(fault)`` calls ``fault()`` each time this process enters the set-up of a
real generation group: :class:`~rankwise.distributed.membership.Membership` builds each on a
``PrefixStore`` of the job's store through ``torch.distributed.init_process_group``, which is
wrapped here; a world of one (a ``HashStore``) is left alone.
"""

from __future__ import annotations

from collections.abc import Callable

import torch.distributed as dist


def on_group_setup(fault: Callable[[], None]) -> None:
    build = dist.init_process_group

    def init_process_group(*args: object, **kwargs: object) -> None:
        if isinstance(kwargs.get("store"), dist.PrefixStore):
            fault()
        build(*args, **kwargs)  # type: ignore[arg-type]

    dist.init_process_group = init_process_group  # Membership calls it through the module
