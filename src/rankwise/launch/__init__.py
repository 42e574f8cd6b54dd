"""Starting the job: ``rankwise launch`` and ``rankwise store``.

- :mod:`~rankwise.launch.torchrun`: under ``--on-failure restart`` (the default) the launcher is
  a front over ``torch.distributed.run`` (torchrun), which spawns, rendezvouses and restarts.
- :mod:`~rankwise.launch.supervisor`: under ``--on-failure continue`` rankwise does not use
  torchrun's agent; it supervises its own processes, so survivors keep training and only a
  lost rank restarts.
- :mod:`~rankwise.launch.jobstore`: the store the launchers of a continue job share, and
  ``rankwise store``, which hosts it apart from the nodes.

The launcher *sets* the variables its processes read (``RANK``, ``RANKWISE_SLOT``, ...);
reading them is :mod:`rankwise.distributed`'s job.
"""

from rankwise.launch.jobstore import JobStore, parse_endpoint, serve
from rankwise.launch.supervisor import check_continue_args, run_continue
from rankwise.launch.torchrun import (
    add_launch_parser,
    apply_defaults,
    check_args,
    launch,
    run_launch,
)

__all__ = [
    "JobStore",
    "add_launch_parser",
    "apply_defaults",
    "check_args",
    "check_continue_args",
    "launch",
    "parse_endpoint",
    "run_continue",
    "run_launch",
    "serve",
]
