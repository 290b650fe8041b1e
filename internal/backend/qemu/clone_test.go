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

// A clone's identity: the Machine's name as one DNS label, the spec's MAC,
// address, gateway and nameserver, a full seed and the nonce.
func TestCloneConfigure(t *testing.T) {
	spec := backend.Spec{ID: "ns_web.1", Name: "ns/web.1", Network: &backend.Network{
		MAC: "52:54:00:ab:cd:ef", Address: netip.MustParsePrefix("10.88.0.7/24"), Gateway: netip.MustParseAddr("10.88.0.1"),
		Nameserver: netip.MustParseAddr("192.0.2.53"),
	}}
	cfg, err := cloneConfigure(spec, "n0nce")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Hostname != "web-1" || cfg.MAC != spec.Network.MAC || len(cfg.Addresses) != 1 || cfg.Addresses[0] != "10.88.0.7/24" ||
		cfg.Gateway != "10.88.0.1" || fmt.Sprint(cfg.DNS) != "[192.0.2.53]" || len(cfg.Seed) != cloneSeedBytes || cfg.Boot != "n0nce" {
		t.Errorf("configure %+v", cfg)
	}
	// A network without a nameserver leaves the guest's as it is.
	spec.Network.Nameserver = netip.Addr{}
	if cfg, err := cloneConfigure(spec, "n0nce"); err != nil || cfg.DNS != nil {
		t.Errorf("configure without a nameserver %+v %v", cfg, err)
	}
	other, err := cloneConfigure(spec, "n0nce")
	if err != nil || string(other.Seed) == string(cfg.Seed) {
		t.Errorf("two clones got the same seed (%v)", err)
	}
	// Without a NIC: only the hostname, seed and nonce.
	cfg, err = cloneConfigure(backend.Spec{ID: "ns_a", Name: "ns/a"}, "n0nce")
	if err != nil || cfg.MAC != "" || cfg.Addresses != nil || cfg.Gateway != "" || cfg.Hostname != "a" {
		t.Errorf("configure without a NIC %+v %v", cfg, err)
	}
}

// A Backend that stopped between a clone's restore and its configure (a
// node agent restarted): the Backend that adopts the VM gives the guest its
// identity, and only then is the clone Running, with its own nonce.
func TestAdoptedCloneTakesItsIdentity(t *testing.T) {
	vmPrereqs(t)
	state := shortTempDir(t)
	b := newTestBackend(t, Options{StateDir: state, Log: testLogger(t)})
	ctx := context.Background()
	tmpl := backend.Spec{ID: "p_tmpl", Name: "p/tmpl", CPU: 1, MemoryMiB: 256}
	if _, err := b.Start(ctx, tmpl); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, b, tmpl.ID, backend.Running, bootTimeout)
	file := filepath.Join(shortTempDir(t), "tmpl.state")
	if err := b.Save(ctx, tmpl.ID, file); err != nil {
		t.Fatal(err)
	}
	if err := b.Stop(ctx, tmpl.ID); err != nil {
		t.Fatal(err)
	}

	clone := backend.Spec{ID: "p_adopted", Name: "p/adopted", CPU: 1, MemoryMiB: 256}
	skip := func(id string) bool { return id == clone.ID }
	cloneConfigureSkipped.Store(&skip)
	_, err := b.RestoreClone(ctx, clone, file)
	cloneConfigureSkipped.Store(nil)
	if err != nil {
		t.Fatal(err)
	}
	if inst, err := b.Get(ctx, clone.ID); err != nil || inst.Phase != backend.Booting {
		t.Fatalf("a clone without its identity is %+v %v, want Booting", inst, err)
	}
	m, err := readMeta(b.dir(clone.ID))
	if err != nil {
		t.Fatal(err)
	}

	// The first Backend goes, as with its agent: its watcher lets go of
	// the guest's channel, which serves one client at a time.
	v := b.vm(clone.ID)
	v.mu.Lock()
	v.gen++
	v.proc = nil
	v.mu.Unlock()

	adopter := newTestBackend(t, Options{StateDir: state, Log: testLogger(t)})
	waitPhase(t, adopter, clone.ID, backend.Running, bootTimeout)
	agent := dialAgent(t, adopter, clone.ID)
	st, err := agent.Status(ctx)
	if err != nil || st.Boot != m.BootNonce {
		t.Errorf("adopted clone's agent reports %+v %v, want boot %s", st, err, m.BootNonce)
	}
	if _, out, _ := guestExec(t, agent, nil, "hostname"); out != "adopted\n" {
		t.Errorf("adopted clone's hostname %q", out)
	}
}

// A Get or List while a start runs (the node agent lists its VMs all the
// time) does not take the VM being started for one to adopt: QEMU runs
// before the start records it as its own, and the adoption's watcher then
// configured a clone alongside the start's own configure.
func TestAVMBeingStartedIsNotAdopted(t *testing.T) {
	vmPrereqs(t)
	b := newTestBackend(t, Options{Log: testLogger(t)})
	ctx := context.Background()
	spec := backend.Spec{ID: "p_starting", Name: "p/starting", CPU: 1, MemoryMiB: 128}
	listed := false
	hook := func(id string) {
		if _, err := b.List(ctx); err != nil {
			t.Errorf("List while %s starts: %v", id, err)
		}
		_, adopted := adoptedWatchers.Load(b.dir(id))
		if adopted {
			t.Errorf("a List while %s starts adopted it", id)
		}
		listed = true
	}
	launchedHook.Store(&hook)
	t.Cleanup(func() { launchedHook.Store(nil) })
	if _, err := b.Start(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if !listed {
		t.Fatal("the start never reached the hook")
	}
	waitPhase(t, b, spec.ID, backend.Running, bootTimeout)
}
