#!/usr/bin/env bash
# A long job on a machine reached only through commands of limited length (a remote GPU machine, a CI step):
#   scripts/device_job.sh start NAME COMMAND...   runs COMMAND in the background, its output in /tmp/NAME/run.log
#                                                 and /tmp/NAME/done written when it ends, whatever its exit
#   scripts/device_job.sh poll NAME MAXSEC        waits up to MAXSEC for the job to end, prints its summary.txt and
#                                                 the log's tail, and packs /tmp/NAME into $OUT/NAME.tar.xz
# poll exits 3 at once where no job NAME was started: this is not the machine that ran `start` (a fresh one),
# so waiting would find nothing. It exits 0 when the job has ended, 1 while it still runs.
set -u
root=${DEVICE_JOB_ROOT:-/tmp}
usage() { echo "usage: device_job.sh start NAME COMMAND... | poll NAME MAXSEC" >&2; exit 2; }
[ $# -ge 2 ] || usage
action=$1 name=$2; shift 2
case $name in ''|*[!A-Za-z0-9_-]*) echo "device_job: NAME must be letters, digits, - or _" >&2; exit 2 ;; esac
dir=$root/$name
case $action in
  start)
    [ $# -ge 1 ] || usage
    [ -d "$dir" ] && ! [ -f "$dir/done" ] && { echo "device_job: $name is already running" >&2; exit 2; }
    mkdir -p "$dir"; rm -f "$dir/done"
    # the command's words quoted once more for the inner shell
    setsid nohup bash -c "trap 'touch \"$dir/done\"' EXIT; $(printf '%q ' "$@")" > "$dir/run.log" 2>&1 < /dev/null &
    echo "started $name" ;;
  poll)
    [ $# -eq 1 ] || usage
    case $1 in ''|*[!0-9]*) usage ;; esac
    [ -d "$dir" ] || { echo "device_job: no job $name on this machine (not the one that started it)" >&2; exit 3; }
    t0=$(date +%s)
    while ! [ -f "$dir/done" ] && [ $(( $(date +%s) - t0 )) -lt "$1" ]; do sleep 2; done
    cat "$dir/summary.txt" 2>/dev/null; tail -3 "$dir/run.log"
    tar -C "$root" -cJf "${OUT:?poll needs OUT}/$name.tar.xz" --exclude='*.ncu-rep' "$name"
    if [ -f "$dir/done" ]; then echo "DONE $name"; else echo "RUNNING $name"; exit 1; fi ;;
  *) usage ;;
esac
