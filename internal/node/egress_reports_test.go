package node

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// The agent skips a status write its cache does not show yet only when its
// own last write already said the same; anything else is written.
func TestEgressReportsRemembersOwnWrites(t *testing.T) {
	policy := func(ns, name string, uid types.UID) kaironv1.MachineNetworkPolicy {
		return kaironv1.MachineNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: uid}}
	}
	p := policy("team", "claim-egress-a", "uid-a")
	entry := kaironv1.PolicyEnforcement{Node: "n1", Machines: []string{"m1"}, ObservedGeneration: 1}
	var r egressReports

	if r.wrote(p.UID, entry, false) {
		t.Fatal("nothing written yet, but wrote says so")
	}
	r.record(&p, entry, false)
	if !r.wrote(p.UID, entry, false) {
		t.Error("the entry just written is not remembered")
	}
	for name, other := range map[string]kaironv1.PolicyEnforcement{
		"another generation": {Node: "n1", Machines: []string{"m1"}, ObservedGeneration: 2},
		"another machine":    {Node: "n1", Machines: []string{"m1", "m2"}, ObservedGeneration: 1},
		"an error":           {Node: "n1", Machines: []string{"m1"}, ObservedGeneration: 1, Error: "m2: nft failed"},
	} {
		if r.wrote(p.UID, other, false) {
			t.Errorf("%s: counted as written", name)
		}
	}
	if r.wrote(p.UID, kaironv1.PolicyEnforcement{}, true) {
		t.Error("removing the entry counted as written while the last write set it")
	}

	r.record(&p, kaironv1.PolicyEnforcement{}, true)
	if !r.wrote(p.UID, kaironv1.PolicyEnforcement{}, true) || r.wrote(p.UID, entry, false) {
		t.Error("a removed entry is not remembered as removed")
	}

	r.forget(p.UID)
	if r.wrote(p.UID, kaironv1.PolicyEnforcement{}, true) {
		t.Error("a failed write is still remembered")
	}

	// A policy gone from its namespace is forgotten; others stay.
	q := policy("team", "claim-egress-b", "uid-b")
	elsewhere := policy("other", "claim-egress-c", "uid-c")
	r.record(&p, entry, false)
	r.record(&q, entry, false)
	r.record(&elsewhere, entry, false)
	r.keepOnly("team", []kaironv1.MachineNetworkPolicy{q})
	if r.wrote(p.UID, entry, false) {
		t.Error("a deleted policy's write is still remembered")
	}
	if !r.wrote(q.UID, entry, false) || !r.wrote(elsewhere.UID, entry, false) {
		t.Error("keepOnly forgot a policy that still exists, or one of another namespace")
	}
}
