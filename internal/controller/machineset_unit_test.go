package controller

import (
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/rules/rulestest"
)

func createdAt(sec int64) func(*kaironv1.Machine) {
	return func(m *kaironv1.Machine) { m.CreationTimestamp = metav1.NewTime(time.Unix(sec, 0)) }
}

func TestSurplusMachines(t *testing.T) {
	live := []*kaironv1.Machine{
		rulestest.Machine("running-old", 1, "256Mi", rulestest.Placed("n", kaironv1.MachineRunning), createdAt(1)),
		rulestest.Machine("running-new", 1, "256Mi", rulestest.Placed("n", kaironv1.MachineRunning), createdAt(5)),
		rulestest.Machine("booting", 1, "256Mi", rulestest.Placed("n", kaironv1.MachineBooting), createdAt(2)),
		rulestest.Machine("failed", 1, "256Mi", rulestest.Placed("n", kaironv1.MachineFailed), createdAt(2)),
		rulestest.Machine("pending", 1, "256Mi", rulestest.Placed("", kaironv1.MachinePending), createdAt(1)),
		rulestest.Machine("scheduled", 1, "256Mi", rulestest.Placed("n", kaironv1.MachineScheduled), createdAt(3)),
	}
	tests := []struct {
		n    int
		want []string
	}{
		{1, []string{"pending"}},
		{3, []string{"pending", "scheduled", "booting"}},
		{5, []string{"pending", "scheduled", "booting", "failed", "running-new"}},
		{9, []string{"pending", "scheduled", "booting", "failed", "running-new", "running-old"}},
	}
	for _, tt := range tests {
		var got []string
		for _, m := range surplusMachines(live, tt.n) {
			got = append(got, m.Name)
		}
		if len(got) != len(tt.want) {
			t.Errorf("surplusMachines(%d) = %v, want %v", tt.n, got, tt.want)
			continue
		}
		for i := range got {
			if got[i] != tt.want[i] {
				t.Errorf("surplusMachines(%d) = %v, want %v", tt.n, got, tt.want)
				break
			}
		}
	}
}

func TestReplicaExpectations(t *testing.T) {
	now := time.Unix(1000, 0)
	e := newReplicaExpectations()
	e.now = func() time.Time { return now }
	const set = "set-uid"
	a, b := rulestest.Machine("a", 1, "256Mi"), rulestest.Machine("b", 1, "256Mi")

	// Created b, the cache shows only a: b is in flight.
	e.created(set, "b")
	live, inFlight := e.reconcile(set, []*kaironv1.Machine{a})
	if len(live) != 1 || inFlight != 1 {
		t.Fatalf("before the cache shows b: live %d, in flight %d; want 1, 1", len(live), inFlight)
	}
	// Deleted a, the cache shows both still live: a no longer counts.
	e.deleted(set, a.UID)
	live, inFlight = e.reconcile(set, []*kaironv1.Machine{a, b})
	if len(live) != 1 || live[0].Name != "b" || inFlight != 0 {
		t.Fatalf("after deleting a: live %v, in flight %d; want [b], 0", live, inFlight)
	}
	// The cache shows a terminating: everything is confirmed.
	leaving := a.DeepCopy()
	leaving.DeletionTimestamp = ptr.To(metav1.Now())
	live, _ = e.reconcile(set, []*kaironv1.Machine{leaving, b})
	if len(live) != 1 || len(e.sets) != 0 {
		t.Errorf("after the cache caught up: live %d, expectations %v", len(live), e.sets)
	}
	// A creation the cache never shows stops counting after assumeTTL.
	e.created(set, "c")
	now = now.Add(assumeTTL + time.Second)
	if _, inFlight := e.reconcile(set, []*kaironv1.Machine{b}); inFlight != 0 {
		t.Errorf("expired creation still in flight")
	}

	// A set deleted with a creation in flight is never reconciled again;
	// its record goes once it expired and another set records a change.
	e.created("gone", "d")
	now = now.Add(assumeTTL + time.Second)
	e.created("other", "e")
	if _, ok := e.sets["gone"]; ok {
		t.Errorf("expired record of a deleted set kept")
	}
}

func TestMachineSetSelector(t *testing.T) {
	set := func(selector kaironv1.MachineSelector, templateLabels map[string]string) *kaironv1.MachineSet {
		return &kaironv1.MachineSet{
			ObjectMeta: metav1.ObjectMeta{Name: "web"},
			Spec: kaironv1.MachineSetSpec{
				Selector: selector,
				Template: kaironv1.MachineTemplateSpec{Metadata: kaironv1.MachineTemplateMeta{Labels: templateLabels}},
			},
		}
	}
	tests := []struct {
		name    string
		set     *kaironv1.MachineSet
		wantErr bool
	}{
		{"matchLabels", set(kaironv1.MachineSelector{MatchLabels: map[string]string{"app": "web"}}, map[string]string{"app": "web", "tier": "x"}), false},
		{"the set label is added to the template's", set(kaironv1.MachineSelector{MatchLabels: map[string]string{kaironv1.LabelMachineSet: "web"}}, nil), false},
		{"empty", set(kaironv1.MachineSelector{}, map[string]string{"app": "web"}), true},
		{"expression the template fails", set(kaironv1.MachineSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: "app", Operator: metav1.LabelSelectorOpIn, Values: []string{"db"}},
		}}, map[string]string{"app": "web"}), true},
		{"bad operator", set(kaironv1.MachineSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: "app", Operator: "Near"},
		}}, map[string]string{"app": "web"}), true},
	}
	for _, tt := range tests {
		if _, err := machineSetSelector(tt.set); (err != nil) != tt.wantErr {
			t.Errorf("%s: err = %v, want error %v", tt.name, err, tt.wantErr)
		}
	}
}

// Among Running Machines, the newest goes first: the latest
// creationTimestamp and, within its second (all a timestamp tells), the
// greatest name. TestMachinePoolTrimsBootingMembersFirst relies on this
// order for members the API server stamped.
func TestSurplusMachinesNewestFirst(t *testing.T) {
	running := func(name string, sec int64) *kaironv1.Machine {
		return rulestest.Machine(name, 1, "256Mi", rulestest.Placed("n", kaironv1.MachineRunning), createdAt(sec))
	}
	tests := []struct {
		name string
		live []*kaironv1.Machine
		n    int
		want []string
	}{
		{"a later second before an earlier one, whatever the names", []*kaironv1.Machine{running("z", 4), running("a", 5)}, 1, []string{"a"}},
		{"within a second the greater name first", []*kaironv1.Machine{running("m-1", 5), running("m-3", 5), running("m-2", 5)}, 2, []string{"m-3", "m-2"}},
		{"the newest second first, then by name within the next", []*kaironv1.Machine{running("b", 4), running("a", 6), running("c", 4)}, 3, []string{"a", "c", "b"}},
	}
	for _, tt := range tests {
		var got []string
		for _, m := range surplusMachines(tt.live, tt.n) {
			got = append(got, m.Name)
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("%s: surplusMachines(%d) = %v, want %v", tt.name, tt.n, got, tt.want)
		}
	}
}

func TestSlowStartBatch(t *testing.T) {
	boom := errors.New("refused")
	for _, tt := range []struct {
		name          string
		count         int
		initial       int
		failFrom      int // the calls from this one on fail (1-based); 0 for none
		wantCalls     int
		wantSuccesses int
		wantErr       bool
	}{
		{"nothing to do", 0, 1, 0, 0, 0, false},
		{"one", 1, 1, 0, 1, 1, false},
		// 1, 2, 4, 8, 16, 16, 16, 16, 16 then the remaining 5.
		{"all succeed", 100, 1, 0, 100, 100, false},
		// Every call refused (a quota): one call, not a hundred.
		{"first call fails", 100, 1, 1, 1, 0, true},
		// Batches 1 and 2 succeed; the third call fails in the batch of
		// 4, whose other calls are made already: 1+2+4 calls.
		{"fails in the third batch", 100, 1, 4, 7, 3, true},
		{"fails in the last, short batch", 5, 1, 5, 5, 4, true},
		// Batches 1, 2, 4 succeed; the batch of 8 fails: 15 calls.
		{"fails in the batch of 8", 100, 1, 8, 15, 7, true},
		// 1+2+4+8+16 succeed; batches stop growing at 16: 31+16 calls.
		{"batches stop at the cap", 100, 1, 32, 47, 31, true},
		{"larger first batch", 10, 3, 0, 10, 10, false},
		{"larger first batch fails", 10, 3, 2, 3, 1, true},
		{"initial below one means one", 3, 0, 1, 1, 0, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var calls atomic.Int32
			successes, err := slowStartBatch(tt.count, tt.initial, func() error {
				if n := int(calls.Add(1)); tt.failFrom > 0 && n >= tt.failFrom {
					return boom
				}
				return nil
			})
			if int(calls.Load()) != tt.wantCalls || successes != tt.wantSuccesses || (err != nil) != tt.wantErr {
				t.Errorf("calls %d, successes %d, err %v; want calls %d, successes %d, error %v",
					calls.Load(), successes, err, tt.wantCalls, tt.wantSuccesses, tt.wantErr)
			}
			if err != nil && !errors.Is(err, boom) {
				t.Errorf("err = %v, want the failure", err)
			}
		})
	}
}

// Never more than slowStartMaxBatch calls run at the same time.
func TestSlowStartBatchConcurrency(t *testing.T) {
	var mu sync.Mutex
	var running, peak int
	successes, err := slowStartBatch(maxCreatesPerSync, slowStartInitialBatch, func() error {
		mu.Lock()
		running++
		peak = max(peak, running)
		mu.Unlock()
		// Real time: a create is an API call that takes a while, so the
		// batch's calls overlap as they do against the API server.
		time.Sleep(time.Millisecond)
		mu.Lock()
		running--
		mu.Unlock()
		return nil
	})
	if err != nil || successes != maxCreatesPerSync {
		t.Fatalf("successes %d, err %v", successes, err)
	}
	if peak > slowStartMaxBatch {
		t.Errorf("%d calls ran at the same time, want at most %d", peak, slowStartMaxBatch)
	}
}
