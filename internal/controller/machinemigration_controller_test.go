package controller

import (
	"context"
	"fmt"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
)

// With no webhook in the way, an attacker creates two migrations of one
// Machine back to back. Only one may move it: the first goes on, the second
// fails with AlreadyMigrating and says which migration holds the Machine.
// Once that one ended, a new migration of the Machine starts.
func TestMachineMigrationSecondInFlightFails(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	a := createNode(t, env, ns, "a", 16, "16Gi")
	createNode(t, env, ns, "b", 16, "16Gi")
	m := createMachine(t, env, ns, "web", 1, "256Mi", func(m *kaironv1.Machine) { m.Spec.NodeName = a.Name })
	setMachinePhase(t, env, m, kaironv1.MachineRunning)

	startControllers(t, env, ns, Options{})
	migrate := func(name string) {
		t.Helper()
		if err := env.Client.Create(ctx, &kaironv1.MachineMigration{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec:       kaironv1.MachineMigrationSpec{MachineName: "web"},
		}); err != nil {
			t.Fatalf("creating %s: %v", name, err)
		}
	}
	migration := func(name string) *kaironv1.MachineMigration {
		return getObject[kaironv1.MachineMigration](t, env, ns, name)
	}
	describe := func(mig *kaironv1.MachineMigration) string {
		return fmt.Sprintf("%s: phase %q reason %q: %s", mig.Name, mig.Status.Phase, mig.Status.Reason, mig.Status.Message)
	}

	// Created in the same second, so "first" goes first by name if the
	// controller sees both Pending, and by being Running if it does not.
	migrate("first")
	migrate("second")
	eventually(t, "second to fail and first to run", func() (bool, string) {
		first, second := migration("first"), migration("second")
		ok := first.Status.Phase == kaironv1.MigrationRunning &&
			second.Status.Phase == kaironv1.MigrationFailed && second.Status.Reason == kaironv1.MigrationReasonAlreadyMigrating
		return ok, describe(first) + "; " + describe(second)
	})
	second := migration("second")
	want := `machine web already has a migration in flight: MachineMigration "first"`
	if !strings.HasPrefix(second.Status.Message, want) {
		t.Errorf("second's message %q does not start with %q", second.Status.Message, want)
	}
	if second.Status.TargetNode != "" || second.Status.StartTime != nil {
		t.Errorf("second started anyway: %s", describe(second))
	}

	// first ends (as its node agents would say); a new one may start.
	eventually(t, "first to be marked Failed by hand", func() (bool, string) {
		first := migration("first")
		first.Status.Phase = kaironv1.MigrationFailed
		first.Status.Reason = kaironv1.MigrationReasonTransferFailed
		first.Status.Message = "ended by the test"
		first.Status.CompletionTime = &metav1.Time{Time: first.CreationTimestamp.Time}
		if err := env.Client.Status().Update(ctx, first); err != nil {
			if apierrors.IsConflict(err) {
				return false, err.Error()
			}
			t.Fatal(err)
		}
		return true, ""
	})
	migrate("third")
	eventually(t, "third to run", func() (bool, string) {
		third := migration("third")
		return third.Status.Phase == kaironv1.MigrationRunning, describe(third)
	})
}

// The controller names a migration's target on the Machine before the
// migration runs (the node confinement policy lets only that node take the
// Machine over), and takes the name away once the migration ended.
func TestMachineMigrationNamesItsTargetOnTheMachine(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	a := createNode(t, env, ns, "a", 16, "16Gi")
	b := createNode(t, env, ns, "b", 16, "16Gi")
	m := createMachine(t, env, ns, "web", 1, "256Mi", func(m *kaironv1.Machine) { m.Spec.NodeName = a.Name })
	setMachinePhase(t, env, m, kaironv1.MachineRunning)
	startControllers(t, env, ns, Options{})
	if err := env.Client.Create(ctx, &kaironv1.MachineMigration{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "move"},
		Spec:       kaironv1.MachineMigrationSpec{MachineName: "web", TargetNode: b.Name},
	}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the migration to run", func() (bool, string) {
		mig := getObject[kaironv1.MachineMigration](t, env, ns, "move")
		return mig.Status.Phase == kaironv1.MigrationRunning, string(mig.Status.Phase)
	})
	// Read after the migration was seen Running: the name came first.
	if got := getMachine(t, env, ns, "web").Annotations[kaironv1.AnnotationMachineMigrationTarget]; got != b.Name {
		t.Fatalf("Running migration, Machine's %s = %q, want %q", kaironv1.AnnotationMachineMigrationTarget, got, b.Name)
	}

	eventually(t, "the migration to be marked Failed by hand", func() (bool, string) {
		mig := getObject[kaironv1.MachineMigration](t, env, ns, "move")
		mig.Status.Phase = kaironv1.MigrationFailed
		mig.Status.Reason = kaironv1.MigrationReasonTransferFailed
		mig.Status.Message = "ended by the test"
		if err := env.Client.Status().Update(ctx, mig); err != nil {
			return false, err.Error()
		}
		return true, ""
	})
	eventually(t, "the target's name to be taken off the Machine", func() (bool, string) {
		got, named := getMachine(t, env, ns, "web").Annotations[kaironv1.AnnotationMachineMigrationTarget]
		return !named, got
	})
}
