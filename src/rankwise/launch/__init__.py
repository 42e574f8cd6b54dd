"""Starting the job: ``rankwise launch`` and ``rankwise store``.

- :mod:`~rankwise.launch.command`: ``rankwise launch``'s options and checks, and the choice
  between the two ways of running a job, by ``--on-failure``.
- :mod:`~rankwise.launch.torchrun`: ``--on-failure restart`` (the default): torchrun spawns,
  rendezvouses and restarts every rank, with rankwise's rendezvous defaults.
- :mod:`~rankwise.launch.supervisor`: ``--on-failure continue``: torchrun's agent cannot keep
  survivors running, so rankwise supervises its own processes instead; only a lost rank
  restarts, and it rejoins the survivors.
- :mod:`~rankwise.launch.jobstore`: the store the launchers of a continue job share, and
  ``rankwise store``, which hosts it apart from the nodes.

The launcher *sets* the variables its processes read (``RANK``, ``RANKWISE_SLOT``, ...);
reading them is :mod:`rankwise.distributed`'s job.
"""

from rankwise.launch.command import add_launch_parser, check_args, launch, run_launch
from rankwise.launch.jobstore import JobStore, add_store_parser, parse_endpoint, serve
from rankwise.launch.supervisor import check_continue_args, run_continue
from rankwise.launch.torchrun import apply_defaults, run_torchrun

__all__ = [
    "JobStore",
    "add_launch_parser",
    "add_store_parser",
    "apply_defaults",
    "check_args",
    "check_continue_args",
    "launch",
    "parse_endpoint",
    "run_continue",
    "run_launch",
    "run_torchrun",
    "serve",
]
