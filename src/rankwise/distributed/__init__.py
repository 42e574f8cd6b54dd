"""Process group life cycle and collectives (``rankwise.distributed``).

>>> import rankwise
>>> rankwise.distributed.init()          # world of one without RANK / WORLD_SIZE
DistributedConfig(rank=0, world_size=1, ...)
>>> rankwise.distributed.get_world_size()
1
"""

from rankwise.distributed.collectives import (
    all_gather,
    all_gather_plain,
    all_reduce,
    broadcast,
    broadcast_plain,
    collective_device,
    reduce_metrics,
    scatter,
)
from rankwise.distributed.config import BackendType, DistributedConfig, normalize_backend
from rankwise.distributed.environment import under_rankwise_launch
from rankwise.distributed.errors import (
    DistributedConfigError,
    DistributedConnectionError,
    DistributedStateError,
    DistributedTimeoutError,
    RankwiseWarning,
    plain_warnings,
)
from rankwise.distributed.failures import classify, is_peer_failure, is_timeout
from rankwise.distributed.group import (
    barrier,
    detect_world,
    device,
    finalize,
    get_backend,
    get_local_rank,
    get_rank,
    get_world_size,
    has_group,
    init,
    is_initialized,
    is_joining,
    is_master,
    mark_training_finished,
    membership,
    select_backend,
)
from rankwise.distributed.interrupt import quiet_interrupts
from rankwise.distributed.progress import Progress
from rankwise.distributed.roles import Roles

__all__ = [
    "BackendType",
    "DistributedConfig",
    "DistributedConfigError",
    "DistributedConnectionError",
    "DistributedStateError",
    "DistributedTimeoutError",
    "Progress",
    "RankwiseWarning",
    "Roles",
    "all_gather",
    "all_gather_plain",
    "all_reduce",
    "barrier",
    "broadcast",
    "broadcast_plain",
    "classify",
    "collective_device",
    "detect_world",
    "device",
    "finalize",
    "get_backend",
    "get_local_rank",
    "get_rank",
    "get_world_size",
    "has_group",
    "init",
    "is_initialized",
    "is_joining",
    "is_master",
    "is_peer_failure",
    "is_timeout",
    "mark_training_finished",
    "membership",
    "normalize_backend",
    "reduce_metrics",
    "scatter",
    "select_backend",
]

plain_warnings()  # rankwise's own warnings without the echoed source line
if under_rankwise_launch():  # a rank of `rankwise launch`: Ctrl-C ends it quietly
    quiet_interrupts()
