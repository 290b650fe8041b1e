package rules

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// completingReader serves a cluster in which a migration completes during
// the first List of Machines or MachineMigrations a snapshot makes: that
// List sees the cluster before, every later one after. A migration
// completes as the controller completes it: the Machine is on the target
// first, then the migration is Succeeded.
type completingReader struct {
	lists int
}

func (r *completingReader) Get(context.Context, client.ObjectKey, client.Object, ...client.GetOption) error {
	return nil
}

func (r *completingReader) List(_ context.Context, list client.ObjectList, _ ...client.ListOption) error {
	done := r.lists > 0
	switch l := list.(type) {
	case *kaironv1.MachineDisruptionBudgetList:
		l.Items = []kaironv1.MachineDisruptionBudget{}
		return nil
	case *kaironv1.MachineList:
		node := "source"
		if done {
			node = "target"
		}
		m := mdbMachine("default", "web-1", kaironv1.MachineRunning, mdbWebLabels)
		m.Spec.NodeName = node
		l.Items = []kaironv1.Machine{m}
	case *kaironv1.MachineMigrationList:
		phase := kaironv1.MigrationRunning
		if done {
			phase = kaironv1.MigrationSucceeded
		}
		l.Items = []kaironv1.MachineMigration{{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web-1-evac-x"},
			Spec:       kaironv1.MachineMigrationSpec{MachineName: "web-1"},
			Status:     kaironv1.MachineMigrationStatus{Phase: phase},
		}}
	}
	r.lists++
	return nil
}

// TestLoadEvacuationSnapshotOrder: a migration that completes while a
// snapshot is read never makes its Machine look like one still on the node
// with nothing moving it (which a pass would migrate a second time). The
// snapshot reads the migrations before the Machines: a migration it sees
// in flight may have moved its Machine since (then the Machine is not on
// the node), and one it sees Succeeded had moved it already.
func TestLoadEvacuationSnapshotOrder(t *testing.T) {
	snap, err := LoadEvacuationSnapshot(context.Background(), &completingReader{})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range snap.Plan(snap.MachinesOn("source")) {
		if d.Verdict == EvacuationMigrate {
			t.Errorf("the snapshot shows %s on the source node with no migration in flight (machines %v, migrations %v): a pass would migrate it again",
				d.Machine.Name, snap.Machines[0].Spec.NodeName, snap.Migrations[0].Status.Phase)
		}
	}
}
