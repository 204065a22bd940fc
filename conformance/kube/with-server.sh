#!/usr/bin/env bash
# Run a command with the test run's real Kubernetes API server:
#
#   conformance/kube/with-server.sh make unit
#
# - TETHER_TEST_KUBECONFIG already set (an outer with-server.sh, or a cluster of your own): the
#   command just runs against it.
# - Otherwise up.sh starts one (from ../shared/peers), TETHER_TEST_KUBECONFIG is exported to the
#   command, and down.sh stops it when the command ends, whatever its outcome (also on Ctrl-C).
#   One that was already running in that directory (`make kube-up`) is used and left running.
# - No ../shared/peers: up.sh prints a NOT RUN banner, the command runs without a server
#   (TETHER_KUBE=not-run is exported), and the banner is printed again at the end. The tests that
#   need the server are then only "ignored": NOT RUN, not passed. This is not a failure by itself,
#   unless TETHER_REQUIRE_KUBE=1 (CI sets it: there the peers must be present).
# - The server cannot be started for another reason (a port in use, ...): exit 1.
#
# Exit status: the command's.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
[ $# -ge 1 ] || { echo "usage: $0 COMMAND [ARG]..." >&2; exit 2; }

if [ -n "${TETHER_TEST_KUBECONFIG:-}" ] || [ "${TETHER_KUBE:-}" = not-run ]; then
  exec "$@"
fi

# A server already running there (make kube-up, or another run) is used and left running.
owner=1
if "$HERE/up.sh" --check 2>/dev/null; then owner=0; fi
kc=$("$HERE/up.sh")
rc=$?
case $rc in
  0)
    export TETHER_TEST_KUBECONFIG=$kc
    if [ $owner = 1 ]; then trap '"$HERE/down.sh"' EXIT; fi
    trap 'exit 130' INT
    trap 'exit 143' TERM
    ;;
  3)
    if [ "${TETHER_REQUIRE_KUBE:-}" = 1 ]; then
      echo "kube/with-server: TETHER_REQUIRE_KUBE=1 and the peers are absent: failing" >&2
      exit 1
    fi
    export TETHER_KUBE=not-run
    ;;
  *)
    echo "kube/with-server: FAILED to start the real API server (up.sh exit $rc); see above." >&2
    "$HERE/down.sh"
    exit 1
    ;;
esac

"$@"
status=$?
if [ "${TETHER_KUBE:-}" = not-run ]; then
  cat >&2 <<'EOF'

##########################################################################################
##  NOT RUN: real kube-apiserver tests — ../shared/peers is absent
##  The tests marked "needs a real API server" were ignored: they have NOT passed.
##########################################################################################

EOF
fi
exit $status
