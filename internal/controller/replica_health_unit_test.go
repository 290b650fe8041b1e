package controller

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

func TestSplitByHealth(t *testing.T) {
	lostCond := []metav1.Condition{{Type: kaironv1.ConditionNodeReachable.String(), Status: metav1.ConditionFalse}}
	backCond := []metav1.Condition{{Type: kaironv1.ConditionNodeReachable.String(), Status: metav1.ConditionTrue}}
	m := func(name string, phase kaironv1.MachinePhase, conds []metav1.Condition) *kaironv1.Machine {
		x := &kaironv1.Machine{Status: kaironv1.MachineStatus{Phase: phase, Conditions: conds}}
		x.Name = name
		return x
	}
	counted, lost, failed := splitByHealth([]*kaironv1.Machine{
		m("running", kaironv1.MachineRunning, nil),
		m("booting", kaironv1.MachineBooting, nil),
		m("back", kaironv1.MachineRunning, backCond),
		m("failed", kaironv1.MachineFailed, nil),
		m("lost", kaironv1.MachineRunning, lostCond),
		m("lost-failed", kaironv1.MachineFailed, lostCond), // never deleted: its node may lie
	})
	got := func(ms []*kaironv1.Machine) []string {
		var out []string
		for _, x := range ms {
			out = append(out, x.Name)
		}
		return out
	}
	if g := got(counted); len(g) != 3 || g[0] != "running" || g[1] != "booting" || g[2] != "back" {
		t.Errorf("counted = %v", g)
	}
	if g := got(lost); len(g) != 2 || g[0] != "lost" || g[1] != "lost-failed" {
		t.Errorf("lost = %v", g)
	}
	if g := got(failed); len(g) != 1 || g[0] != "failed" {
		t.Errorf("failed = %v", g)
	}
}

func TestFailureBackoff(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	b := newFailureBackoff()
	b.now = func() time.Time { return now }
	owner := types.UID("pool")
	failed := []*kaironv1.Machine{{}}
	if del, held, wait := b.heldFailed(owner, failed); len(del) != 1 || held != 0 || wait != 0 {
		t.Fatalf("first failure: delete %d held %d wait %s, want it replaced at once", len(del), held, wait)
	}
	for i, want := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second} {
		b.replaced(owner, 1)
		if _, held, wait := b.heldFailed(owner, failed); held != 1 || wait != want {
			t.Errorf("after replacement %d: held %d wait %s, want 1 held for %s", i+1, held, wait, want)
		}
		now = now.Add(want)
		if del, _, _ := b.heldFailed(owner, failed); len(del) != 1 {
			t.Errorf("after the wait of replacement %d: not replaced", i+1)
		}
	}
	for range 20 {
		b.replaced(owner, 1)
	}
	if w := b.hold(owner); w != maxFailureBackoff {
		t.Errorf("hold = %s, want the cap %s", w, maxFailureBackoff)
	}
	b.healthy(owner)
	if w := b.hold(owner); w != 0 {
		t.Errorf("hold after healthy = %s", w)
	}
}
