# Sourced by up.sh and down.sh once HERE is set: where the Multus lab node lives and what its
# namespaces are called, so that the script that builds it and the one that removes it agree.
ROOT=$(cd "$HERE/../.." && pwd)
PEERS=${TETHER_PEERS:-$ROOT/../shared/peers}
DIR=${TETHER_MULTUS_DIR:-/tmp/tether-multus}
NODE_NS=tether-multus-node
SWITCH_NS=tether-multus-switch
