package controller

import (
	"context"
	"fmt"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
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
	waitEnforced := func(what string) *kaironv1.MachineNetworkPolicy {
		t.Helper()
		var p kaironv1.MachineNetworkPolicy
		eventually(t, what, func() (bool, string) {
			c := getClaim(t, env, ns, "c")
			if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: c.Status.EgressPolicy}, &p); err != nil {
				return false, err.Error()
			}
			cond := meta.FindStatusCondition(c.Status.Conditions, kaironv1.ConditionEgressEnforced.String())
			return cond != nil && cond.Status == metav1.ConditionTrue && cond.Message == fmt.Sprintf("policy %s (generation %d) enforced on node %s-a", p.Name, p.Generation, ns),
				fmt.Sprintf("%+v, policy status %s", cond, fmtJSON(p.Status))
		})
		return &p
	}
	first := waitEnforced("the claim's egress enforced")
	if len(first.Status.Nodes) != 1 || first.Status.Nodes[0].Machines[0] != bound.Status.MachineName {
		t.Fatalf("policy status %s, want the bound machine %s", fmtJSON(first.Status), bound.Status.MachineName)
	}

	c := getClaim(t, env, ns, "c")
	c.Spec.Egress.AllowPorts = []kaironv1.PortRange{"8443"}
	if err := env.Client.Update(ctx, c); err != nil {
		t.Fatal(err)
	}
	second := waitEnforced("the edited egress enforced at the policy's new generation")
	if second.Generation <= first.Generation {
		t.Fatalf("policy generation %d after the edit, was %d", second.Generation, first.Generation)
	}
}
