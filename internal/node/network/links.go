package network

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"strings"
)

// Links creates the node's bridge and the Machines' taps with iproute2. When
// NetNS is set everything lives in that network namespace (which must exist),
// so tests and locked-down hosts keep guest traffic off the host's own stack.
type Links struct {
	Bridge  string
	Gateway netip.Prefix
	NetNS   string
	// Node names the taps' owner: several agents may share a namespace and
	// a bridge (kairon-local), and during a migration two of them hold a tap
	// for the same Machine.
	Node string
}

// TapName is a node's tap for a Machine ID: short (IFNAMSIZ is 16) and
// stable, so a restarted agent finds the taps it made.
func TapName(node, id string) string {
	sum := sha256.Sum256([]byte(node + "/" + id))
	return TapPrefix + hex.EncodeToString(sum[:])[:10]
}

// MAC is a stable, locally administered address for a Machine ID.
func MAC(id string) string {
	sum := sha256.Sum256([]byte("mac/" + id))
	return fmt.Sprintf("52:54:00:%02x:%02x:%02x", sum[0], sum[1], sum[2])
}

// EnsureBridge creates the bridge with the gateway address and brings it up.
// It is idempotent, also when agents sharing the bridge race to create it.
func (l *Links) EnsureBridge() error {
	if !l.exists(l.Bridge) {
		if err := l.ip("link", "add", "name", l.Bridge, "type", "bridge"); err != nil && !l.exists(l.Bridge) {
			return err
		}
		// Guests have IPv4 only and nothing on the node serves them IPv6:
		// the bridge this agent made sends no router solicitations, DAD
		// or MLD to them. A bridge someone else made is left as it is; the
		// baseline drops its IPv6 at the taps anyway.
		if err := l.disableIPv6(l.Bridge); err != nil {
			return err
		}
	}
	// A bridge without an address of its own takes the lowest of its
	// ports' addresses, and changes it as taps come and go: guests would
	// keep sending to the gateway's old address, which the node no longer
	// routes for (a guest that arrived by migration, or whose neighbour
	// left, loses the outside). A fixed address, the same for every agent
	// sharing the bridge, never moves; arp_notify announces it to guests
	// that cached another one when it is first set.
	if err := l.sysctl("net/ipv4/conf/"+l.Bridge+"/arp_notify", "1"); err != nil {
		return err
	}
	if mac := BridgeMAC(l.Bridge); !l.hasAddress(mac) {
		if err := l.ip("link", "set", l.Bridge, "address", mac); err != nil {
			return err
		}
	}
	if !l.hasGateway() {
		if err := l.ip("addr", "add", l.Gateway.String(), "dev", l.Bridge); err != nil && !l.hasGateway() {
			return err
		}
	}
	return l.ip("link", "set", l.Bridge, "up")
}

var sysctlKey = regexp.MustCompile(`^[A-Za-z0-9_./-]+$`)

// BridgeMAC is the bridge's own address: locally administered, from its
// name.
func BridgeMAC(bridge string) string {
	sum := sha256.Sum256([]byte("bridge/" + bridge))
	return fmt.Sprintf("02:%02x:%02x:%02x:%02x:%02x", sum[0], sum[1], sum[2], sum[3], sum[4])
}

func (l *Links) hasAddress(mac string) bool {
	out, err := l.output("-o", "link", "show", "dev", l.Bridge)
	return err == nil && strings.Contains(out, " link/ether "+mac+" ")
}

// sysctl writes a value under /proc/sys in the links' namespace (a
// network sysctl is per namespace: the writer must be in it).
func (l *Links) sysctl(key, value string) error {
	if !sysctlKey.MatchString(key) || !sysctlKey.MatchString(value) {
		return fmt.Errorf("node network: sysctl %q=%q: not a key and value", key, value)
	}
	args := []string{"sh", "-c", "echo " + value + " > /proc/sys/" + key}
	if l.NetNS != "" {
		args = append([]string{"ip", "netns", "exec", l.NetNS}, args...)
	}
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		return fmt.Errorf("node network: %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// disableIPv6 turns IPv6 off on dev; a kernel without IPv6 has none to
// turn off.
func (l *Links) disableIPv6(dev string) error {
	if _, err := os.Stat("/proc/sys/net/ipv6"); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return l.sysctl("net/ipv6/conf/"+dev+"/disable_ipv6", "1")
}

func (l *Links) hasGateway() bool {
	out, err := l.output("-o", "addr", "show", "dev", l.Bridge)
	return err == nil && strings.Contains(out, " "+l.Gateway.String()+" ")
}

// EnsureTap creates id's tap on the bridge, up. It is idempotent.
func (l *Links) EnsureTap(id string) (string, error) {
	tap := TapName(l.Node, id)
	if !l.exists(tap) {
		if err := l.ip("tuntap", "add", "dev", tap, "mode", "tap"); err != nil {
			return "", err
		}
	}
	// Before the tap is up: the host's IPv6 on it (a link-local address,
	// router solicitations, DAD, MLD) would go out to the guest directly,
	// past every bridge hook.
	if err := l.disableIPv6(tap); err != nil {
		return "", err
	}
	if err := l.ip("link", "set", tap, "master", l.Bridge, "up"); err != nil {
		return "", err
	}
	return tap, nil
}

// DeleteTap removes id's tap; a missing tap is not an error.
func (l *Links) DeleteTap(id string) error {
	tap := TapName(l.Node, id)
	if !l.exists(tap) {
		return nil
	}
	return l.ip("link", "del", tap)
}

// Taps lists the taps this package made (by their prefix).
func (l *Links) Taps() ([]string, error) {
	out, err := l.output("-o", "link", "show", "type", "tun")
	if err != nil {
		return nil, err
	}
	var taps []string
	for _, line := range strings.Split(out, "\n") {
		fields := strings.Fields(line)
		if len(fields) < 2 {
			continue
		}
		name := strings.TrimSuffix(strings.SplitN(fields[1], "@", 2)[0], ":")
		if strings.HasPrefix(name, TapPrefix) {
			taps = append(taps, name)
		}
	}
	return taps, nil
}

func (l *Links) exists(name string) bool {
	_, err := l.output("link", "show", "dev", name)
	return err == nil
}

func (l *Links) ip(args ...string) error {
	_, err := l.output(args...)
	return err
}

func (l *Links) output(args ...string) (string, error) {
	if l.NetNS != "" {
		args = append([]string{"-n", l.NetNS}, args...)
	}
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}
