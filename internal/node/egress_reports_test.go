package node

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// The agent skips a status write its cache does not show yet only when its
// own last write already said the same; anything else is written.
func TestEgressReportsRemembersOwnWrites(t *testing.T) {
	policy := func(ns, name string, uid types.UID) *kaironv1.MachineNetworkPolicy {
		return &kaironv1.MachineNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: uid}}
	}
	p := policy("team", "claim-egress-a", "uid-a")
	entry := kaironv1.PolicyEnforcement{Node: "n1", Machines: []string{"m1"}, ObservedGeneration: 1}
	var r egressReports

	if r.wrote(p, entry, false) {
		t.Fatal("nothing written yet, but wrote says so")
	}
	r.record(p, entry, false)
	if !r.wrote(p, entry, false) {
		t.Error("the entry just written is not remembered")
	}
	for name, other := range map[string]kaironv1.PolicyEnforcement{
		"another generation": {Node: "n1", Machines: []string{"m1"}, ObservedGeneration: 2},
		"another machine":    {Node: "n1", Machines: []string{"m1", "m2"}, ObservedGeneration: 1},
		"an error":           {Node: "n1", Machines: []string{"m1"}, ObservedGeneration: 1, Error: "m2: nft failed"},
	} {
		if r.wrote(p, other, false) {
			t.Errorf("%s: counted as written", name)
		}
	}
	if r.wrote(p, kaironv1.PolicyEnforcement{}, true) {
		t.Error("removing the entry counted as written while the last write set it")
	}
	// A policy deleted and created again under the same name is another
	// policy: what was written to the first says nothing of it.
	if r.wrote(policy("team", "claim-egress-a", "uid-a2"), entry, false) {
		t.Error("a write to an earlier policy of the same name counted as written")
	}

	r.record(p, kaironv1.PolicyEnforcement{}, true)
	if !r.wrote(p, kaironv1.PolicyEnforcement{}, true) || r.wrote(p, entry, false) {
		t.Error("a removed entry is not remembered as removed")
	}

	// A failed write, or a deleted policy, is forgotten; others stay.
	q := policy("team", "claim-egress-b", "uid-b")
	r.record(q, entry, false)
	r.forget(client.ObjectKeyFromObject(p))
	if r.wrote(p, kaironv1.PolicyEnforcement{}, true) {
		t.Error("a forgotten write is still remembered")
	}
	if !r.wrote(q, entry, false) {
		t.Error("forget dropped another policy's write")
	}
}
