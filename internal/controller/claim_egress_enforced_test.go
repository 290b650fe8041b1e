package controller

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/watch"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/backend/sim"
	"github.com/zyvor/kairon/internal/node"
	"github.com/zyvor/kairon/internal/node/egress"
	"github.com/zyvor/kairon/internal/testenv"
)

func TestEgressEnforcement(t *testing.T) {
	machine := &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: "vm"}, Spec: kaironv1.MachineSpec{NodeName: "node-b"}}
	policy := func(nodes ...kaironv1.PolicyEnforcement) *kaironv1.MachineNetworkPolicy {
		return &kaironv1.MachineNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "p", Generation: 3}, Status: kaironv1.MachineNetworkPolicyStatus{Nodes: nodes}}
	}
	cases := []struct {
		name    string
		policy  *kaironv1.MachineNetworkPolicy
		machine *kaironv1.Machine
		status  metav1.ConditionStatus
		reason  string
	}{
		{"no policy", nil, machine, metav1.ConditionFalse, kaironv1.EgressReasonNotYetEnforced},
		{"no machine", policy(), nil, metav1.ConditionFalse, kaironv1.EgressReasonNotYetEnforced},
		{"no report", policy(), machine, metav1.ConditionFalse, kaironv1.EgressReasonNotYetEnforced},
		{"enforced", policy(kaironv1.PolicyEnforcement{Node: "node-b", Machines: []string{"other", "vm"}, ObservedGeneration: 3}), machine, metav1.ConditionTrue, kaironv1.EgressReasonEnforced},
		{"an older generation", policy(kaironv1.PolicyEnforcement{Node: "node-b", Machines: []string{"vm"}, ObservedGeneration: 2}), machine, metav1.ConditionFalse, kaironv1.EgressReasonNotYetEnforced},
		{"another node's report (migration source)", policy(kaironv1.PolicyEnforcement{Node: "node-a", Machines: []string{"vm"}, ObservedGeneration: 3}), machine, metav1.ConditionFalse, kaironv1.EgressReasonNotYetEnforced},
		{"the machine not listed", policy(kaironv1.PolicyEnforcement{Node: "node-b", Machines: []string{"other"}, ObservedGeneration: 3}), machine, metav1.ConditionFalse, kaironv1.EgressReasonNotYetEnforced},
		{"the node failed", policy(kaironv1.PolicyEnforcement{Node: "node-b", ObservedGeneration: 3, Error: "vm: nft: no"}), machine, metav1.ConditionFalse, kaironv1.EgressReasonEnforcementFailed},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := EgressEnforcement(c.policy, c.machine)
			if got.Type != kaironv1.ConditionEgressEnforced.String() || got.Status != c.status || got.Reason != c.reason || got.Message == "" {
				t.Fatalf("EgressEnforcement = %+v, want %s %s", got, c.status, c.reason)
			}
		})
	}
}

// TestClaimEgressEnforcedFollowsTheAgent binds a claim with spec.egress on
// a sim node agent and waits for the agent's report to reach the claim,
// then edits spec.egress and waits for the report of the new generation.
func TestClaimEgressEnforcedFollowsTheAgent(t *testing.T) {
	env := testenv.Get(t)
	ns := prepareNamespace(t, env)
	runSimAgent(t, env, ns, "a", "10.90.9.0/24", 16, "16Gi", simBootDelay)
	startControllers(t, env, ns, Options{})
	createPool(t, env, ns, "agents", 1)
	waitWarm(t, env, ns, "agents", 1, 0)
	ctx := context.Background()
	createClaim(t, env, ns, "c", "agents", func(c *kaironv1.MachineClaim) {
		c.Spec.Egress = &kaironv1.EgressRules{AllowCidrs: []kaironv1.CIDR{"203.0.113.0/24"}, AllowPorts: []kaironv1.PortRange{"443"}}
	})
	bound := waitClaimBound(t, env, ns, "c")
	// waitEnforced waits for the claim to say its policy is enforced at the
	// policy's generation, once that generation is at least minGeneration
	// (an edit of spec.egress reaches the policy a moment after it was made).
	waitEnforced := func(what string, minGeneration int64) *kaironv1.MachineNetworkPolicy {
		t.Helper()
		var p kaironv1.MachineNetworkPolicy
		eventually(t, what, func() (bool, string) {
			c := getClaim(t, env, ns, "c")
			if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: c.Status.EgressPolicy}, &p); err != nil {
				return false, err.Error()
			}
			cond := meta.FindStatusCondition(c.Status.Conditions, kaironv1.ConditionEgressEnforced.String())
			return p.Generation >= minGeneration && cond != nil && cond.Status == metav1.ConditionTrue &&
					cond.Message == fmt.Sprintf("policy %s (generation %d) enforced on node %s-a", p.Name, p.Generation, ns),
				fmt.Sprintf("policy generation %d; %+v, policy status %s", p.Generation, cond, fmtJSON(p.Status))
		})
		return &p
	}
	first := waitEnforced("the claim's egress enforced", 1)
	if len(first.Status.Nodes) != 1 || first.Status.Nodes[0].Machines[0] != bound.Status.MachineName {
		t.Fatalf("policy status %s, want the bound machine %s", fmtJSON(first.Status), bound.Status.MachineName)
	}

	eventually(t, "the policy's MACHINES count", func() (bool, string) {
		var p kaironv1.MachineNetworkPolicy
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(first), &p)
		return err == nil && p.Status.Machines == 1, fmt.Sprint(err, fmtJSON(p.Status))
	})

	// The controllers write the claim too: edit it on its latest version.
	eventually(t, "spec.egress edited", func() (bool, string) {
		c := getClaim(t, env, ns, "c")
		c.Spec.Egress.AllowPorts = []kaironv1.PortRange{"8443"}
		if err := env.Client.Update(ctx, c); err != nil {
			return false, err.Error()
		}
		return true, ""
	})
	second := waitEnforced("the edited egress enforced at the policy's new generation", first.Generation+1)
	if second.Generation <= first.Generation {
		t.Fatalf("policy generation %d after the edit, was %d", second.Generation, first.Generation)
	}
}

// TestClaimBoundOnlyOnceEgressEnforced watches every version of the claim
// and of its policy: the first version that says Bound already carries
// EgressEnforced True, and the policy's node report came before it.
func TestClaimBoundOnlyOnceEgressEnforced(t *testing.T) {
	env := testenv.Get(t)
	ns := prepareNamespace(t, env)
	var mu sync.Mutex
	var order []string
	env.WatchNamespace(t, ns, &kaironv1.MachineClaimList{}, func(_ watch.EventType, o client.Object) {
		c := o.(*kaironv1.MachineClaim)
		if c.Status.Phase != kaironv1.ClaimBound {
			return
		}
		cond := meta.FindStatusCondition(c.Status.Conditions, kaironv1.ConditionEgressEnforced.String())
		mu.Lock()
		defer mu.Unlock()
		order = append(order, fmt.Sprintf("claim Bound, EgressEnforced %v", cond != nil && cond.Status == metav1.ConditionTrue))
	})
	env.WatchNamespace(t, ns, &kaironv1.MachineNetworkPolicyList{}, func(_ watch.EventType, o client.Object) {
		if p := o.(*kaironv1.MachineNetworkPolicy); len(p.Status.Nodes) > 0 && len(p.Status.Nodes[0].Machines) > 0 {
			mu.Lock()
			defer mu.Unlock()
			order = append(order, "policy reported")
		}
	})
	runSimAgent(t, env, ns, "a", "10.90.10.0/24", 16, "16Gi", simBootDelay)
	startControllers(t, env, ns, Options{})
	createPool(t, env, ns, "agents", 1)
	waitWarm(t, env, ns, "agents", 1, 0)
	createClaim(t, env, ns, "c", "agents", func(c *kaironv1.MachineClaim) {
		c.Spec.Egress = &kaironv1.EgressRules{AllowCidrs: []kaironv1.CIDR{"203.0.113.0/24"}}
	})
	waitClaimBound(t, env, ns, "c")
	eventually(t, "the watches to see the bind", func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return slices.Contains(order, "policy reported") && slices.ContainsFunc(order, func(s string) bool { return strings.HasPrefix(s, "claim Bound") }), fmt.Sprint(order)
	})
	mu.Lock()
	defer mu.Unlock()
	firstBound := slices.IndexFunc(order, func(s string) bool { return strings.HasPrefix(s, "claim Bound") })
	if order[firstBound] != "claim Bound, EgressEnforced true" || slices.Index(order, "policy reported") > firstBound {
		t.Fatalf("order of events: %v; want the policy reported, then the claim Bound with EgressEnforced true", order)
	}
}

// failingEnforcer is a node whose nftables writes fail.
type failingEnforcer struct{}

func (failingEnforcer) Apply(egress.Machine, *egress.Policy) error {
	return errors.New("nft: simulated failure")
}
func (failingEnforcer) Remove(string) error { return nil }

// TestClaimNotBoundWhenEgressNotEnforced runs a node that cannot enforce:
// the claim stays Pending and its Machine goes back to the pool.
func TestClaimNotBoundWhenEgressNotEnforced(t *testing.T) {
	env := testenv.Get(t)
	ns := prepareNamespace(t, env)
	old := egressEnforceTimeout.Swap(int64(2 * time.Second))
	t.Cleanup(func() { egressEnforceTimeout.Store(old) })
	nodeName := ns + "-broken"
	state := t.TempDir()
	backend, err := sim.New(sim.Options{StateDir: filepath.Join(state, "instances"), BootDelay: simBootDelay})
	if err != nil {
		t.Fatal(err)
	}
	agent, err := node.New(env.Config, node.Options{
		NodeName: nodeName, Register: true, Backend: backend, StateDir: state, CPU: 16, Memory: resource.MustParse("16Gi"),
		Network: &node.NetworkOptions{CIDR: netip.MustParsePrefix("10.90.11.0/24"), NoLinks: true},
		Egress:  &node.EgressOptions{Enforcer: failingEnforcer{}}, Interval: 30 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = env.Client.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}})
	})
	testenv.RunInBackground(t, "agent "+nodeName, agent.Run)
	startControllers(t, env, ns, Options{})
	createPool(t, env, ns, "agents", 1)
	waitWarm(t, env, ns, "agents", 1, 0)
	createClaim(t, env, ns, "c", "agents", func(c *kaironv1.MachineClaim) {
		c.Spec.Egress = &kaironv1.EgressRules{AllowCidrs: []kaironv1.CIDR{"203.0.113.0/24"}}
	})
	eventually(t, "the claim Pending for EgressNotEnforced", func() (bool, string) {
		c := getClaim(t, env, ns, "c")
		cond := meta.FindStatusCondition(c.Status.Conditions, kaironv1.ConditionReady.String())
		return c.Status.Phase == kaironv1.ClaimPending && cond != nil && cond.Reason == kaironv1.ClaimReasonEgressNotEnforced &&
			strings.Contains(c.Status.Message, "simulated failure"), fmtJSON(c.Status)
	})
	// Never Bound meanwhile, and the Machine is the pool's again.
	if c := getClaim(t, env, ns, "c"); c.Status.Phase == kaironv1.ClaimBound || c.Status.MachineName != "" {
		t.Fatalf("claim %s", fmtJSON(c.Status))
	}
	eventually(t, "no machine left claimed", func() (bool, string) {
		var saw []string
		ok := true
		for _, m := range listMachines(t, env, ns) {
			saw = append(saw, fmt.Sprint(m.Name, m.Labels))
			ok = ok && m.Labels[kaironv1.LabelPoolState] != kaironv1.PoolStateClaimed && m.Labels[kaironv1.LabelMachineClaim] == ""
		}
		return ok, fmt.Sprint(saw)
	})
}
