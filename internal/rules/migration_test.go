package rules

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

func TestConflictingMigration(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	mig := func(name, machine string, phase kaironv1.MigrationPhase, age int) kaironv1.MachineMigration {
		return kaironv1.MachineMigration{
			ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: name, CreationTimestamp: metav1.NewTime(t0.Add(time.Duration(age) * time.Second))},
			Spec:       kaironv1.MachineMigrationSpec{MachineName: machine},
			Status:     kaironv1.MachineMigrationStatus{Phase: phase},
		}
	}
	other := func(ns string, m kaironv1.MachineMigration) kaironv1.MachineMigration { m.Namespace = ns; return m }
	tests := []struct {
		name         string
		mig          kaironv1.MachineMigration
		existing     []kaironv1.MachineMigration
		wantConflict string // ConflictingMigration
		wantYield    string // MigrationToYieldTo
	}{
		{"none", mig("new", "web", "", 9), nil, "", ""},
		{"only ended ones", mig("new", "web", "", 9), []kaironv1.MachineMigration{
			mig("a", "web", kaironv1.MigrationSucceeded, 1), mig("b", "web", kaironv1.MigrationFailed, 2)}, "", ""},
		{"other machines and namespaces", mig("new", "web", "", 9), []kaironv1.MachineMigration{
			mig("a", "db", kaironv1.MigrationRunning, 1), other("elsewhere", mig("b", "web", kaironv1.MigrationRunning, 2))}, "", ""},
		{"itself", mig("new", "web", kaironv1.MigrationPending, 9), []kaironv1.MachineMigration{
			mig("new", "web", kaironv1.MigrationPending, 9)}, "", ""},
		{"a Running one", mig("new", "web", "", 9), []kaironv1.MachineMigration{
			mig("a", "web", kaironv1.MigrationRunning, 10)}, "a", "a"},
		{"an older Pending one", mig("new", "web", kaironv1.MigrationPending, 9), []kaironv1.MachineMigration{
			mig("a", "web", kaironv1.MigrationPending, 1)}, "a", "a"},
		{"an older one without a phase", mig("new", "web", "", 9), []kaironv1.MachineMigration{
			mig("a", "web", "", 1)}, "a", "a"},
		// The controller lets the older of two Pending ones go on.
		{"a newer Pending one", mig("old", "web", kaironv1.MigrationPending, 1), []kaironv1.MachineMigration{
			mig("new", "web", kaironv1.MigrationPending, 9)}, "new", ""},
		{"same time: by name", mig("b", "web", "", 1), []kaironv1.MachineMigration{
			mig("a", "web", "", 1), mig("c", "web", "", 1)}, "a", "a"},
		{"Running goes first whatever its age", mig("old", "web", kaironv1.MigrationPending, 1), []kaironv1.MachineMigration{
			mig("pending", "web", kaironv1.MigrationPending, 0), mig("running", "web", kaironv1.MigrationRunning, 9)}, "running", "running"},
	}
	name := func(m *kaironv1.MachineMigration) string {
		if m == nil {
			return ""
		}
		return m.Name
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := name(ConflictingMigration(&tt.mig, tt.existing)); got != tt.wantConflict {
				t.Errorf("ConflictingMigration = %q, want %q", got, tt.wantConflict)
			}
			if got := name(MigrationToYieldTo(&tt.mig, tt.existing)); got != tt.wantYield {
				t.Errorf("MigrationToYieldTo = %q, want %q", got, tt.wantYield)
			}
		})
	}
	a := mig("a", "web", "", 1)
	want := `machine web already has a migration in flight: MachineMigration "a" is Pending; wait for it to end or delete it`
	if got := ConflictingMigrationMessage("web", &a); got != want {
		t.Errorf("message:\n got %s\nwant %s", got, want)
	}
}
