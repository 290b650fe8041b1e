package qemu

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/zyvor/kairon/internal/backend"
	"github.com/zyvor/kairon/internal/testenv"
)

// TestRestoreClones saves one booted guest and restores two clones of it on
// one bridge: each takes its own hostname, MAC, address and boot nonce
// before it is Running, reads other bytes from /dev/urandom than its
// sibling right after the restore, and answers on its own address, from
// its own MAC (the bridge learns it on the clone's tap).
func TestRestoreClones(t *testing.T) {
	vmPrereqs(t)
	ns := newTestNetns(t)
	ns.ip(t, "link", "add", "br0", "type", "bridge")
	ns.ip(t, "addr", "add", "10.88.0.1/24", "dev", "br0")
	ns.ip(t, "link", "set", "br0", "up")
	for _, tap := range []string{"ktap0", "ktap1", "ktap2"} {
		ns.ip(t, "tuntap", "add", "dev", tap, "mode", "tap")
		ns.ip(t, "link", "set", tap, "master", "br0")
		ns.ip(t, "link", "set", tap, "up")
	}
	b := newTestBackend(t, Options{NetNS: ns.name, Log: testLogger(t)})
	ctx := context.Background()
	gw := netip.MustParseAddr("10.88.0.1")
	template := backend.Spec{
		ID: "pool_tmpl", Name: "pool/tmpl", CPU: 1, MemoryMiB: 256,
		Network: &backend.Network{TapName: "ktap0", MAC: "52:54:00:00:00:05", Address: netip.MustParsePrefix("10.88.0.5/24"), Gateway: gw},
	}
	if _, err := b.Start(ctx, template); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, b, template.ID, backend.Running, bootTimeout)
	tmplMeta, err := readMeta(b.dir(template.ID))
	if err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(shortTempDir(t), "template.state")
	if err := b.Save(ctx, template.ID, state); err != nil {
		t.Fatal(err)
	}
	if err := b.Stop(ctx, template.ID); err != nil {
		t.Fatal(err)
	}

	type clone struct {
		spec            backend.Spec
		host, mac, addr string
	}
	clones := []clone{
		{host: "clone-a", mac: "52:54:00:00:00:0b", addr: "10.88.0.11"},
		{host: "clone-b", mac: "52:54:00:00:00:0c", addr: "10.88.0.12"},
	}
	random := map[string]string{}
	for i := range clones {
		c := &clones[i]
		c.spec = backend.Spec{
			ID: "pool_" + c.host, Name: "pool/" + c.host, CPU: 1, MemoryMiB: 256,
			Network: &backend.Network{TapName: fmt.Sprintf("ktap%d", i+1), MAC: c.mac, Address: netip.MustParsePrefix(c.addr + "/24"), Gateway: gw},
		}
		began := time.Now()
		if _, err := b.RestoreClone(ctx, c.spec, state); err != nil {
			t.Fatal(err)
		}
		inst := waitPhase(t, b, c.spec.ID, backend.Running, bootTimeout)
		t.Logf("%s Running %s after its restore began (ReadyAfter %s)", c.host, time.Since(began).Round(time.Millisecond), inst.ReadyAfter)
		m, err := readMeta(b.dir(c.spec.ID))
		if err != nil {
			t.Fatal(err)
		}
		if !m.Clone || m.BootNonce == "" || m.BootNonce == tmplMeta.BootNonce {
			t.Errorf("%s: meta clone=%v nonce %q, the template's %q", c.host, m.Clone, m.BootNonce, tmplMeta.BootNonce)
		}
		agent := dialAgent(t, b, c.spec.ID)
		_, rnd, _ := guestExec(t, agent, nil, "sh", "-c", "head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'")
		if len(rnd) != 64 {
			t.Fatalf("%s: /dev/urandom read %q", c.host, rnd)
		}
		if other, seen := random[rnd]; seen {
			t.Errorf("%s read the same 32 random bytes as %s: %s", c.host, other, rnd)
		}
		random[rnd] = c.host
		st, err := agent.Status(ctx)
		if err != nil || st.Boot != m.BootNonce || !st.Ready {
			t.Errorf("%s: agent status %+v %v, want boot %s", c.host, st, err, m.BootNonce)
		}
		_, out, _ := guestExec(t, agent, nil, "sh", "-c", "hostname; cat /sys/class/net/eth0/address; ip -4 addr show dev eth0 | grep inet; ip route | grep default")
		if !strings.HasPrefix(out, c.host+"\n"+c.mac+"\n") || !strings.Contains(out, c.addr+"/24") || strings.Contains(out, "10.88.0.5") ||
			!strings.Contains(out, "default via 10.88.0.1") {
			t.Errorf("%s: the guest has\n%s", c.host, out)
		}
		agent.Close()
	}
	for i, c := range clones {
		if _, echo, err := talkToGuest(t, ns, c.addr); err != nil || echo != "ping kairon\n" {
			t.Errorf("%s at %s: %q %v", c.host, c.addr, echo, err)
		}
		tap := fmt.Sprintf("ktap%d", i+1)
		testenv.Eventually(t, 10*time.Second, "the bridge to learn "+c.mac+" on "+tap, func() (bool, string) {
			out, err := exec.Command("bridge", "-n", ns.name, "fdb", "show", "dev", tap).CombinedOutput()
			// Not "and not the template's MAC": after loading a state QEMU
			// itself announces the NIC's saved MAC (RARP), before the guest
			// changed it; the node's baseline drops those frames.
			return err == nil && strings.Contains(string(out), c.mac), string(out)
		})
	}
}
