package network

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/zyvor/kairon/internal/testenv/host"
)

// testNetNS creates a network namespace for the test and deletes it (and
// every link in it) afterwards, so nothing touches the host's own network.
func testNetNS(t *testing.T) string {
	t.Helper()
	host.SkipIfShort(t, "root, to make network namespaces")
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := "kairon-test-" + hex.EncodeToString(b)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s (the network tests need root and iproute2)", name, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	return name
}

func TestLinksCreateAndRemoveBridgeAndTaps(t *testing.T) {
	ns := testNetNS(t)
	links := &Links{Bridge: "kbr0", Gateway: netip.MustParsePrefix("10.88.0.1/24"), NetNS: ns}

	for range 2 { // idempotent
		if err := links.EnsureBridge(); err != nil {
			t.Fatal(err)
		}
	}
	out, err := links.output("-o", "addr", "show", "dev", "kbr0")
	if err != nil || !strings.Contains(out, "10.88.0.1/24") {
		t.Fatalf("bridge address: %v %s", err, out)
	}

	var taps []string
	for _, id := range []string{"ns_a", "ns_b"} {
		tap, err := links.EnsureTap(id)
		if err != nil {
			t.Fatal(err)
		}
		if again, err := links.EnsureTap(id); err != nil || again != tap {
			t.Fatalf("EnsureTap twice: %s %v", again, err)
		}
		taps = append(taps, tap)
		out, err := links.output("-o", "link", "show", "dev", tap)
		if err != nil || !strings.Contains(out, "master kbr0") {
			t.Fatalf("tap %s not on the bridge: %v %s", tap, err, out)
		}
	}
	// No IPv6 on the bridge this agent made nor on its taps: the host
	// sends guests no router solicitations, DAD or MLD.
	for _, dev := range append([]string{"kbr0"}, taps...) {
		out, err := exec.Command("ip", "netns", "exec", ns, "cat", "/proc/sys/net/ipv6/conf/"+dev+"/disable_ipv6").CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "1" {
			t.Errorf("disable_ipv6 on %s: %v %q, want 1", dev, err, out)
		}
		if out, err := links.output("-6", "-o", "addr", "show", "dev", dev); err != nil || strings.TrimSpace(out) != "" {
			t.Errorf("IPv6 addresses on %s: %v %q, want none", dev, err, out)
		}
	}
	listed, err := links.Taps()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(listed)
	slices.Sort(taps)
	if !slices.Equal(listed, taps) {
		t.Errorf("Taps() = %v, want %v", listed, taps)
	}

	for _, id := range []string{"ns_a", "ns_b", "ns_a"} { // deleting twice is fine
		if err := links.DeleteTap(id); err != nil {
			t.Fatal(err)
		}
	}
	if left, _ := links.Taps(); len(left) != 0 {
		t.Errorf("taps left after delete: %v", left)
	}
}

// TestBridgeAddressStaysPut: the gateway's MAC does not follow the taps. A
// bridge without an address of its own takes its lowest port's; a guest
// that cached the old one would lose the outside when a tap came or went.
func TestBridgeAddressStaysPut(t *testing.T) {
	ns := testNetNS(t)
	links := &Links{Bridge: "kbr0", Gateway: netip.MustParsePrefix("10.88.0.1/24"), NetNS: ns}
	if err := links.EnsureBridge(); err != nil {
		t.Fatal(err)
	}
	if !links.hasAddress(BridgeMAC("kbr0")) {
		out, _ := links.output("-o", "link", "show", "dev", "kbr0")
		t.Fatalf("bridge address is not %s: %s", BridgeMAC("kbr0"), out)
	}
	// Taps with addresses below and above the bridge's, one going again.
	for i, mac := range []string{"00:00:00:00:00:01", "fe:ff:ff:ff:ff:fe"} {
		tap, err := links.EnsureTap(fmt.Sprintf("ns_m%d", i))
		if err != nil {
			t.Fatal(err)
		}
		if err := links.ip("link", "set", tap, "address", mac); err != nil {
			t.Fatal(err)
		}
		if !links.hasAddress(BridgeMAC("kbr0")) {
			out, _ := links.output("-o", "link", "show", "dev", "kbr0")
			t.Fatalf("the bridge took another address when a tap with %s joined: %s", mac, out)
		}
	}
	if err := links.DeleteTap("ns_m0"); err != nil {
		t.Fatal(err)
	}
	if !links.hasAddress(BridgeMAC("kbr0")) {
		t.Fatal("the bridge's address changed when a tap left")
	}
	out, err := exec.Command("ip", "netns", "exec", ns, "cat", "/proc/sys/net/ipv4/conf/kbr0/arp_notify").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "1" {
		t.Fatalf("arp_notify on the bridge: %v %q, want 1", err, out)
	}
}
