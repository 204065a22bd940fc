#!/bin/bash
# Installed by node.sh as /opt/cni/bin/multus, in front of the real Multus (/run/e2e/bin/multus):
# logs every call containerd makes to the node's CNI — command, container id, netns, ifname,
# CNI_ARGS, CNI_PATH, then the exit status — to /run/e2e/cni-trace.log, and the network config it
# got on stdin to /run/e2e/cni-trace/<time>.<command>.json. The real binary runs with the same
# environment, stdin and stdout. test.sh and docs/e2e.md read the trace.
t=$(date +%s.%N)
in=$(cat)
printf '%s %s id=%s netns=%s ifname=%s args=%s path=%s\n' "$t" "$CNI_COMMAND" "$CNI_CONTAINERID" \
  "${CNI_NETNS:-<empty>}" "$CNI_IFNAME" "$CNI_ARGS" "$CNI_PATH" >>/run/e2e/cni-trace.log
printf '%s' "$in" >"/run/e2e/cni-trace/$t.$CNI_COMMAND.json"
printf '%s' "$in" | /run/e2e/bin/multus
rc=$?
echo "$(date +%s.%N) $CNI_COMMAND id=$CNI_CONTAINERID exit=$rc" >>/run/e2e/cni-trace.log
exit $rc
