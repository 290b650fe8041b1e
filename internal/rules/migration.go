package rules

import (
	"fmt"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// ConflictingMigration returns another migration among migrations that
// moves the same Machine as mig and is in flight (not Succeeded or Failed),
// or nil if there is none. Only one migration of a Machine may be in
// flight: two would each pick a target and have the node agents move the
// same VM twice at once. The MachineMigration webhook refuses to create mig
// when there is one; kaironctl can ask the same before it creates one.
// Of several it returns the one that goes first (see MigrationToYieldTo).
//
// mig itself (by name) is never its own conflict; migrations of other
// namespaces are ignored.
func ConflictingMigration(mig *kaironv1.MachineMigration, migrations []kaironv1.MachineMigration) *kaironv1.MachineMigration {
	return otherInFlight(mig, migrations, func(*kaironv1.MachineMigration) bool { return true })
}

// MigrationToYieldTo is what the controller asks before it starts the
// Pending migration mig: another in-flight migration of the same Machine
// that goes first, or nil. Of two that both got in (at the same moment, or
// with no webhook installed) the one already Running goes first, else the
// older (by creation time, then name), so whichever is reconciled first,
// the same one goes on and the other fails.
func MigrationToYieldTo(mig *kaironv1.MachineMigration, migrations []kaironv1.MachineMigration) *kaironv1.MachineMigration {
	return otherInFlight(mig, migrations, func(other *kaironv1.MachineMigration) bool { return goesFirst(other, mig) })
}

// otherInFlight is the first, by goesFirst, of the in-flight migrations of
// mig's Machine other than mig that counts says count.
func otherInFlight(mig *kaironv1.MachineMigration, migrations []kaironv1.MachineMigration, counts func(*kaironv1.MachineMigration) bool) *kaironv1.MachineMigration {
	var found *kaironv1.MachineMigration
	for i := range migrations {
		other := &migrations[i]
		if other.Namespace != mig.Namespace || other.Spec.MachineName != mig.Spec.MachineName ||
			(mig.Name != "" && other.Name == mig.Name) || !MigrationInFlight(other) || !counts(other) {
			continue
		}
		if found == nil || goesFirst(other, found) {
			found = other
		}
	}
	return found
}

// goesFirst orders in-flight migrations of one Machine: Running before
// Pending, then older before newer, then by name.
func goesFirst(a, b *kaironv1.MachineMigration) bool {
	aRunning, bRunning := a.Status.Phase == kaironv1.MigrationRunning, b.Status.Phase == kaironv1.MigrationRunning
	if aRunning != bRunning {
		return aRunning
	}
	if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
		return a.CreationTimestamp.Before(&b.CreationTimestamp)
	}
	return a.Name < b.Name
}

// ConflictingMigrationMessage says why a migration of machine cannot go on
// while other is in flight, e.g.
//
//	machine web-1 already has a migration in flight: MachineMigration "web-1-evac-x2" is Running; wait for it to end or delete it
func ConflictingMigrationMessage(machine string, other *kaironv1.MachineMigration) string {
	phase := other.Status.Phase
	if phase == "" {
		phase = kaironv1.MigrationPending
	}
	return fmt.Sprintf("machine %s already has a migration in flight: MachineMigration %q is %s; wait for it to end or delete it",
		machine, other.Name, phase)
}
