# Sourced by the Multus node's scripts (down.sh, host-api.sh, control-plane.sh): stop or check
# exactly the processes their pid files name, never a recycled pid that now belongs to another.

# ours PIDFILE WORD: print the pid if that process is alive, is not this shell, and its command
# line has WORD.
ours() {
  local pid
  [ -s "$1" ] || return 1
  pid=$(cat "$1")
  [ "$pid" != "$$" ] && [ -d "/proc/$pid" ] && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "$2" && echo "$pid"
}

# stop PID: TERM, up to 5 s to go, then KILL.
stop() {
  kill -TERM "$1" 2>/dev/null || return 0
  for _ in $(seq 1 20); do [ -d "/proc/$1" ] || return 0; sleep 0.25; done
  kill -KILL "$1" 2>/dev/null || true
}
