// libcni-driver: drive CNI plugins through the REAL libcni (Debian's
// golang-github-appc-cni-dev, libcni 1.1.2), the way cnitool / container
// runtimes / Multus do.
//
//	libcni-driver add|check|del <network-name> <netns-path>
//
// Environment:
//
//	NETCONFPATH     config dir (default /etc/cni/net.d); *.conflist preferred,
//	                a lone *.conf/*.json is up-converted (libcni.LoadConfList)
//	CNI_PATH        plugin search path (colon separated)
//	CNI_ARGS        K=V;K=V... -> RuntimeConf.Args
//	CAP_ARGS        JSON object -> RuntimeConf.CapabilityArgs
//	CNI_IFNAME      default eth0
//	CNI_CONTAINERID default "cnitool-" + first 20 hex of sha512(abs netns path)
//	CNI_CACHE_DIR   default /var/lib/cni (libcni's default)
//
// Exit 0 on success (ADD prints the result JSON on stdout). On error: the
// error text on stderr, exit 1; when the error is (wraps) a plugin's
// *types.Error its JSON also goes to stdout. Usage errors exit 2.
package main

import (
	"context"
	"crypto/sha512"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
)

const defaultNetDir = "/etc/cni/net.d"

func usage() {
	fmt.Fprintf(os.Stderr, "usage: %s add|check|del <network-name> <netns-path>\n", filepath.Base(os.Args[0]))
	os.Exit(2)
}

// parseArgs mirrors cnitool: "K=V;K=V", every pair must have a non-empty key
// and value. (SplitN so a value may itself contain '='.)
func parseArgs(s string) ([][2]string, error) {
	var out [][2]string
	for _, pair := range strings.Split(s, ";") {
		kv := strings.SplitN(pair, "=", 2)
		if len(kv) != 2 || kv[0] == "" || kv[1] == "" {
			return nil, fmt.Errorf("invalid CNI_ARGS pair %q", pair)
		}
		out = append(out, [2]string{kv[0], kv[1]})
	}
	return out, nil
}

func fail(err error) {
	var terr *types.Error
	if errors.As(err, &terr) {
		if b, jerr := json.Marshal(terr); jerr == nil {
			fmt.Fprintln(os.Stdout, string(b))
		}
	}
	fmt.Fprintf(os.Stderr, "libcni-driver: %v\n", err)
	os.Exit(1)
}

func main() {
	if len(os.Args) != 4 {
		usage()
	}
	cmd, netName, netns := os.Args[1], os.Args[2], os.Args[3]
	switch cmd {
	case "add", "check", "del":
	default:
		usage()
	}

	netdir := os.Getenv("NETCONFPATH")
	if netdir == "" {
		netdir = defaultNetDir
	}
	netconf, err := libcni.LoadConfList(netdir, netName)
	if err != nil {
		fail(fmt.Errorf("loading network %q from %s: %w", netName, netdir, err))
	}

	var capArgs map[string]interface{}
	if v := os.Getenv("CAP_ARGS"); v != "" {
		if err := json.Unmarshal([]byte(v), &capArgs); err != nil {
			fail(fmt.Errorf("CAP_ARGS is not a JSON object: %w", err))
		}
	}

	var cniArgs [][2]string
	if v := os.Getenv("CNI_ARGS"); v != "" {
		if cniArgs, err = parseArgs(v); err != nil {
			fail(err)
		}
	}

	ifName, ok := os.LookupEnv("CNI_IFNAME")
	if !ok {
		ifName = "eth0"
	}

	netns, err = filepath.Abs(netns)
	if err != nil {
		fail(err)
	}

	containerID := os.Getenv("CNI_CONTAINERID")
	if containerID == "" {
		s := sha512.Sum512([]byte(netns))
		containerID = fmt.Sprintf("cnitool-%x", s[:10])
	}

	cacheDir := os.Getenv("CNI_CACHE_DIR")
	if cacheDir == "" {
		cacheDir = libcni.CacheDir
	}

	cninet := libcni.NewCNIConfigWithCacheDir(filepath.SplitList(os.Getenv("CNI_PATH")), cacheDir, nil)
	rt := &libcni.RuntimeConf{
		ContainerID:    containerID,
		NetNS:          netns,
		IfName:         ifName,
		Args:           cniArgs,
		CapabilityArgs: capArgs,
	}

	ctx := context.Background()
	switch cmd {
	case "add":
		result, err := cninet.AddNetworkList(ctx, netconf, rt)
		if err != nil {
			fail(err)
		}
		if result != nil {
			if err := result.Print(); err != nil {
				fail(fmt.Errorf("printing result: %w", err))
			}
		}
	case "check":
		if err := cninet.CheckNetworkList(ctx, netconf, rt); err != nil {
			fail(err)
		}
	case "del":
		if err := cninet.DelNetworkList(ctx, netconf, rt); err != nil {
			fail(err)
		}
	}
}
