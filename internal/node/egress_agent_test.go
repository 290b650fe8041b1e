package node_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/backend/sim"
	"github.com/zyvor/kairon/internal/node"
	"github.com/zyvor/kairon/internal/node/egress"
	"github.com/zyvor/kairon/internal/testenv"
)

// editPolicy changes the policy's spec with mutate, reading it again when
// the agent's status report changed it in between (a conflict).
func editPolicy(t *testing.T, env *testenv.Env, key client.ObjectKey, mutate func(*kaironv1.MachineNetworkPolicy)) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur := &kaironv1.MachineNetworkPolicy{}
		if err := env.Client.Get(context.Background(), key, cur); err != nil {
			return err
		}
		mutate(cur)
		return env.Client.Update(context.Background(), cur)
	})
	if err != nil {
		t.Fatalf("editing policy %s: %v", key, err)
	}
}

// recordingEnforcer keeps what the agent asked nftables for, per tap.
type recordingEnforcer struct {
	mu      sync.Mutex
	applied map[string]*egress.Policy
	byName  map[string]string // Machine name → tap
	fail    bool
}

func (r *recordingEnforcer) Apply(m egress.Machine, p *egress.Policy) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail {
		return fmt.Errorf("nft: simulated failure")
	}
	r.applied[m.Tap] = p
	r.byName[m.Name] = m.Tap
	return nil
}

func (r *recordingEnforcer) Remove(tap string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.applied, tap)
	return nil
}

func (r *recordingEnforcer) policyOf(name string) (*egress.Policy, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p, ok := r.applied[r.byName[name]]
	return p, ok
}

func (r *recordingEnforcer) setFail(fail bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fail = fail
}

func runEgressAgent(t *testing.T, env *testenv.Env, nodeName string, enforcer node.EgressEnforcer) {
	t.Helper()
	state := t.TempDir()
	backend, err := sim.New(sim.Options{StateDir: filepath.Join(state, "instances"), BootDelay: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	agent, err := node.New(env.Config, node.Options{
		NodeName: nodeName, Register: true, Backend: backend, StateDir: state,
		CPU: 4, Memory: resource.MustParse("4Gi"),
		Network:  &node.NetworkOptions{CIDR: netip.MustParsePrefix("10.88.7.0/24"), NoLinks: true},
		Egress:   &node.EgressOptions{Enforcer: enforcer},
		Interval: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	testenv.RunInBackground(t, "agent "+nodeName, agent.Run)
	t.Cleanup(func() {
		_ = env.Client.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}})
	})
}

// waitEnforcement waits for the policy's status entry of nodeName to list
// machines at the policy's current generation.
func waitEnforcement(t *testing.T, env *testenv.Env, key client.ObjectKey, nodeName string, machines ...string) *kaironv1.MachineNetworkPolicy {
	t.Helper()
	p := &kaironv1.MachineNetworkPolicy{}
	testenv.Eventually(t, waitTimeout, fmt.Sprintf("policy %s enforced on %s for %v", key, nodeName, machines), func() (bool, string) {
		if err := env.Client.Get(context.Background(), key, p); err != nil {
			return false, err.Error()
		}
		for _, n := range p.Status.Nodes {
			if n.Node == nodeName {
				return slices.Equal(n.Machines, machines) && n.ObservedGeneration == p.Generation && n.Error == "", fmt.Sprintf("%+v (generation %d)", p.Status.Nodes, p.Generation)
			}
		}
		return len(machines) == 0, fmt.Sprintf("%+v", p.Status.Nodes)
	})
	return p
}

// entryHistory collects, from a watch, the status entry of one node in
// every version of one policy, to check that it never lost a Machine.
type entryHistory struct {
	mu      sync.Mutex
	entries []string // each version's machines, "none" without an entry
}

func watchEntry(t *testing.T, env *testenv.Env, key client.ObjectKey, nodeName string) *entryHistory {
	t.Helper()
	h := &entryHistory{}
	env.WatchNamespace(t, key.Namespace, &kaironv1.MachineNetworkPolicyList{}, func(_ watch.EventType, o client.Object) {
		p := o.(*kaironv1.MachineNetworkPolicy)
		if p.Name != key.Name {
			return
		}
		entry := "none"
		for _, n := range p.Status.Nodes {
			if n.Node == nodeName {
				entry = fmt.Sprintf("%v", n.Machines)
			}
		}
		h.mu.Lock()
		h.entries = append(h.entries, entry)
		h.mu.Unlock()
	})
	return h
}

// mark returns a check that every version seen from now on had the entry
// listing exactly machines.
func (h *entryHistory) mark(machines ...string) func(t *testing.T) {
	h.mu.Lock()
	from := len(h.entries)
	h.mu.Unlock()
	want := fmt.Sprintf("%v", machines)
	return func(t *testing.T) {
		t.Helper()
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, e := range h.entries[from:] {
			if e != want {
				t.Fatalf("the node's entry went through %s; every version since should list %s: %v", e, want, h.entries[from:])
			}
		}
	}
}

func TestAgentEnforcesAndReportsMachineNetworkPolicies(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	rec := &recordingEnforcer{applied: map[string]*egress.Policy{}, byName: map[string]string{}}
	runEgressAgent(t, env, "sim-egress", rec)

	for _, name := range []string{"vm-a", "vm-b", "vm-free"} {
		role := "sandbox"
		if name == "vm-free" {
			role = "service"
		}
		m := &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"role": role}}, Spec: kaironv1.MachineSpec{NodeName: "sim-egress"}}
		if err := env.Client.Create(ctx, m); err != nil {
			t.Fatal(err)
		}
		waitPhase(t, env, client.ObjectKeyFromObject(m), kaironv1.MachineRunning)
	}
	byName := &kaironv1.MachineNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "only-a"}, Spec: kaironv1.MachineNetworkPolicySpec{
		MachineName: "vm-a",
		Egress:      kaironv1.EgressRules{AllowCidrs: []kaironv1.CIDR{"203.0.113.0/24"}, AllowPorts: []kaironv1.PortRange{"443"}},
	}}
	bySelector := &kaironv1.MachineNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "sandboxes"}, Spec: kaironv1.MachineNetworkPolicySpec{
		MachineSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "sandbox"}},
		Egress:          kaironv1.EgressRules{AllowFqdns: []kaironv1.Hostname{"pkg.test"}},
	}}
	for _, p := range []*kaironv1.MachineNetworkPolicy{byName, bySelector} {
		if err := env.Client.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	waitEnforcement(t, env, client.ObjectKeyFromObject(byName), "sim-egress", "vm-a")
	waitEnforcement(t, env, client.ObjectKeyFromObject(bySelector), "sim-egress", "vm-a", "vm-b")
	// The union: vm-a has both policies' grants, vm-b the selector's.
	if p, ok := rec.policyOf("vm-a"); !ok || p == nil || len(p.Grants) != 2 {
		t.Fatalf("vm-a confined to %+v, want both policies' grants", p)
	}
	if p, ok := rec.policyOf("vm-b"); !ok || p == nil || len(p.Grants) != 1 || len(p.Grants[0].FQDNs) != 1 {
		t.Fatalf("vm-b confined to %+v, want the selector's grant", p)
	}
	if p, ok := rec.policyOf("vm-free"); ok && p != nil {
		t.Fatalf("vm-free, selected by no policy, is confined to %+v", p)
	}
	// Timed, for this node: a transaction per attached Machine, a write
	// per policy's entry at least.
	if n := nodeHistogram(t, "kairon_egress_apply_duration_seconds", "sim-egress").GetSampleCount(); n < 3 {
		t.Errorf("kairon_egress_apply_duration_seconds{node=sim-egress} counts %d applies, want one for each of the 3 Machines at least", n)
	}
	if n := nodeHistogram(t, "kairon_egress_report_duration_seconds", "sim-egress").GetSampleCount(); n < 2 {
		t.Errorf("kairon_egress_report_duration_seconds{node=sim-egress} counts %d writes, want one for each of the 2 policies at least", n)
	}

	t.Run("an edit is enforced and reported at the new generation", func(t *testing.T) {
		editPolicy(t, env, client.ObjectKeyFromObject(byName), func(p *kaironv1.MachineNetworkPolicy) {
			p.Spec.Egress.AllowPorts = []kaironv1.PortRange{"8000-8100"}
		})
		waitEnforcement(t, env, client.ObjectKeyFromObject(byName), "sim-egress", "vm-a")
		p, _ := rec.policyOf("vm-a")
		if p == nil || !slices.ContainsFunc(p.Grants, func(g egress.Grant) bool {
			return slices.Equal(g.Ports, []egress.PortRange{{Lo: 8000, Hi: 8100}})
		}) {
			t.Fatalf("vm-a confined to %+v after the edit", p)
		}
	})

	t.Run("an edit moves the entry with all its Machines at once", func(t *testing.T) {
		// Each Machine's rules are applied on their own: the entry must
		// not list the new generation with one of them only, nor drop
		// them while they are applied.
		history := watchEntry(t, env, client.ObjectKeyFromObject(bySelector), "sim-egress")
		waitEnforcement(t, env, client.ObjectKeyFromObject(bySelector), "sim-egress", "vm-a", "vm-b")
		check := history.mark("vm-a", "vm-b")
		for _, port := range []kaironv1.PortRange{"8443", "9443", "10443"} {
			editPolicy(t, env, client.ObjectKeyFromObject(bySelector), func(p *kaironv1.MachineNetworkPolicy) {
				p.Spec.Egress.AllowPorts = []kaironv1.PortRange{port}
			})
			waitEnforcement(t, env, client.ObjectKeyFromObject(bySelector), "sim-egress", "vm-a", "vm-b")
		}
		check(t)
	})

	t.Run("the agent writes the MACHINES count with its entry", func(t *testing.T) {
		// No kairon-controller runs here: the count is the agent's,
		// written in the same write as its entry, and it counts the other
		// nodes' entries as well.
		other := map[string]any{"apiVersion": kaironv1.GroupVersion.String(), "kind": "MachineNetworkPolicy",
			"metadata": map[string]any{"namespace": ns, "name": bySelector.Name},
			"status":   map[string]any{"nodes": []any{map[string]any{"node": "sim-other", "machines": []string{"vm-x", "vm-y", "vm-z"}, "observedGeneration": 1}}}}
		body, _ := json.Marshal(other)
		if err := env.Client.Status().Patch(ctx, bySelector.DeepCopy(), client.RawPatch(types.ApplyPatchType, body), client.FieldOwner("kairon-node/sim-other"), client.ForceOwnership); err != nil {
			t.Fatal(err)
		}
		editPolicy(t, env, client.ObjectKeyFromObject(bySelector), func(p *kaironv1.MachineNetworkPolicy) {
			p.Spec.Egress.AllowPorts = []kaironv1.PortRange{"7443"}
		})
		p := waitEnforcement(t, env, client.ObjectKeyFromObject(bySelector), "sim-egress", "vm-a", "vm-b")
		if p.Status.Machines != 5 {
			t.Fatalf("status.machines %d with the entries %+v, want 5 (2 here, 3 on sim-other)", p.Status.Machines, p.Status.Nodes)
		}
		// Gone again, as that node would remove its entry.
		other["status"] = map[string]any{"nodes": []any{}}
		body, _ = json.Marshal(other)
		if err := env.Client.Status().Patch(ctx, bySelector.DeepCopy(), client.RawPatch(types.ApplyPatchType, body), client.FieldOwner("kairon-node/sim-other"), client.ForceOwnership); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("a failing node reports an error, not enforcement", func(t *testing.T) {
		rec.setFail(true)
		defer rec.setFail(false)
		editPolicy(t, env, client.ObjectKeyFromObject(byName), func(p *kaironv1.MachineNetworkPolicy) { p.Spec.Egress.AllowIcmp = true })
		cur := &kaironv1.MachineNetworkPolicy{}
		testenv.Eventually(t, waitTimeout, "the error reported", func() (bool, string) {
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(byName), cur); err != nil {
				return false, err.Error()
			}
			for _, n := range cur.Status.Nodes {
				if n.Node == "sim-egress" {
					return n.Error != "" && len(n.Machines) == 0 && n.ObservedGeneration == cur.Generation, fmt.Sprintf("%+v", n)
				}
			}
			return false, fmt.Sprintf("%+v", cur.Status.Nodes)
		})
		rec.setFail(false)
		waitEnforcement(t, env, client.ObjectKeyFromObject(byName), "sim-egress", "vm-a")
	})

	t.Run("a deleted Machine leaves the report and the enforcer", func(t *testing.T) {
		b := &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vm-b"}}
		if err := env.Client.Delete(ctx, b); err != nil {
			t.Fatal(err)
		}
		waitEnforcement(t, env, client.ObjectKeyFromObject(bySelector), "sim-egress", "vm-a")
		testenv.Eventually(t, waitTimeout, "vm-b's rules removed", func() (bool, string) {
			p, ok := rec.policyOf("vm-b")
			return !ok, fmt.Sprintf("%+v", p)
		})
	})

	t.Run("a deleted policy lifts its confinement", func(t *testing.T) {
		if err := env.Client.Delete(ctx, bySelector); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, waitTimeout, "vm-a confined by only-a", func() (bool, string) {
			p, ok := rec.policyOf("vm-a")
			return ok && p != nil && len(p.Grants) == 1 && len(p.Grants[0].FQDNs) == 0, fmt.Sprintf("%+v", p)
		})
		if err := env.Client.Delete(ctx, byName); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, waitTimeout, "vm-a unconfined", func() (bool, string) {
			p, ok := rec.policyOf("vm-a")
			return ok && p == nil, fmt.Sprintf("%v %+v", ok, p)
		})
	})
}

// countingEnforcer is a recordingEnforcer whose drops are counted.
type countingEnforcer struct {
	recordingEnforcer
	denied []egress.Denied
}

func (c *countingEnforcer) DeniedCounts() ([]egress.Denied, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.denied), nil
}

func TestAgentExportsEgressDenials(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	rec := &countingEnforcer{recordingEnforcer: recordingEnforcer{applied: map[string]*egress.Policy{}, byName: map[string]string{}}}
	rec.denied = []egress.Denied{
		{Machine: egress.Machine{Namespace: ns, Name: "vm"}, Reason: egress.ReasonPort, Packets: 3},
		{Machine: egress.Machine{Namespace: ns, Name: "vm"}, Reason: egress.ReasonIP, Packets: 5},
	}
	runEgressAgent(t, env, "sim-egress-metrics", rec)
	values := func() map[string]float64 {
		got := map[string]float64{}
		families, err := ctrlmetrics.Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range families {
			if f.GetName() != "kairon_egress_denied_total" {
				continue
			}
			for _, m := range f.GetMetric() {
				labels := map[string]string{}
				for _, l := range m.GetLabel() {
					labels[l.GetName()] = l.GetValue()
				}
				if labels["namespace"] == ns && labels["machine"] == "vm" {
					got[labels["reason"]] = m.GetCounter().GetValue()
				}
			}
		}
		return got
	}
	testenv.Eventually(t, waitTimeout, "the agent's denials exported", func() (bool, string) {
		got := values()
		return got["port"] == 3 && got["ip"] == 5 && len(got) == 2, fmt.Sprint(got)
	})
}

// nodeHistogram is the histogram name for node in the process's registry
// (nil: nothing observed).
func nodeHistogram(t *testing.T, name, node string) *dto.Histogram {
	t.Helper()
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool { return l.GetName() == "node" && l.GetValue() == node }) {
				return m.GetHistogram()
			}
		}
	}
	return nil
}
