package network_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/backend/sim"
	"github.com/zyvor/kairon/internal/node"
	"github.com/zyvor/kairon/internal/node/network"
	"github.com/zyvor/kairon/internal/testenv"
	"github.com/zyvor/kairon/internal/testenv/host"
)

func TestMain(m *testing.M) {
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(zapcore.WarnLevel)))
	os.Exit(testenv.Run(m))
}

// The agent pins a Machine's tap when it attaches it, writes the baseline
// again when the ruleset is flushed, pins the taps of the VMs it adopts,
// and removes the Machine's entries when the Machine goes. The sim backend
// runs no VM, but the agent makes the tap and its baseline all the same.
func TestAgentPinsItsMachinesTaps(t *testing.T) {
	host.SkipIfShort(t, "root, to make network namespaces, and the control plane")
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	netns := agentTestNetNS(t)
	state := t.TempDir()
	const nodeName = "baseline-agent"
	cidr := netip.MustParsePrefix("10.88.9.0/24")
	start := func() (stop func()) {
		vms, err := sim.New(sim.Options{StateDir: filepath.Join(state, "instances"), BootDelay: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		agent, err := node.New(env.Config, node.Options{
			NodeName: nodeName, Register: true, Backend: vms, StateDir: state,
			CPU: 2, Memory: resource.MustParse("2Gi"),
			Network:  &node.NetworkOptions{CIDR: cidr, Bridge: "kbr0", NetNS: netns},
			Interval: time.Second,
		})
		if err != nil {
			t.Fatal(err)
		}
		return testenv.RunInBackground(t, "agent", agent.Run)
	}
	stop := start()
	t.Cleanup(func() { _ = env.Client.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}) })

	// Placed by hand: no scheduler runs here.
	m := &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"}, Spec: kaironv1.MachineSpec{NodeName: nodeName}}
	if err := env.Client.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	key := client.ObjectKeyFromObject(m)
	testenv.Eventually(t, time.Minute, "the Machine running with an address", func() (bool, string) {
		if err := env.Client.Get(ctx, key, m); err != nil {
			return false, err.Error()
		}
		return m.Status.Phase == kaironv1.MachineRunning && len(m.Status.Addresses) > 0, string(m.Status.Phase)
	})
	id := ns + "_web"
	tap := network.TapName(nodeName, id)
	pinned := []string{
		"chain g_" + tap + " {",
		"ether saddr != " + network.MAC(id) + " drop",
		"ip saddr != " + m.Status.Addresses[0].Address + " drop",
		"arp saddr ip != " + m.Status.Addresses[0].Address + " drop",
		"oifname != @ns_" + ns + " drop",
		`"` + tap + `" : goto g_` + tap,
	}
	listing := func() string {
		out, _ := exec.Command("ip", "netns", "exec", netns, "nft", "list", "table", "bridge", network.BaselineTable).CombinedOutput()
		return string(out)
	}
	isPinned := func() (bool, string) {
		out := listing()
		for _, want := range pinned {
			if !strings.Contains(out, want) {
				return false, "no " + want + " in:\n" + out
			}
		}
		return true, ""
	}
	testenv.Eventually(t, waitTimeout, "the Machine's tap pinned", isPinned)

	if out, err := exec.Command("ip", "netns", "exec", netns, "nft", "flush", "ruleset").CombinedOutput(); err != nil {
		t.Fatalf("nft flush ruleset: %v: %s", err, out)
	}
	testenv.Eventually(t, waitTimeout, "the agent writing the flushed baseline again", isPinned)

	// A VM from before the baseline: its tap has none when the next agent
	// adopts it.
	stop()
	other := &network.Baseline{NetNS: netns, Bridge: "kbr0", Network: cidr, Gateway: netip.MustParseAddr("10.88.9.1")}
	if err := other.Setup(); err != nil {
		t.Fatal(err)
	}
	if err := other.Remove(tap, ns); err != nil {
		t.Fatal(err)
	}
	if ok, _ := isPinned(); ok {
		t.Fatal("the tap is still pinned after Remove")
	}
	start()
	testenv.Eventually(t, waitTimeout, "the restarted agent pinning the tap of the VM it adopted", isPinned)

	if err := env.Client.Delete(ctx, m); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, waitTimeout, "the Machine gone", func() (bool, string) {
		err := env.Client.Get(ctx, key, m)
		return apierrors.IsNotFound(err), string(m.Status.Phase)
	})
	testenv.Eventually(t, waitTimeout, "the tap's baseline removed", func() (bool, string) {
		out := listing()
		return !strings.Contains(out, tap) && !strings.Contains(out, "ns_"+ns), out
	})
}

const waitTimeout = 30 * time.Second

func agentTestNetNS(t *testing.T) string {
	t.Helper()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := "kairon-test-" + hex.EncodeToString(b)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s (needs root and iproute2)", name, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	return name
}
