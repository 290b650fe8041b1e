package node_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/backend/sim"
	"github.com/zyvor/kairon/internal/node"
	"github.com/zyvor/kairon/internal/testenv"
	"github.com/zyvor/kairon/internal/testenv/host"
)

// TestEgressEnforcementLatency measures, with a links-mode agent and real
// nftables, the time from writing a MachineNetworkPolicy to the agent's
// report of it at that generation, 50 times. A measurement, not a check:
// run with KAIRON_EGRESS_BENCH=1; it logs p50 and p99.
func TestEgressEnforcementLatency(t *testing.T) {
	if os.Getenv("KAIRON_EGRESS_BENCH") != "1" {
		t.Skip("a measurement: KAIRON_EGRESS_BENCH=1 runs it")
	}
	host.SkipIfShort(t, "root and the control plane")
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	netns := "kairon-egress-bench-" + hex.EncodeToString(b)
	if out, err := exec.Command("ip", "netns", "add", netns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", netns).Run() })
	state := t.TempDir()
	const nodeName = "egress-bench"
	vms, err := sim.New(sim.Options{StateDir: filepath.Join(state, "instances"), BootDelay: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	agent, err := node.New(env.Config, node.Options{
		NodeName: nodeName, Register: true, Backend: vms, StateDir: state, CPU: 2, Memory: resource.MustParse("2Gi"),
		Network:  &node.NetworkOptions{CIDR: netip.MustParsePrefix("10.88.9.0/24"), Bridge: "kbr0", NetNS: netns},
		Interval: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	testenv.RunInBackground(t, "agent", agent.Run)
	t.Cleanup(func() { _ = env.Client.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}) })
	m := &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vm"}, Spec: kaironv1.MachineSpec{NodeName: nodeName}}
	if err := env.Client.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, env, client.ObjectKeyFromObject(m), kaironv1.MachineRunning)

	var took []time.Duration
	for i := range 50 {
		p := &kaironv1.MachineNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("p%d", i)}, Spec: kaironv1.MachineNetworkPolicySpec{
			MachineName: "vm", Egress: kaironv1.EgressRules{AllowCidrs: []kaironv1.CIDR{kaironv1.CIDR(fmt.Sprintf("203.0.113.%d/32", i))}},
		}}
		start := time.Now()
		if err := env.Client.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		// Polled every 2ms (not testenv's 50ms): the resolution of the
		// measurement.
		for enforced := false; !enforced; time.Sleep(2 * time.Millisecond) {
			if time.Since(start) > waitTimeout {
				t.Fatalf("policy %s not reported within %v", p.Name, waitTimeout)
			}
			cur := &kaironv1.MachineNetworkPolicy{}
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(p), cur); err != nil {
				continue
			}
			for _, n := range cur.Status.Nodes {
				enforced = enforced || (n.Node == nodeName && n.ObservedGeneration == cur.Generation && slices.Contains(n.Machines, "vm"))
			}
		}
		took = append(took, time.Since(start))
		if err := env.Client.Delete(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	slices.Sort(took)
	t.Logf("policy create to enforced and reported, 50 runs: p50 %v, p99 %v, max %v", took[len(took)/2], took[len(took)*99/100], took[len(took)-1])
}
