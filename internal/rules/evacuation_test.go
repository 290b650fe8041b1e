package rules

import (
	"reflect"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// Unit tests of the evacuation plan: no API server.

func TestPlanEvacuation(t *testing.T) {
	web := func(name string, phase kaironv1.MachinePhase) kaironv1.Machine {
		return mdbMachine("default", name, phase, mdbWebLabels)
	}
	deleting := func(m kaironv1.Machine) kaironv1.Machine {
		m.DeletionTimestamp = &metav1.Time{}
		m.Finalizers = []string{kaironv1.FinalizerMachineVM}
		return m
	}
	dbLabels := map[string]string{"tier": "web", "app": "db"}
	tests := []struct {
		name       string
		budgets    []kaironv1.MachineDisruptionBudget
		machines   []kaironv1.Machine // every Machine in the cluster
		evacuate   []string           // the ones on the node, in order
		migrations []kaironv1.MachineMigration
		want       []string // "machine verdict detail"
	}{{
		name:     "no budgets: everything moves",
		machines: []kaironv1.Machine{web("web-a", kaironv1.MachineRunning), web("web-b", kaironv1.MachineBooting)},
		evacuate: []string{"web-a", "web-b"},
		want:     []string{"web-a Migrate", "web-b Migrate"},
	}, {
		name:     "minAvailable 2 of 3: one moves, the pass spends it, two are blocked",
		budgets:  []kaironv1.MachineDisruptionBudget{mdbBudget("default", "web-tier", mdbMinAvailable(mdbInt(2)))},
		machines: mdbRunning(3),
		evacuate: []string{"web-a", "web-b", "web-c"},
		want: []string{
			"web-a Migrate",
			"web-b Blocked [default/web-tier] budget default/web-tier allows no more disruptions (3 healthy, 2 desired, 0 allowed; 1 already spent in this pass)",
			"web-c Blocked [default/web-tier] budget default/web-tier allows no more disruptions (3 healthy, 2 desired, 0 allowed; 1 already spent in this pass)",
		},
	}, {
		name:     "a migration in flight is never duplicated and already counts against the budget",
		budgets:  []kaironv1.MachineDisruptionBudget{mdbBudget("default", "web-tier", mdbMinAvailable(mdbInt(2)))},
		machines: mdbRunning(3),
		evacuate: []string{"web-a", "web-b", "web-c"},
		migrations: []kaironv1.MachineMigration{
			mdbMigration("default", "web-a-old", "web-a", kaironv1.MigrationFailed),
			mdbMigration("default", "web-a-evac-2", "web-a", kaironv1.MigrationPending),
			mdbMigration("default", "web-a-evac-1", "web-a", ""),
		},
		want: []string{
			"web-a InFlight web-a-evac-1",
			"web-b Blocked [default/web-tier] budget default/web-tier allows no more disruptions (2 healthy, 2 desired, 0 allowed)",
			"web-c Blocked [default/web-tier] budget default/web-tier allows no more disruptions (2 healthy, 2 desired, 0 allowed)",
		},
	}, {
		name:     "terminal migrations do not count",
		budgets:  []kaironv1.MachineDisruptionBudget{mdbBudget("default", "web-tier", mdbMaxUnavailable(mdbInt(1)))},
		machines: mdbRunning(2),
		evacuate: []string{"web-a", "web-b"},
		migrations: []kaironv1.MachineMigration{
			mdbMigration("default", "web-a-1", "web-a", kaironv1.MigrationFailed),
			mdbMigration("default", "web-b-1", "web-b", kaironv1.MigrationSucceeded),
			// Same name, other namespace: another Machine.
			mdbMigration("other", "web-a-2", "web-a", kaironv1.MigrationRunning),
		},
		want: []string{
			"web-a Migrate",
			"web-b Blocked [default/web-tier] budget default/web-tier allows no more disruptions (2 healthy, 1 desired, 0 allowed; 1 already spent in this pass)",
		},
	}, {
		name:     "a Machine being deleted is left to go and spends nothing",
		budgets:  []kaironv1.MachineDisruptionBudget{mdbBudget("default", "web-tier", mdbMaxUnavailable(mdbInt(1)))},
		machines: []kaironv1.Machine{deleting(web("web-a", kaironv1.MachineRunning)), web("web-b", kaironv1.MachineRunning), web("web-c", kaironv1.MachineRunning)},
		evacuate: []string{"web-a", "web-b", "web-c"},
		want: []string{
			"web-a Deleting",
			"web-b Migrate",
			"web-c Blocked [default/web-tier] budget default/web-tier allows no more disruptions (3 healthy, 2 desired, 0 allowed; 1 already spent in this pass)",
		},
	}, {
		name: "under two budgets, only the one in the way is named",
		budgets: []kaironv1.MachineDisruptionBudget{
			mdbBudget("default", "web-tier", mdbMaxUnavailable(mdbStr("50%"))),
			mdbBudget("team-a", "db", kaironv1.MachineDisruptionBudgetSpec{Selector: map[string]string{"app": "db"}, MinAvailable: mdbInt(1)}),
		},
		machines: []kaironv1.Machine{
			mdbMachine("default", "db-1", kaironv1.MachineRunning, dbLabels),
			mdbMachine("default", "web-a", kaironv1.MachineRunning, mdbWebLabels),
			mdbMachine("default", "web-b", kaironv1.MachineRunning, mdbWebLabels),
			mdbMachine("default", "web-c", kaironv1.MachineRunning, mdbWebLabels),
		},
		evacuate: []string{"db-1", "web-a", "web-b"},
		want: []string{
			"db-1 Blocked [team-a/db] budget team-a/db allows no more disruptions (1 healthy, 1 desired, 0 allowed)",
			// 50% of 4 rounds up to 2 allowed; db-1 spent none.
			"web-a Migrate",
			"web-b Migrate",
		},
	}, {
		name:     "an invalid budget blocks",
		budgets:  []kaironv1.MachineDisruptionBudget{mdbBudget("default", "broken", kaironv1.MachineDisruptionBudgetSpec{Selector: mdbWebLabels})},
		machines: mdbRunning(1),
		evacuate: []string{"web-a"},
		want: []string{
			"web-a Blocked [default/broken] budget default/broken is invalid and blocks every disruption: neither spec.minAvailable nor spec.maxUnavailable is set; set exactly one",
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			snap := &EvacuationSnapshot{
				Budgets:    ComputeBudgetStates(tt.budgets, tt.machines, tt.migrations),
				Machines:   tt.machines,
				Migrations: tt.migrations,
			}
			byName := map[string]*kaironv1.Machine{}
			for i := range snap.Machines {
				byName[snap.Machines[i].Name] = &snap.Machines[i]
			}
			var on []*kaironv1.Machine
			for _, name := range tt.evacuate {
				on = append(on, byName[name])
			}
			var got []string
			for _, d := range snap.Plan(on) {
				s := d.Machine.Name + " " + string(d.Verdict)
				switch d.Verdict {
				case EvacuationInFlight:
					s += " " + d.Migration.Name
				case EvacuationBlocked:
					s += " [" + strings.Join(d.Budgets, ",") + "] " + d.Reason
				}
				got = append(got, s)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("plan:\n got %s\nwant %s", strings.Join(got, "\n     "), strings.Join(tt.want, "\n     "))
			}
		})
	}
}

func TestMachinesOnAndNewEvacuationMigration(t *testing.T) {
	snap := &EvacuationSnapshot{Machines: []kaironv1.Machine{
		{ObjectMeta: metav1.ObjectMeta{Namespace: "b", Name: "x"}, Spec: kaironv1.MachineSpec{NodeName: "n1"}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "y"}, Spec: kaironv1.MachineSpec{NodeName: "n1"}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "x"}, Spec: kaironv1.MachineSpec{NodeName: "n2"}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "w"}, Spec: kaironv1.MachineSpec{NodeName: "n1"}},
	}}
	var got []string
	for _, m := range snap.MachinesOn("n1") {
		got = append(got, m.Namespace+"/"+m.Name)
	}
	if want := []string{"a/w", "a/y", "b/x"}; !reflect.DeepEqual(got, want) {
		t.Errorf("MachinesOn(n1) = %v, want %v", got, want)
	}

	mig := NewEvacuationMigration(snap.MachinesOn("n1")[0], "n1", kaironv1.MigrationLive)
	if mig.Namespace != "a" || mig.GenerateName != "w-evac-" || mig.Name != "" ||
		mig.Spec.MachineName != "w" || mig.Spec.Strategy != kaironv1.MigrationLive || mig.Spec.TargetNode != "" ||
		!reflect.DeepEqual(mig.Labels, map[string]string{kaironv1.LabelEvacuatedNode: "n1"}) {
		t.Errorf("migration %+v", mig)
	}
	long := strings.Repeat("n", 70)
	if mig := NewEvacuationMigration(snap.MachinesOn("n1")[0], long, kaironv1.MigrationCold); len(mig.Labels) != 0 {
		t.Errorf("a node name too long for a label value was put in one: %v", mig.Labels)
	}
}
