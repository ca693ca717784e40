"""The few POSIX sh snippets fleetgen runs on a host, with values passed as positional arguments.

Each snippet is a constant run as `sh -c SNIPPET fleetgen ARG…`: values never enter the script text, so
no value can be misread as shell syntax. Only POSIX sh and coreutils are assumed (no python on the host).
Exit codes ≥ 64 are fleetgen's own, mapped to causes and fixes by the host classes.
"""

from __future__ import annotations

# Exit codes of the snippets (sysexits-style numbers, so they do not collide with 1/2/126/127).
EXIT_NO_FOLDER = 66
EXIT_NO_SCRIPT = 67
EXIT_NOT_EXECUTABLE = 68
EXIT_LOG_EXISTS = 73
EXIT_HASH_MISMATCH = 76

# Start a script detached. Traps avoided: `cd d && cmd & echo $!` backgrounds the whole list with the SSH
# channel as its stdout (the exec never returns) and `$!` is a subshell; so `cd` runs first, alone.
# setsid: new session and process group (the group is what `stop` signals); nohup: ignore SIGHUP when the
# SSH session ends; stdin </dev/null and output to the log: nothing ties the process to the channel.
# `set -C` (noclobber): the log must be NEW; truncating a log another process still writes would lose it.
# `umask 077`: the log, its folder and the pidfile are the owner's only (a log may hold what a user typed).
# The stat line is read with the `read` builtin before any other fork, so even a script that exits at once
# is still an unreaped zombie of this shell and its start time can be read.
SPAWN_SH = r"""
set -C
umask 077
cwd=$1 script=$2 log=$3 pidfile=$4
cd "$cwd" 2>/dev/null || { echo "folder $cwd does not exist or is not accessible" >&2; exit 66; }
[ -f "$script" ] || { echo "script $script does not exist (relative to $cwd)" >&2; exit 67; }
[ -x "$script" ] || { echo "script $script is not executable" >&2; exit 68; }
[ -e "$log" ] && { echo "log $log exists already; every launch needs a new log file" >&2; exit 73; }
mkdir -p -- "$(dirname -- "$log")" "$(dirname -- "$pidfile")" || exit 73
: > "$log" || exit 73
setsid nohup "$script" >> "$log" 2>&1 < /dev/null &
pid=$!
read -r stat < "/proc/$pid/stat" || stat=""
tmp="$pidfile.$pid.tmp"
{ printf '%s\n' "$pid" > "$tmp" && mv -f -- "$tmp" "$pidfile"; } || exit 74
printf '%s\n%s\n' "$pid" "$stat"
"""

# /proc of one PID as base64 lines (exact bytes, whatever the args hold): stat, cmdline, environ, stat.
# The second stat tells whether the PID changed hands while the others were read.
INSPECT_SH = r"""
p=/proc/$1
for f in stat cmdline environ stat; do base64 -w0 "$p/$f" 2>/dev/null; echo; done
exit 0
"""

# Optionally signal a process group (`-PGID`) or a PID ("no such process" is no error here), give it a
# moment, then print every process's stat line (to find the live members of the group): one round trip
# per step of a stop, which matters on hosts whose login shell takes a while to start (conda/pyenv init).
SIGNAL_AND_STATS_SH = r"""
if [ -n "$1" ]; then kill -s "$1" -- "$2" 2>/dev/null; sleep 0.1; fi
cat /proc/[0-9]*/stat 2>/dev/null
exit 0
"""

# Check a temp file's sha256 ON THE HOST, rename it over the target (atomic on one filesystem), hash again.
VERIFY_RENAME_SH = r"""
tmp=$1 dest=$2 want=$3
got=$(sha256sum < "$tmp") || exit 75
got=${got%% *}
if [ "$got" != "$want" ]; then
  rm -f -- "$tmp"; echo "sha256 of the uploaded temp file is $got, expected $want" >&2; exit 76
fi
mv -f -- "$tmp" "$dest" || { rm -f -- "$tmp"; exit 77; }
final=$(sha256sum < "$dest") || exit 75
printf '%s %s\n' "$got" "${final%% *}"
"""

# $1 path (new: noclobber), $2 mode (octal): what stdin carries, synced to disk.
WRITE_SH = 'umask 077; set -C; cat > "$1" && sync -- "$1" && chmod "$2" -- "$1"'


def sh(snippet: str, *args: str) -> list[str]:
    """argv running `snippet` with `args` as $1, $2, …"""
    return ["sh", "-c", snippet, "fleetgen", *args]
