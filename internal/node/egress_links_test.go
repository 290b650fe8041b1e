package node_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/backend"
	"github.com/zyvor/kairon/internal/backend/sim"
	"github.com/zyvor/kairon/internal/node"
	"github.com/zyvor/kairon/internal/node/egress"
	"github.com/zyvor/kairon/internal/node/network"
	"github.com/zyvor/kairon/internal/testenv"
	"github.com/zyvor/kairon/internal/testenv/host"
)

// startWatcher is the sim backend, but it reads the egress rules of the
// tap at the moment the agent starts the VM.
type startWatcher struct {
	backend.Backend
	netns string
	mu    sync.Mutex
	seen  map[string]string // tap → the inet table when its VM started
}

func (s *startWatcher) Start(ctx context.Context, spec backend.Spec) (backend.Instance, error) {
	out, _ := exec.Command("ip", "netns", "exec", s.netns, "nft", "list", "table", "inet", egress.Table).CombinedOutput()
	s.mu.Lock()
	s.seen[spec.Network.TapName] = string(out)
	s.mu.Unlock()
	return s.Backend.Start(ctx, spec)
}

func (s *startWatcher) tableAtStart(tap string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out, ok := s.seen[tap]
	return out, ok
}

func nft(t *testing.T, netns string, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", append([]string{"netns", "exec", netns, "nft"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("nft %v: %v: %s", args, err, out)
	}
	return string(out)
}

// TestAgentConfinesBeforeTheVMStarts runs an agent with a real bridge and
// nftables in a namespace of the test: a Machine whose policy exists is
// confined when its VM starts; its rules survive the agent stopping, the
// restarted agent keeps them and applies an edit, and they go with the
// Machine. (The start check also passes without attach's
// confineBeforeStart when the egress reconciler wins the race between the
// address allocation and the start, as it usually does here; the hook
// makes it certain.)
func TestAgentConfinesBeforeTheVMStarts(t *testing.T) {
	host.SkipIfShort(t, "root, to make network namespaces, and the control plane")
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	netns := "kairon-egress-agent-" + hex.EncodeToString(b)
	if out, err := exec.Command("ip", "netns", "add", netns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", netns).Run() })
	state := t.TempDir()
	const nodeName = "egress-agent"
	watcher := &startWatcher{netns: netns, seen: map[string]string{}}
	start := func() (stop func()) {
		vms, err := sim.New(sim.Options{StateDir: filepath.Join(state, "instances"), BootDelay: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		watcher.Backend = vms
		agent, err := node.New(env.Config, node.Options{
			NodeName: nodeName, Register: true, Backend: watcher, StateDir: state,
			CPU: 2, Memory: resource.MustParse("2Gi"),
			Network:  &node.NetworkOptions{CIDR: netip.MustParsePrefix("10.88.9.0/24"), Bridge: "kbr0", NetNS: netns},
			Interval: time.Second,
		})
		if err != nil {
			t.Fatal(err)
		}
		return testenv.RunInBackground(t, "agent", agent.Run)
	}
	stop := start()
	t.Cleanup(func() { _ = env.Client.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}) })

	policy := &kaironv1.MachineNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "sandbox"}, Spec: kaironv1.MachineNetworkPolicySpec{
		MachineName: "vm", Egress: kaironv1.EgressRules{AllowCidrs: []kaironv1.CIDR{"203.0.113.0/24"}, AllowPorts: []kaironv1.PortRange{"443"}},
	}}
	if err := env.Client.Create(ctx, policy); err != nil {
		t.Fatal(err)
	}
	m := &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vm"}, Spec: kaironv1.MachineSpec{NodeName: nodeName}}
	if err := env.Client.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	tap := network.TapName(nodeName, ns+"_vm")
	waitEnforcement(t, env, client.ObjectKeyFromObject(policy), nodeName, "vm")
	// The report may come before the start: the rules go in as the
	// Machine gets its address, the VM starts after.
	var atStart string
	testenv.Eventually(t, time.Minute, "the VM to start", func() (bool, string) {
		var ok bool
		atStart, ok = watcher.tableAtStart(tap)
		return ok, "not started"
	})
	if !strings.Contains(atStart, "chain e_"+tap+" {") || !strings.Contains(atStart, "203.0.113.0/24") {
		t.Fatalf("the VM started before its egress rules were in place; the table then:\n%s", atStart)
	}

	// The agent goes; the rules stay. The next one converges on them,
	// and its status entry says so throughout: a restarted agent does not
	// report the Machine unconfined while it reads its Machines again.
	history := watchEntry(t, env, client.ObjectKeyFromObject(policy), nodeName)
	waitEnforcement(t, env, client.ObjectKeyFromObject(policy), nodeName, "vm")
	check := history.mark("vm")
	stop()
	if table := nft(t, netns, "list", "table", "inet", egress.Table); !strings.Contains(table, "chain e_"+tap+" {") {
		t.Fatalf("the rules went with the agent:\n%s", table)
	}
	stop = start()
	defer stop()
	editPolicy(t, env, client.ObjectKeyFromObject(policy), func(p *kaironv1.MachineNetworkPolicy) {
		p.Spec.Egress.AllowPorts = []kaironv1.PortRange{"8443"}
	})
	waitEnforcement(t, env, client.ObjectKeyFromObject(policy), nodeName, "vm")
	check(t)
	if table := nft(t, netns, "list", "table", "inet", egress.Table); !strings.Contains(table, "th dport 8443 accept") || strings.Contains(table, "th dport 443 accept") {
		t.Fatalf("the restarted agent did not apply the edit:\n%s", table)
	}

	if err := env.Client.Delete(ctx, m); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Minute, "no egress object of the deleted Machine", func() (bool, string) {
		out := nft(t, netns, "list", "table", "inet", egress.Table) + nft(t, netns, "list", "table", "bridge", egress.Table)
		return !strings.Contains(out, tap), fmt.Sprint(out)
	})
}
