#!/usr/bin/env sh
# The CyxWiz guide's launcher on rankwise: `launch_distributed.sh N cmd...` runs cmd on N
# processes of this machine through `rankwise launch` (torchrun), which sets RANK, WORLD_SIZE,
# LOCAL_RANK, MASTER_ADDR and MASTER_PORT (a free port) for each.
#
#   scripts/launch_distributed.sh 4 python train.py --epochs 5
#   scripts/launch_distributed.sh 4 train.py            # a script alone: run with Python
#
# A leading `python` / `python3` followed by a script becomes the interpreter `rankwise launch`
# runs under; `python` with its own options (`python -u train.py`, `python -c CODE`,
# `python -m pkg`) and any other command (a binary, a shell script) run as they are (torchrun's
# --no-python). Options for
# rankwise launch itself (--max-restarts ...) go in RANKWISE_LAUNCH_ARGS. See docs/seeds/cyxwiz.md.
set -eu
usage="usage: $0 NUM_PROCESSES COMMAND [ARGS...], e.g. $0 4 python train.py"
if [ "$#" -lt 2 ]; then
    echo "$usage" >&2
    exit 2
fi
nproc=$1
shift
bad_nproc() {
    echo "launch_distributed.sh: NUM_PROCESSES ($nproc) must be an integer >= 1; $usage" >&2
    exit 2
}
case $nproc in
    '' | *[!0-9]*) bad_nproc ;;
esac
# Numerically, so that 00 is refused like 0.
[ "$nproc" -ge 1 ] 2>/dev/null || bad_nproc
case $1 in
    python | python3 | python3.*)
        case ${2:-} in
            -*) set -- --no-python "$@" ;; # interpreter options: rankwise launch has no -u
            *) shift ;;
        esac
        ;;
    *.py) ;;
    *) set -- --no-python "$@" ;;
esac
if command -v rankwise >/dev/null 2>&1; then
    set -- rankwise launch --nproc-per-node "$nproc" ${RANKWISE_LAUNCH_ARGS:-} "$@"
else  # rankwise importable (PYTHONPATH) but its console script not on PATH
    set -- "${PYTHON:-python}" -m rankwise.cli launch --nproc-per-node "$nproc" ${RANKWISE_LAUNCH_ARGS:-} "$@"
fi
exec "$@"
