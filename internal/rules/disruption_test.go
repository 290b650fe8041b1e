package rules

import (
	"context"
	"errors"
	"reflect"
	"strconv"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// Unit tests of the disruption arithmetic: no API server.

func mdbInt(n int32) *intstr.IntOrString  { return ptr.To(intstr.FromInt32(n)) }
func mdbStr(s string) *intstr.IntOrString { return ptr.To(intstr.FromString(s)) }

func mdbMinAvailable(v *intstr.IntOrString) kaironv1.MachineDisruptionBudgetSpec {
	return kaironv1.MachineDisruptionBudgetSpec{Selector: map[string]string{"tier": "web"}, MinAvailable: v}
}

func mdbMaxUnavailable(v *intstr.IntOrString) kaironv1.MachineDisruptionBudgetSpec {
	return kaironv1.MachineDisruptionBudgetSpec{Selector: map[string]string{"tier": "web"}, MaxUnavailable: v}
}

func mdbBudget(ns, name string, spec kaironv1.MachineDisruptionBudgetSpec) kaironv1.MachineDisruptionBudget {
	return kaironv1.MachineDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Generation: 1}, Spec: spec}
}

func mdbMachine(ns, name string, phase kaironv1.MachinePhase, labels map[string]string) kaironv1.Machine {
	return kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels}, Status: kaironv1.MachineStatus{Phase: phase}}
}

var mdbWebLabels = map[string]string{"tier": "web"}

// running returns n Running Machines labeled tier=web in namespace default.
func mdbRunning(n int) []kaironv1.Machine {
	out := make([]kaironv1.Machine, n)
	for i := range out {
		out[i] = mdbMachine("default", "web-"+string(rune('a'+i%26))+strings.Repeat("x", i/26), kaironv1.MachineRunning, mdbWebLabels)
	}
	return out
}

func mdbMigration(ns, name, machine string, phase kaironv1.MigrationPhase) kaironv1.MachineMigration {
	return kaironv1.MachineMigration{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       kaironv1.MachineMigrationSpec{MachineName: machine},
		Status:     kaironv1.MachineMigrationStatus{Phase: phase},
	}
}

func TestDisruptionBudgetArithmetic(t *testing.T) {
	type numbers struct{ expected, healthy, desired, allowed int32 }
	for _, tc := range []struct {
		name       string
		spec       kaironv1.MachineDisruptionBudgetSpec
		machines   []kaironv1.Machine
		migrations []kaironv1.MachineMigration
		want       numbers
		wantErr    string
	}{
		// minAvailable, as an integer, a string of digits and a percentage.
		{name: "minAvailable int", spec: mdbMinAvailable(mdbInt(2)), machines: mdbRunning(3), want: numbers{3, 3, 2, 1}},
		{name: "minAvailable digits string", spec: mdbMinAvailable(mdbStr("2")), machines: mdbRunning(3), want: numbers{3, 3, 2, 1}},
		{name: "minAvailable 50% of 3 rounds up to 2", spec: mdbMinAvailable(mdbStr("50%")), machines: mdbRunning(3), want: numbers{3, 3, 2, 1}},
		{name: "minAvailable 34% of 3 rounds up to 2", spec: mdbMinAvailable(mdbStr("34%")), machines: mdbRunning(3), want: numbers{3, 3, 2, 1}},
		{name: "minAvailable 33% of 3 rounds up to 1", spec: mdbMinAvailable(mdbStr("33%")), machines: mdbRunning(3), want: numbers{3, 3, 1, 2}},
		{name: "minAvailable 1% of 1 rounds up to 1", spec: mdbMinAvailable(mdbStr("1%")), machines: mdbRunning(1), want: numbers{1, 1, 1, 0}},
		{name: "minAvailable 100%", spec: mdbMinAvailable(mdbStr("100%")), machines: mdbRunning(4), want: numbers{4, 4, 4, 0}},
		{name: "minAvailable 0%", spec: mdbMinAvailable(mdbStr("0%")), machines: mdbRunning(4), want: numbers{4, 4, 0, 4}},
		{name: "minAvailable 0", spec: mdbMinAvailable(mdbInt(0)), machines: mdbRunning(2), want: numbers{2, 2, 0, 2}},
		{name: "minAvailable above matching", spec: mdbMinAvailable(mdbInt(5)), machines: mdbRunning(3), want: numbers{3, 3, 5, 0}},

		// maxUnavailable: desired = expected - value, a percentage rounded up.
		{name: "maxUnavailable int", spec: mdbMaxUnavailable(mdbInt(1)), machines: mdbRunning(3), want: numbers{3, 3, 2, 1}},
		{name: "maxUnavailable digits string", spec: mdbMaxUnavailable(mdbStr("1")), machines: mdbRunning(3), want: numbers{3, 3, 2, 1}},
		{name: "maxUnavailable 25% of 20", spec: mdbMaxUnavailable(mdbStr("25%")), machines: mdbRunning(20), want: numbers{20, 20, 15, 5}},
		{name: "maxUnavailable 25% of 3 rounds up to 1", spec: mdbMaxUnavailable(mdbStr("25%")), machines: mdbRunning(3), want: numbers{3, 3, 2, 1}},
		{name: "maxUnavailable 10% of 11 rounds up to 2", spec: mdbMaxUnavailable(mdbStr("10%")), machines: mdbRunning(11), want: numbers{11, 11, 9, 2}},
		{name: "maxUnavailable 0%", spec: mdbMaxUnavailable(mdbStr("0%")), machines: mdbRunning(3), want: numbers{3, 3, 3, 0}},
		{name: "maxUnavailable 100%", spec: mdbMaxUnavailable(mdbStr("100%")), machines: mdbRunning(3), want: numbers{3, 3, 0, 3}},
		{name: "maxUnavailable above matching", spec: mdbMaxUnavailable(mdbInt(5)), machines: mdbRunning(3), want: numbers{3, 3, 0, 3}},

		// Nothing matches.
		{name: "zero matches minAvailable int", spec: mdbMinAvailable(mdbInt(2)), want: numbers{0, 0, 2, 0}},
		{name: "zero matches minAvailable %", spec: mdbMinAvailable(mdbStr("50%")), want: numbers{0, 0, 0, 0}},
		{name: "zero matches maxUnavailable", spec: mdbMaxUnavailable(mdbInt(1)), want: numbers{0, 0, 0, 0}},
		{name: "zero matches: labels differ", spec: mdbMinAvailable(mdbInt(1)),
			machines: []kaironv1.Machine{mdbMachine("default", "db-1", kaironv1.MachineRunning, map[string]string{"tier": "db"})},
			want:     numbers{0, 0, 1, 0}},

		// Selector: every key=value must match, in any namespace.
		{name: "all selector labels must match",
			spec: kaironv1.MachineDisruptionBudgetSpec{Selector: map[string]string{"tier": "web", "zone": "a"}, MinAvailable: mdbInt(1)},
			machines: []kaironv1.Machine{
				mdbMachine("default", "only-tier", kaironv1.MachineRunning, mdbWebLabels),
				mdbMachine("default", "both", kaironv1.MachineRunning, map[string]string{"tier": "web", "zone": "a", "x": "y"}),
				mdbMachine("default", "zone-b", kaironv1.MachineRunning, map[string]string{"tier": "web", "zone": "b"}),
			},
			want: numbers{1, 1, 1, 0}},
		{name: "matches across namespaces", spec: mdbMinAvailable(mdbInt(1)),
			machines: []kaironv1.Machine{
				mdbMachine("default", "web-1", kaironv1.MachineRunning, mdbWebLabels),
				mdbMachine("team-a", "web-1", kaironv1.MachineRunning, mdbWebLabels),
				mdbMachine("team-b", "web-9", kaironv1.MachineBooting, mdbWebLabels),
			},
			want: numbers{3, 2, 1, 1}},
		{name: "empty selector matches every Machine",
			spec:     kaironv1.MachineDisruptionBudgetSpec{MaxUnavailable: mdbInt(1)},
			machines: []kaironv1.Machine{mdbMachine("a", "x", kaironv1.MachineRunning, nil), mdbMachine("b", "y", kaironv1.MachineRunning, mdbWebLabels)},
			want:     numbers{2, 2, 1, 1}},

		// Health: only Running counts, and not while a migration is in flight.
		{name: "phases other than Running are not healthy", spec: mdbMinAvailable(mdbInt(1)),
			machines: []kaironv1.Machine{
				mdbMachine("default", "a", kaironv1.MachineRunning, mdbWebLabels),
				mdbMachine("default", "b", kaironv1.MachineBooting, mdbWebLabels),
				mdbMachine("default", "c", kaironv1.MachinePending, mdbWebLabels),
				mdbMachine("default", "d", kaironv1.MachineStopped, mdbWebLabels),
				mdbMachine("default", "e", kaironv1.MachineFailed, mdbWebLabels),
				mdbMachine("default", "f", "", mdbWebLabels),
			},
			want: numbers{6, 1, 1, 0}},
		{name: "in-flight migrations are not healthy headroom", spec: mdbMinAvailable(mdbInt(2)),
			machines: mdbRunning(4),
			migrations: []kaironv1.MachineMigration{
				mdbMigration("default", "m1", "web-a", kaironv1.MigrationPending),
				mdbMigration("default", "m2", "web-b", kaironv1.MigrationRunning),
				mdbMigration("default", "m3", "web-c", ""), // just created, no phase yet
			},
			want: numbers{4, 1, 2, 0}},
		{name: "terminal migrations do not count", spec: mdbMinAvailable(mdbInt(2)),
			machines: mdbRunning(3),
			migrations: []kaironv1.MachineMigration{
				mdbMigration("default", "m1", "web-a", kaironv1.MigrationSucceeded),
				mdbMigration("default", "m2", "web-b", kaironv1.MigrationFailed),
			},
			want: numbers{3, 3, 2, 1}},
		{name: "a migration targets its own namespace's Machine", spec: mdbMinAvailable(mdbInt(2)),
			machines:   mdbRunning(3),
			migrations: []kaironv1.MachineMigration{mdbMigration("elsewhere", "m1", "web-a", kaironv1.MigrationRunning)},
			want:       numbers{3, 3, 2, 1}},
		{name: "two migrations of one Machine count once", spec: mdbMinAvailable(mdbInt(1)),
			machines: mdbRunning(3),
			migrations: []kaironv1.MachineMigration{
				mdbMigration("default", "m1", "web-a", kaironv1.MigrationRunning),
				mdbMigration("default", "m2", "web-a", kaironv1.MigrationPending),
			},
			want: numbers{3, 2, 1, 1}},

		// Invalid budgets are an error state that allows nothing.
		{name: "both bounds", spec: kaironv1.MachineDisruptionBudgetSpec{Selector: mdbWebLabels, MinAvailable: mdbInt(1), MaxUnavailable: mdbInt(1)},
			machines: mdbRunning(3), want: numbers{3, 3, 3, 0},
			wantErr: "both spec.minAvailable and spec.maxUnavailable are set; set exactly one"},
		{name: "neither bound", spec: kaironv1.MachineDisruptionBudgetSpec{Selector: mdbWebLabels},
			machines: mdbRunning(3), want: numbers{3, 3, 3, 0},
			wantErr: "neither spec.minAvailable nor spec.maxUnavailable is set; set exactly one"},
		{name: "malformed string", spec: mdbMinAvailable(mdbStr("two")), machines: mdbRunning(2), want: numbers{2, 2, 2, 0},
			wantErr: `spec.minAvailable: "two" is not a non-negative integer or a percentage from 0% to 100%`},
		{name: "percentage above 100", spec: mdbMaxUnavailable(mdbStr("150%")), machines: mdbRunning(2), want: numbers{2, 2, 2, 0},
			wantErr: `spec.maxUnavailable: "150%" is not a non-negative integer or a percentage from 0% to 100%`},
		{name: "negative integer", spec: mdbMaxUnavailable(mdbInt(-1)), machines: mdbRunning(2), want: numbers{2, 2, 2, 0},
			wantErr: "spec.maxUnavailable: -1 is negative"},
		{name: "integer string too large", spec: mdbMinAvailable(mdbStr("99999999999")), machines: mdbRunning(1), want: numbers{1, 1, 1, 0},
			wantErr: `spec.minAvailable: "99999999999" is too large`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			states := ComputeBudgetStates([]kaironv1.MachineDisruptionBudget{mdbBudget("default", "web-tier", tc.spec)}, tc.machines, tc.migrations)
			if len(states) != 1 {
				t.Fatalf("%d states, want 1", len(states))
			}
			s := states[0]
			if got := (numbers{s.ExpectedMachines, s.CurrentHealthy, s.DesiredHealthy, s.DisruptionsAllowed}); got != tc.want {
				t.Errorf("expected/healthy/desired/allowed = %v, want %v", got, tc.want)
			}
			switch {
			case tc.wantErr == "" && s.Err != nil:
				t.Errorf("unexpected error: %v", s.Err)
			case tc.wantErr != "" && (s.Err == nil || !strings.Contains(s.Err.Error(), tc.wantErr)):
				t.Errorf("error %v, want one containing %q", s.Err, tc.wantErr)
			}
			if int(s.ExpectedMachines) != len(s.Machines) {
				t.Errorf("%d Machines listed for %d expected", len(s.Machines), s.ExpectedMachines)
			}
			healthy := int32(0)
			for _, m := range s.Machines {
				if m.Healthy {
					healthy++
				}
				if m.Healthy != (m.Reason == "") {
					t.Errorf("%s/%s: healthy=%v with reason %q", m.Namespace, m.Name, m.Healthy, m.Reason)
				}
			}
			if healthy != s.CurrentHealthy {
				t.Errorf("%d Machines marked healthy, CurrentHealthy %d", healthy, s.CurrentHealthy)
			}
		})
	}
}

// Every matching Machine says whether it is healthy, and why not.
func TestDisruptionBudgetMachineReasons(t *testing.T) {
	machines := []kaironv1.Machine{
		mdbMachine("default", "web-3", kaironv1.MachineRunning, mdbWebLabels),
		mdbMachine("default", "web-1", kaironv1.MachineRunning, mdbWebLabels),
		mdbMachine("default", "web-2", kaironv1.MachineBooting, mdbWebLabels),
		mdbMachine("team-a", "web-1", kaironv1.MachineStopping, mdbWebLabels),
		mdbMachine("default", "web-4", "", mdbWebLabels),
		mdbMachine("default", "db-1", kaironv1.MachineRunning, map[string]string{"tier": "db"}),
		mdbMachine("default", "web-5", kaironv1.MachineRunning, mdbWebLabels),
	}
	machines[len(machines)-1].Status.Conditions = []metav1.Condition{{Type: kaironv1.ConditionNodeReachable.String(), Status: metav1.ConditionFalse}}
	migrations := []kaironv1.MachineMigration{
		mdbMigration("default", "move-web-3", "web-3", kaironv1.MigrationRunning),
		mdbMigration("team-a", "move-web-1", "web-1", kaironv1.MigrationPending),
		mdbMigration("default", "old-move", "web-1", kaironv1.MigrationSucceeded),
	}
	states := ComputeBudgetStates([]kaironv1.MachineDisruptionBudget{mdbBudget("default", "web-tier", mdbMinAvailable(mdbInt(2)))}, machines, migrations)
	want := []BudgetMachine{
		{Namespace: "default", Name: "web-1", Phase: kaironv1.MachineRunning, Healthy: true},
		{Namespace: "default", Name: "web-2", Phase: kaironv1.MachineBooting, Reason: "status.phase is Booting, not Running"},
		{Namespace: "default", Name: "web-3", Phase: kaironv1.MachineRunning, Migration: "move-web-3", Reason: "non-terminal MachineMigration in flight"},
		{Namespace: "default", Name: "web-4", Reason: "status.phase is not set yet, not Running"},
		{Namespace: "default", Name: "web-5", Phase: kaironv1.MachineRunning, Reason: "its node's agent is unreachable"},
		{Namespace: "team-a", Name: "web-1", Phase: kaironv1.MachineStopping, Migration: "move-web-1",
			Reason: "status.phase is Stopping, not Running; non-terminal MachineMigration in flight"},
	}
	if !reflect.DeepEqual(states[0].Machines, want) {
		t.Errorf("machines:\n%+v\nwant\n%+v", states[0].Machines, want)
	}
	if got := BudgetSummary(&states[0]); got != "6 matching, 1 healthy, 2 desired healthy, 0 disruptions allowed" {
		t.Errorf("summary %q", got)
	}
}

func TestAdmitDisruption(t *testing.T) {
	machines := mdbRunning(3) // web-a, web-b, web-c
	db := mdbMachine("default", "db-1", kaironv1.MachineRunning, map[string]string{"tier": "db"})
	states := ComputeBudgetStates([]kaironv1.MachineDisruptionBudget{mdbBudget("default", "web-tier", mdbMinAvailable(mdbInt(2)))},
		append(machines, db), nil)

	// AdmitDisruption alone spends nothing.
	for range 3 {
		if ok, reason := AdmitDisruption(states, &machines[0]); !ok {
			t.Fatalf("AdmitDisruption refused with 1 allowed: %s", reason)
		}
	}
	// A Machine no budget matches is never blocked.
	if ok, reason := AdmitDisruption(states, &db); !ok || reason != "" {
		t.Errorf("unmatched Machine: ok=%v reason=%q", ok, reason)
	}
	if ok, _ := AdmitDisruption(nil, &machines[0]); !ok {
		t.Error("no budgets at all blocked a Machine")
	}

	// A pass spends: the first is admitted, the rest are not.
	pass := NewDisruptionPass(states)
	if ok, reason := pass.Admit(&machines[0]); !ok {
		t.Fatalf("first Admit refused: %s", reason)
	}
	for _, m := range machines[1:] {
		ok, reason := pass.Admit(&m)
		want := "budget default/web-tier allows no more disruptions (3 healthy, 2 desired, 0 allowed; 1 already spent in this pass)"
		if ok || reason != want {
			t.Errorf("Admit(%s) = %v, %q; want false, %q", m.Name, ok, reason, want)
		}
	}
	if n, ok := pass.Remaining("default", "web-tier"); !ok || n != 0 {
		t.Errorf("Remaining = %d, %v", n, ok)
	}
	if ok, _ := pass.Admit(&db); !ok {
		t.Error("unmatched Machine blocked in a spent pass")
	}
	// The states themselves are untouched: a new pass starts afresh.
	if states[0].DisruptionsAllowed != 1 {
		t.Errorf("the pass changed the states: %+v", states[0])
	}
	if ok, _ := NewDisruptionPass(states).Admit(&machines[1]); !ok {
		t.Error("a new pass does not start afresh")
	}

	// With nothing allowed from the start, the reason has the plain numbers.
	busy := ComputeBudgetStates([]kaironv1.MachineDisruptionBudget{mdbBudget("default", "web-tier", mdbMinAvailable(mdbInt(3)))}, machines, nil)
	ok, reason := AdmitDisruption(busy, &machines[0])
	if want := "budget default/web-tier allows no more disruptions (3 healthy, 3 desired, 0 allowed)"; ok || reason != want {
		t.Errorf("AdmitDisruption = %v, %q; want false, %q", ok, reason, want)
	}
}

// A Machine under two budgets spends from both; it is blocked as soon as
// either has nothing left, and the reason names each one that blocks.
func TestDisruptionPassAcrossBudgets(t *testing.T) {
	machines := []kaironv1.Machine{
		mdbMachine("default", "web-1", kaironv1.MachineRunning, map[string]string{"tier": "web", "zone": "a"}),
		mdbMachine("default", "web-2", kaironv1.MachineRunning, map[string]string{"tier": "web", "zone": "a"}),
		mdbMachine("default", "web-3", kaironv1.MachineRunning, map[string]string{"tier": "web", "zone": "b"}),
		mdbMachine("default", "web-4", kaironv1.MachineRunning, map[string]string{"tier": "web", "zone": "b"}),
		mdbMachine("default", "api-1", kaironv1.MachineRunning, map[string]string{"zone": "a"}),
	}
	budgets := []kaironv1.MachineDisruptionBudget{
		// 4 web Machines, at most 2 down: 2 allowed.
		mdbBudget("default", "web-tier", mdbMaxUnavailable(mdbStr("50%"))),
		// 3 Machines in zone a, at least 2 up: 1 allowed.
		mdbBudget("ops", "zone-a", kaironv1.MachineDisruptionBudgetSpec{Selector: map[string]string{"zone": "a"}, MinAvailable: mdbInt(2)}),
	}
	states := ComputeBudgetStates(budgets, machines, nil)
	pass := NewDisruptionPass(states)
	steps := []struct {
		machine int
		ok      bool
		reason  string
	}{
		{0, true, ""}, // web-1: spends web-tier (1 left) and zone-a (0 left)
		{1, false, "budget ops/zone-a allows no more disruptions (3 healthy, 2 desired, 0 allowed; 1 already spent in this pass)"},
		{4, false, "budget ops/zone-a allows no more disruptions (3 healthy, 2 desired, 0 allowed; 1 already spent in this pass)"},
		{2, true, ""}, // web-3: only web-tier, its last allowance
		{3, false, "budget default/web-tier allows no more disruptions (4 healthy, 2 desired, 0 allowed; 2 already spent in this pass)"},
		{1, false, "budget default/web-tier allows no more disruptions (4 healthy, 2 desired, 0 allowed; 2 already spent in this pass); " +
			"budget ops/zone-a allows no more disruptions (3 healthy, 2 desired, 0 allowed; 1 already spent in this pass)"},
	}
	for i, step := range steps {
		m := &machines[step.machine]
		ok, reason := pass.Admit(m)
		if ok != step.ok || reason != step.reason {
			t.Errorf("step %d: Admit(%s) = %v, %q; want %v, %q", i, m.Name, ok, reason, step.ok, step.reason)
		}
	}
}

func TestInvalidBudgetBlocks(t *testing.T) {
	machines := mdbRunning(3)
	states := ComputeBudgetStates([]kaironv1.MachineDisruptionBudget{mdbBudget("default", "broken", kaironv1.MachineDisruptionBudgetSpec{Selector: mdbWebLabels})}, machines, nil)
	ok, reason := AdmitDisruption(states, &machines[0])
	want := "budget default/broken is invalid and blocks every disruption: neither spec.minAvailable nor spec.maxUnavailable is set; set exactly one"
	if ok || reason != want {
		t.Errorf("AdmitDisruption = %v, %q; want false, %q", ok, reason, want)
	}
	if n, found := NewDisruptionPass(states).Remaining("default", "broken"); !found || n != 0 {
		t.Errorf("Remaining = %d, %v", n, found)
	}
}

func TestParseBudgetValue(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    intstr.IntOrString
		wantErr string
	}{
		{in: "0", want: intstr.FromInt32(0)},
		{in: "2", want: intstr.FromInt32(2)},
		{in: "2147483647", want: intstr.FromInt32(2147483647)},
		{in: "0%", want: intstr.FromString("0%")},
		{in: "25%", want: intstr.FromString("25%")},
		{in: "100%", want: intstr.FromString("100%")},
		{in: "2147483648", wantErr: `"2147483648" is too large (at most 2147483647)`},
		{in: "101%", wantErr: `"101%" is not a non-negative integer (e.g. 2) or a percentage from 0% to 100% (e.g. 25%)`},
		{in: "05%", wantErr: "is not a non-negative integer"},
		{in: "-1", wantErr: "is not a non-negative integer"},
		{in: "1.5", wantErr: "is not a non-negative integer"},
		{in: "", wantErr: "is not a non-negative integer"},
		{in: "two", wantErr: "is not a non-negative integer"},
	} {
		got, err := ParseBudgetValue(tc.in)
		switch {
		case tc.wantErr == "" && (err != nil || got != tc.want):
			t.Errorf("ParseBudgetValue(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("ParseBudgetValue(%q) error %v, want one containing %q", tc.in, err, tc.wantErr)
		}
	}
}

// LoadBudgetStates reads budgets, Machines and migrations of every namespace.
func TestLoadBudgetStatesListsClusterWide(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := kaironv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	b1 := mdbBudget("default", "web-tier", mdbMinAvailable(mdbInt(1)))
	b2 := mdbBudget("team-a", "a-first", mdbMaxUnavailable(mdbStr("50%")))
	m1 := mdbMachine("default", "web-1", kaironv1.MachineRunning, mdbWebLabels)
	m2 := mdbMachine("team-a", "web-2", kaironv1.MachineRunning, mdbWebLabels)
	mig := mdbMigration("team-a", "move", "web-2", kaironv1.MigrationRunning)
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(&b1, &b2, &m1, &m2, &mig).Build()
	states, err := LoadBudgetStates(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	if len(states) != 2 || states[0].Key() != "default/web-tier" || states[1].Key() != "team-a/a-first" {
		t.Fatalf("states %+v", states)
	}
	if s := states[0]; s.ExpectedMachines != 2 || s.CurrentHealthy != 1 || s.DisruptionsAllowed != 0 || s.Budget == nil || s.Budget.Name != "web-tier" {
		t.Errorf("web-tier: %+v", s)
	}
	if s := FindBudgetState(states, "team-a", "a-first"); s == nil || s.DesiredHealthy != 1 || s.DisruptionsAllowed != 0 {
		t.Errorf("a-first: %+v", s)
	}
	if FindBudgetState(states, "team-a", "web-tier") != nil {
		t.Error("FindBudgetState found a budget in the wrong namespace")
	}

	// A failing list is an error, not an empty answer.
	failing := fake.NewClientBuilder().WithScheme(scheme).WithObjects(&b1).WithInterceptorFuncs(interceptor.Funcs{
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			if _, ok := list.(*kaironv1.MachineMigrationList); ok {
				return errors.New("boom")
			}
			return c.List(ctx, list, opts...)
		},
	}).Build()
	if _, err := LoadBudgetStates(context.Background(), failing); err == nil || err.Error() != "listing machinemigrations: boom" {
		t.Errorf("err = %v", err)
	}
}

// Percentages round exactly as Kubernetes rounds a PodDisruptionBudget's.
func TestBudgetPercentagesRoundLikeKubernetes(t *testing.T) {
	for p := 0; p <= 100; p++ {
		v := intstr.FromString(strconv.Itoa(p) + "%")
		for expected := int32(0); expected <= 60; expected++ {
			got, err := ScaledBudgetValue(v, expected)
			if err != nil {
				t.Fatalf("%s of %d: %v", v.StrVal, expected, err)
			}
			want, err := intstr.GetScaledValueFromIntOrPercent(&v, int(expected), true)
			if err != nil {
				t.Fatal(err)
			}
			if int(got) != want {
				t.Fatalf("%s of %d = %d, Kubernetes says %d", v.StrVal, expected, got, want)
			}
		}
	}
}
