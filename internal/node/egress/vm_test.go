package egress

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/backend"
	"github.com/zyvor/kairon/internal/backend/qemu"
	"github.com/zyvor/kairon/internal/node/network"
	"github.com/zyvor/kairon/internal/testenv"
)

// TestEgressWithARealGuest boots a real guest on a tap of the test node,
// confines it to pkg.test on port 8050, and has it try from its own shell:
// resolve pkg.test and connect, another port, another host by address, a
// name it may not resolve.
func TestEgressWithARealGuest(t *testing.T) {
	n := newTestNode(t) // skips under -short
	guestDir, ok := qemu.LocateGuestDir()
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil || !ok {
		if os.Getenv("KAIRON_SKIP_VM_TESTS") == "1" {
			t.Skip("KAIRON_SKIP_VM_TESTS=1: QEMU or the guest image is missing")
		}
		t.Fatalf("QEMU (%v) or the guest image (%q) is missing: run `make deps guest`", err, guestDir)
	}
	n.enforcer.DNSPort = dnsProxyPort
	if err := n.enforcer.Setup(); err != nil {
		t.Fatal(err)
	}
	upstreamDNS(t, n.outside, uplinkOutside+":53", 300, map[string]string{"pkg.test": pkgAddr, "other.test": otherAddr})
	n.startDNSProxy(t, uplinkOutside+":53", nil)
	n.allowDNSProxy(t)
	for _, a := range []string{pkgAddr + ":8050", pkgAddr + ":9000", otherAddr + ":8050"} {
		serveTCP(t, n.outside, a)
	}

	links := &network.Links{Bridge: n.bridge, Gateway: netip.PrefixFrom(n.gateway, 16), NetNS: n.host, Node: "node-1"}
	state, err := os.MkdirTemp("", "keg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(state) })
	vms, err := qemu.New(qemu.Options{StateDir: state, GuestDir: guestDir, NetNS: n.host})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	id := "team-a_sandbox"
	tap, err := links.EnsureTap(id)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = links.DeleteTap(id) })
	addr := netip.MustParseAddr("10.88.1.2")
	if err := n.baseline.Ensure(network.Guest{Tap: tap, Namespace: "team-a", MAC: network.MAC(id), IP: addr}); err != nil {
		t.Fatal(err)
	}
	m := Machine{Namespace: "team-a", Name: "sandbox", Tap: tap, MAC: macOf("team-a", "sandbox"), IP: addr}
	// Confined before it boots: the guest never runs open.
	if err := n.enforcer.Apply(m, mustCompile(t, kaironv1.EgressRules{AllowFqdns: []kaironv1.Hostname{"pkg.test"}, AllowPorts: []kaironv1.PortRange{"8050"}})); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.enforcer.Remove(tap) })
	spec := backend.Spec{
		ID: id, Name: "team-a/sandbox", CPU: 1, MemoryMiB: 256,
		Kernel: filepath.Join(guestDir, qemu.DefaultImage, "vmlinux"), Initrd: filepath.Join(guestDir, qemu.DefaultImage, "initramfs.cpio.gz"),
		Network: &backend.Network{TapName: tap, MAC: network.MAC(id), Address: netip.PrefixFrom(addr, 16), Gateway: n.gateway},
	}
	if _, err := vms.Start(ctx, spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := vms.Stop(stopCtx, id); err != nil {
			t.Errorf("stopping %s: %v", id, err)
		}
	})
	testenv.Eventually(t, 3*time.Minute, id+" to be ready", func() (bool, string) {
		inst, err := vms.Get(ctx, id)
		if err != nil || inst.Phase == backend.Exited {
			t.Fatalf("%s: %+v %v", id, inst, err)
		}
		return inst.Phase == backend.Running, string(inst.Phase)
	})

	con := testenv.DialConsole(t, vms.ConsoleSocket(id))
	// count runs a command in the guest's shell and returns how many lines
	// of its output match the extended regular expression want.
	count := func(label, command, want string) string {
		return con.Expect(t, fmt.Sprintf("echo %s:$(%s 2>&1 | grep -cE '%s').", label, command, want),
			regexp.MustCompile(label+`:(\d+)\.`), time.Minute)[1]
	}
	// A hard-coded address, before any lookup: nothing.
	if got := count("early", "nc -w 3 "+pkgAddr+" 8050 </dev/null", "^hi$"); got != "0" {
		t.Errorf("the guest reached pkg.test's address without resolving it")
	}
	if got := count("resolve", "nslookup pkg.test 198.51.100.53", pkgAddr); got == "0" {
		t.Fatalf("the guest could not resolve pkg.test")
	}
	if got := count("allowed", "nc -w 3 "+pkgAddr+" 8050 </dev/null", "^hi$"); got != "1" {
		t.Fatalf("the guest did not reach pkg.test on 8050 after resolving it (%s)", got)
	}
	if got := count("port", "nc -w 3 "+pkgAddr+" 9000 </dev/null", "^hi$"); got != "0" {
		t.Errorf("the guest reached pkg.test on a port not allowed")
	}
	if got := count("other", "nc -w 3 "+otherAddr+" 8050 </dev/null", "^hi$"); got != "0" {
		t.Errorf("the guest reached another host by address")
	}
	if got := count("refused", "nslookup other.test 198.51.100.53", otherAddr); got != "0" {
		t.Errorf("the guest resolved other.test")
	}
}
