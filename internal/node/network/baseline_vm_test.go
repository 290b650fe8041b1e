package network

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/zyvor/kairon/internal/backend"
	"github.com/zyvor/kairon/internal/backend/qemu"
	"github.com/zyvor/kairon/internal/testenv"
)

// TestBaselineWithRealGuests boots two real guests on taps the agent's
// code makes and pins, and has the guest of team-a try, from its own shell,
// what an attacker would: a guest of team-b, the node's ports, and a second
// address it configures for itself.
func TestBaselineWithRealGuests(t *testing.T) {
	n := newTestNet(t, "node-1") // skips under -short
	guestDir, ok := qemu.LocateGuestDir()
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil || !ok {
		if os.Getenv("KAIRON_SKIP_VM_TESTS") == "1" {
			t.Skip("KAIRON_SKIP_VM_TESTS=1: QEMU or the guest image is missing")
		}
		t.Fatalf("QEMU (%v) or the guest image (%q) is missing: run `make deps guest`", err, guestDir)
	}
	links := &Links{Bridge: n.bridge, Gateway: netip.PrefixFrom(n.gateway, 16), NetNS: n.host, Node: "node-1"}
	state, err := os.MkdirTemp("", "kbl-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(state) })
	vms, err := qemu.New(qemu.Options{StateDir: state, GuestDir: guestDir, NetNS: n.host})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	// Same-namespace peer: a veth guest of team-a, answering "hi".
	peer := n.guest(t, n.baseline, "node-1", "team-a", "peer", "10.88.1.3")
	serveTCP(t, peer.netns, "10.88.1.3:7000")
	serveTCP(t, n.host, n.gateway.String()+":10250") // stands for the agent's ports

	boot := func(namespace, name, address string) string {
		id := namespace + "_" + name
		tap, err := links.EnsureTap(id)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = links.DeleteTap(id) })
		addr := netip.MustParseAddr(address)
		if err := n.baseline.Ensure(Guest{Tap: tap, Namespace: namespace, MAC: MAC(id), IP: addr}); err != nil {
			t.Fatal(err)
		}
		spec := backend.Spec{
			ID: id, Name: namespace + "/" + name, CPU: 1, MemoryMiB: 256,
			Kernel: filepath.Join(guestDir, qemu.DefaultImage, "vmlinux"), Initrd: filepath.Join(guestDir, qemu.DefaultImage, "initramfs.cpio.gz"),
			Network: &backend.Network{TapName: tap, MAC: MAC(id), Address: netip.PrefixFrom(addr, 16), Gateway: n.gateway},
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
		return id
	}
	a := boot("team-a", "web", "10.88.1.2")
	b := boot("team-b", "web", "10.88.1.4")
	for _, id := range []string{a, b} {
		testenv.Eventually(t, 3*time.Minute, id+" to be ready", func() (bool, string) {
			inst, err := vms.Get(ctx, id)
			if err != nil || inst.Phase == backend.Exited {
				t.Fatalf("%s: %+v %v", id, inst, err)
			}
			return inst.Phase == backend.Running, string(inst.Phase)
		})
	}

	// The node reaches both guests' web servers (their replies pass).
	for _, addr := range []string{"10.88.1.2:8080", "10.88.1.4:8080"} {
		testenv.Eventually(t, waitTimeout, "the node fetching "+addr, func() (bool, string) {
			page, err := httpGetInNetNS(n.host, addr)
			return err == nil && strings.Contains(page, "kairon guest"), fmt.Sprint(page, err)
		})
	}

	con := testenv.DialConsole(t, vms.ConsoleSocket(a))
	// count runs a command in the guest's shell and returns how many lines
	// of its output are exactly want.
	count := func(label, command, want string) string {
		return con.Expect(t, fmt.Sprintf("echo %s:$(%s 2>&1 | grep -cx %s).", label, command, want),
			regexp.MustCompile(label+`:(\d+)\.`), time.Minute)[1]
	}
	if got := count("peer", "nc -w 3 10.88.1.3 7000 </dev/null", "hi"); got != "1" {
		t.Fatalf("the guest of team-a did not reach its namespace's peer (%s)", got)
	}
	if got := count("other", `printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 3 10.88.1.4 8080`, "'kairon guest web'"); got != "0" {
		t.Errorf("the guest of team-a fetched the page of team-b's guest")
	}
	if got := count("node", "nc -w 3 10.88.0.1 10250 </dev/null", "hi"); got != "0" {
		t.Errorf("the guest connected to the node's port")
	}
	// The guest takes another address too and talks from it (a host route
	// with that source; busybox nc has no -s): dropped, while the same
	// connection from its own address goes through.
	con.ExpectText(t, "ip addr add 10.88.1.9/32 dev eth0 && ip route add 10.88.1.3/32 dev eth0 src 10.88.1.9 && echo spoofing-$((1+1))", "spoofing-2", time.Minute)
	if got := count("spoof", "nc -w 3 10.88.1.3 7000 </dev/null", "hi"); got != "0" {
		t.Errorf("the guest reached its peer from an address that is not its own")
	}
	con.ExpectText(t, "ip route del 10.88.1.3/32 && echo own-$((1+1))", "own-2", time.Minute)
	if got := count("own", "nc -w 3 10.88.1.3 7000 </dev/null", "hi"); got != "1" {
		t.Errorf("the guest no longer reaches its peer from its own address (%s)", got)
	}
}

// httpGetInNetNS fetches http://addr/ from network namespace ns.
func httpGetInNetNS(ns, addr string) (string, error) {
	var page string
	err := inNetNS(ns, func() error {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write([]byte("GET / HTTP/1.0\r\n\r\n")); err != nil {
			return err
		}
		b, err := io.ReadAll(c)
		page = string(b)
		return err
	})
	return page, err
}
