package node

import (
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

func TestEgressAppliedEntry(t *testing.T) {
	policy := func(name string, uid types.UID, generation int64) *kaironv1.MachineNetworkPolicy {
		return &kaironv1.MachineNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: name, UID: uid, Generation: generation}}
	}
	machine := func(name string) types.NamespacedName { return types.NamespacedName{Namespace: "team", Name: name} }
	sandboxes := policy("sandboxes", "uid-s", 2)
	only := policy("only-a", "uid-o", 1)

	type want struct {
		machines, errs []string
		ready          bool
	}
	for _, tc := range []struct {
		name     string
		records  map[string]appliedEgress
		policy   *kaironv1.MachineNetworkPolicy
		selected []string
		want     want
	}{{
		name:     "every selected Machine applied at the current generation",
		records:  map[string]appliedEgress{"a": {policies: []appliedPolicy{appliedPolicyOf(only), appliedPolicyOf(sandboxes)}}, "b": {policies: []appliedPolicy{appliedPolicyOf(sandboxes)}}},
		policy:   sandboxes,
		selected: []string{"b", "a"},
		want:     want{machines: []string{"a", "b"}, ready: true},
	}, {
		// After an agent restart: the entry must not drop b before b's
		// reconcile.
		name:     "a selected Machine not reconciled yet",
		records:  map[string]appliedEgress{"a": {policies: []appliedPolicy{appliedPolicyOf(sandboxes)}}},
		policy:   sandboxes,
		selected: []string{"a", "b"},
		want:     want{ready: false},
	}, {
		// An edit: the entry moves to the new generation with both
		// Machines at once, not with a alone first.
		name:     "a selected Machine still at the previous generation",
		records:  map[string]appliedEgress{"a": {policies: []appliedPolicy{appliedPolicyOf(sandboxes)}}, "b": {policies: []appliedPolicy{appliedPolicyOf(policy("sandboxes", "uid-s", 1))}}},
		policy:   sandboxes,
		selected: []string{"a", "b"},
		want:     want{ready: false},
	}, {
		name:     "a policy of the same name deleted and created again",
		records:  map[string]appliedEgress{"a": {policies: []appliedPolicy{appliedPolicyOf(policy("sandboxes", "uid-old", 2))}}},
		policy:   sandboxes,
		selected: []string{"a"},
		want:     want{ready: false},
	}, {
		name:     "a failure is reported, not enforcement",
		records:  map[string]appliedEgress{"a": {policies: []appliedPolicy{appliedPolicyOf(sandboxes)}, err: "nft: no memory"}, "b": {policies: []appliedPolicy{appliedPolicyOf(sandboxes)}}},
		policy:   sandboxes,
		selected: []string{"a", "b"},
		want:     want{machines: []string{"b"}, errs: []string{"a: nft: no memory"}, ready: true},
	}, {
		// Its labels changed and its reconcile has yet to run: its rules
		// still hold the policy, so the entry still says so.
		name:     "a Machine no longer selected that still holds the policy",
		records:  map[string]appliedEgress{"a": {policies: []appliedPolicy{appliedPolicyOf(sandboxes)}}},
		policy:   sandboxes,
		selected: nil,
		want:     want{machines: []string{"a"}, ready: true},
	}, {
		name:     "nothing selected, nothing applied",
		records:  map[string]appliedEgress{"a": {policies: []appliedPolicy{appliedPolicyOf(only)}}},
		policy:   sandboxes,
		selected: nil,
		want:     want{ready: true},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			var e egressApplied
			for name, rec := range tc.records {
				e.set(machine(name), rec, 0)
			}
			machines, errs, ready := e.entry(tc.policy, tc.selected)
			if ready != tc.want.ready || !slices.Equal(machines, tc.want.machines) || !slices.Equal(errs, tc.want.errs) {
				t.Errorf("entry = %v, %v, ready %v; want %v, %v, ready %v", machines, errs, ready, tc.want.machines, tc.want.errs, tc.want.ready)
			}
		})
	}
}

func TestEgressAppliedRecords(t *testing.T) {
	p1 := &kaironv1.MachineNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "p1", UID: "u1", Generation: 1}}
	p2 := &kaironv1.MachineNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "p2", UID: "u2", Generation: 1}}
	a := types.NamespacedName{Namespace: "team", Name: "a"}
	key := func(p *kaironv1.MachineNetworkPolicy) types.NamespacedName {
		return types.NamespacedName{Namespace: p.Namespace, Name: p.Name}
	}
	var e egressApplied

	// A first reconcile, even without policies, is news for them.
	if changed, stale := e.set(a, appliedEgress{}, 0); len(changed) != 0 || stale {
		t.Errorf("first set without policies: changed %v, stale %v", changed, stale)
	}
	if changed, _ := e.set(a, appliedEgress{policies: []appliedPolicy{appliedPolicyOf(p1)}}, 0); !slices.Equal(changed, []string{"p1"}) {
		t.Errorf("p1 gained: changed %v, want [p1]", changed)
	}
	if changed, _ := e.set(a, appliedEgress{policies: []appliedPolicy{appliedPolicyOf(p1)}}, 0); changed != nil {
		t.Errorf("the same record again: changed %v, want none (a Machine's status churn must cost no report)", changed)
	}
	if changed, _ := e.set(a, appliedEgress{policies: []appliedPolicy{appliedPolicyOf(p2)}}, 0); !slices.Equal(changed, []string{"p1", "p2"}) {
		t.Errorf("p1 lost, p2 gained: changed %v, want both", changed)
	}

	// The Machines holding a policy are what its change must reconcile.
	epoch := e.epoch("team")
	if got := e.policyChanged(key(p2)); !slices.Equal(got, []string{"a"}) {
		t.Errorf("policyChanged(p2) = %v, want [a]", got)
	}
	if got := e.policyChanged(key(p1)); len(got) != 0 {
		t.Errorf("policyChanged(p1) = %v, want none: a no longer holds it", got)
	}
	// A reconcile that read the policies before those changes runs again.
	if _, stale := e.set(a, appliedEgress{policies: []appliedPolicy{appliedPolicyOf(p2)}}, epoch); !stale {
		t.Error("a record made from policies read before a change is not stale")
	}
	if _, stale := e.set(a, appliedEgress{policies: []appliedPolicy{appliedPolicyOf(p2)}}, e.epoch("team")); stale {
		t.Error("a record made after the changes is stale")
	}
	if _, stale := e.set(types.NamespacedName{Namespace: "other", Name: "x"}, appliedEgress{}, e.epoch("other")); stale {
		t.Error("a change in namespace team made a reconcile in namespace other stale")
	}

	if got := e.drop(a); !slices.Equal(got, []string{"p2"}) {
		t.Errorf("drop(a) = %v, want [p2]", got)
	}
	if got := e.policyChanged(key(p2)); len(got) != 0 {
		t.Errorf("after drop, policyChanged(p2) = %v", got)
	}
	if machines, _, ready := e.entry(p2, nil); !ready || len(machines) != 0 {
		t.Errorf("after drop, p2's entry lists %v (ready %v)", machines, ready)
	}
	if got := e.drop(a); got != nil {
		t.Errorf("dropping twice: %v", got)
	}
}
