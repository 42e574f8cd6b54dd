#!/usr/bin/env sh
# The CyxWiz guide's launcher on rankwise: `launch_distributed.sh N cmd...` runs cmd on N
# processes of this machine through `rankwise launch` (torchrun), which sets RANK, WORLD_SIZE,
# LOCAL_RANK, MASTER_ADDR and MASTER_PORT (a free port) for each.
#
#   scripts/launch_distributed.sh 4 python train.py --epochs 5
#   scripts/launch_distributed.sh 4 train.py            # a script alone: run with Python
#
# A leading `python` / `python3` becomes the interpreter `rankwise launch` runs under; any other
# command (a binary, a shell script) runs as it is (torchrun's --no-python). Options for
# rankwise launch itself (--max-restarts ...) go in RANKWISE_LAUNCH_ARGS. See docs/seeds/cyxwiz.md.
set -eu
usage="usage: $0 NUM_PROCESSES COMMAND [ARGS...], e.g. $0 4 python train.py"
if [ "$#" -lt 2 ]; then
    echo "$usage" >&2
    exit 2
fi
nproc=$1
shift
case $nproc in
    '' | *[!0-9]* | 0)
        echo "launch_distributed.sh: NUM_PROCESSES ($nproc) must be an integer >= 1; $usage" >&2
        exit 2
        ;;
esac
case $1 in
    python | python3 | python3.*) shift ;;
    *.py) ;;
    *) set -- --no-python "$@" ;;
esac
if command -v rankwise >/dev/null 2>&1; then
    set -- rankwise launch --nproc-per-node "$nproc" ${RANKWISE_LAUNCH_ARGS:-} "$@"
else  # rankwise importable (PYTHONPATH) but its console script not on PATH
    set -- "${PYTHON:-python}" -m rankwise.cli launch --nproc-per-node "$nproc" ${RANKWISE_LAUNCH_ARGS:-} "$@"
fi
exec "$@"
