package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/zyvor/kairon/internal/node/egress"
	"github.com/zyvor/kairon/internal/node/network"
)

// The guest network of a data dir's QEMU nodes lives outside the data dir:
// the bridge, a tap per VM, and the nftables tables of the guests'
// baseline and egress rules, in the host's network namespace or in --netns.
// `down` keeps it for the next `up`, whose VMs resume on their taps.
// `down --purge` deletes the data dir, after which nothing would ever use
// it again, so it removes it too, unless other Kairon processes still use
// that namespace (another kairon-local's agents and VMs share the bridge).

// guestBridge is the bridge every node of a kairon-local puts its guests on.
const guestBridge = "kairon0"

// guestNetworkFile records where up's nodes keep the guest network. Only
// nodes with VMs of their own (not sim) have one.
func guestNetworkFile(dataDir string) string { return filepath.Join(dataDir, "guest-network.json") }

type guestNetwork struct {
	// NetNS is --netns; empty for the host's namespace.
	NetNS  string `json:"netns"`
	Bridge string `json:"bridge"`
}

func recordGuestNetwork(dataDir, netns string) error {
	data, err := json.Marshal(guestNetwork{NetNS: netns, Bridge: guestBridge})
	if err != nil {
		return err
	}
	return os.WriteFile(guestNetworkFile(dataDir), data, 0o644)
}

// purgeGuestNetwork removes the guest network recorded in dataDir, saying
// what it did on out. A data dir without a record (sim nodes, the control
// plane alone, or a kairon-local older than the record) has none to remove.
func purgeGuestNetwork(dataDir string, out io.Writer) error {
	data, err := os.ReadFile(guestNetworkFile(dataDir))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var gn guestNetwork
	if err := json.Unmarshal(data, &gn); err != nil || gn.Bridge == "" {
		return fmt.Errorf("%s: not a guest network record (%v); delete it to purge the data dir without removing the network", guestNetworkFile(dataDir), err)
	}
	where := "this host's network namespace"
	if gn.NetNS != "" {
		where = "network namespace " + gn.NetNS
	}
	ns, err := netnsInode(gn.NetNS)
	if errors.Is(err, os.ErrNotExist) {
		return nil // the namespace, and everything in it, is gone already
	}
	if err != nil {
		return err
	}
	if users := guestNetworkUsers(ns, true); len(users) > 0 {
		fmt.Fprintf(out, "kairon-local: leaving the guest network (bridge %s, its taps, nftables tables %s and %s) in %s: other Kairon processes use it (%s)\n",
			gn.Bridge, network.BaselineTable, egress.Table, where, listUsers(users))
		return nil
	}

	ipArgs := func(args ...string) []string {
		if gn.NetNS != "" {
			return append([]string{"-n", gn.NetNS}, args...)
		}
		return args
	}
	taps, err := (&network.Links{NetNS: gn.NetNS}).Taps()
	if err != nil {
		return fmt.Errorf("listing the taps in %s: %w", where, err)
	}
	var removed []string
	for _, name := range append(taps, gn.Bridge) {
		if exec.Command("ip", ipArgs("link", "show", "dev", name)...).Run() != nil {
			continue // not there
		}
		if text, err := exec.Command("ip", ipArgs("link", "del", name)...).CombinedOutput(); err != nil {
			return fmt.Errorf("removing %s in %s: %v: %s", name, where, err, strings.TrimSpace(string(text)))
		}
		removed = append(removed, name)
	}
	if err := network.RemoveBaseline(gn.NetNS); err != nil {
		return fmt.Errorf("removing nftables table %s in %s: %w", network.BaselineTable, where, err)
	}
	if err := egress.RemoveTables(gn.NetNS); err != nil {
		return fmt.Errorf("removing nftables table %s in %s: %w", egress.Table, where, err)
	}
	fmt.Fprintf(out, "kairon-local: removed the guest network in %s: %d links (bridge %s and the VMs' taps), nftables tables %s and %s\n",
		where, len(removed), gn.Bridge, network.BaselineTable, egress.Table)
	return nil
}
