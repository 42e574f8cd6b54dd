"""CyxWiz guide, "Python API Reference": Initialization Functions and DistributedConfig, and
"Configuration": Backend Selection, with the import changed.

Run on 2 ranks, by hand as the guide's "Manual Launch" does (or with launch_distributed.sh):

    RANK=0 WORLD_SIZE=2 MASTER_PORT=29512 python examples/seeds/cyxwiz/api_reference.py &
    RANK=1 WORLD_SIZE=2 MASTER_PORT=29512 python examples/seeds/cyxwiz/api_reference.py

What the port changes (marked "port:"): the guide's explicit config says rank 0 of 4 and port
29500, which only one process of a 4-rank job on a free port 29500 could use; the port takes
rank, world size and port from the launch, so ``init(config)`` describes the world it is in
(and is then a no-op, since ``init()`` already joined it). The queries are printed.
"""

import os  # port

import rankwise.compat.cyxwiz as cx

# Initialize from environment variables
cx.distributed.init()

# Initialize with explicit config
config = cx.distributed.DistributedConfig()
config.rank = int(os.environ["RANK"])  # port: the guide has 0
config.world_size = int(os.environ["WORLD_SIZE"])  # port: the guide has 4
cx.distributed.init(config)

# Query state
print(  # port: the guide's queries, printed
    f"rank {cx.distributed.get_rank()}:",
    cx.distributed.is_initialized(),  # -> bool
    cx.distributed.get_rank(),  # -> int
    cx.distributed.get_world_size(),  # -> int
    cx.distributed.get_local_rank(),  # -> int
    cx.distributed.is_master(),  # -> bool (True if rank == 0)
)

# Cleanup
cx.distributed.finalize()
print(f"rank {config.rank}: after finalize {cx.distributed.is_initialized()}")  # port

# --- DistributedConfig ---
config = cx.distributed.DistributedConfig()
config.rank = 0  # Global rank
config.world_size = 4  # Total processes
config.local_rank = 0  # GPU index on this machine
config.master_addr = "127.0.0.1"  # IP of rank 0
config.master_port = 29500  # Communication port
config.backend = cx.distributed.BackendType.CPU  # or NCCL
config.timeout_ms = 30000  # Connection timeout
print(f"rank {os.environ['RANK']}: set {config.validate()}")  # port

# Create from environment
config = cx.distributed.DistributedConfig.from_environment()
print(f"rank {config.rank}: from_environment {config}")  # port

# --- Backend Selection ---
# CPU Backend (works everywhere)
config.backend = cx.distributed.BackendType.CPU

# NCCL Backend (Linux + NVIDIA GPUs, fastest)
config.backend = cx.distributed.BackendType.NCCL
print(
    f"rank {config.rank}: backends {cx.distributed.BackendType.CPU.value} {config.backend_name}"
)  # port
