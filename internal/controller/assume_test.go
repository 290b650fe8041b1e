package controller

import (
	"testing"
	"time"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/rules/rulestest"
)

func TestAssumedBindings(t *testing.T) {
	now := time.Unix(1000, 0)
	a := newAssumedBindings()
	a.now = func() time.Time { return now }

	m := rulestest.Machine("m", 1, "256Mi")
	a.assume(m, "node-1")

	// The cache still shows the Machine unplaced: the binding is overlaid
	// on a copy.
	got := a.apply([]*kaironv1.Machine{m})
	if got[0].Spec.NodeName != "node-1" || m.Spec.NodeName != "" {
		t.Fatalf("overlay: got nodeName %q (cache copy %q), want node-1 on a copy", got[0].Spec.NodeName, m.Spec.NodeName)
	}

	// The cache caught up: forgotten.
	seen := m.DeepCopy()
	seen.Spec.NodeName = "node-1"
	a.apply([]*kaironv1.Machine{seen})
	if a.len() != 0 {
		t.Errorf("binding kept after the cache showed it")
	}

	// Never confirmed: forgotten after assumeTTL.
	a.assume(m, "node-1")
	now = now.Add(assumeTTL + time.Second)
	if got := a.apply([]*kaironv1.Machine{m}); got[0].Spec.NodeName != "" || a.len() != 0 {
		t.Errorf("expired binding still applied")
	}

	// The Machine is gone: forgotten.
	a.assume(m, "node-1")
	a.apply(nil)
	if a.len() != 0 {
		t.Errorf("binding of a deleted Machine kept")
	}
}
