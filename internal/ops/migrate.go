package ops

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/rules"
)

// Migration is what a user asks to migrate: one Machine, a strategy, and
// a target node ("" for the scheduler's choice).
type Migration struct {
	Namespace  string
	Machine    string
	Strategy   kaironv1.MigrationStrategy
	TargetNode string
}

// StartedMigration is a MachineMigration StartMigration created.
type StartedMigration struct {
	// Migration is the created object, its generated name filled in.
	Migration *kaironv1.MachineMigration
	// SourceNode is where the Machine ran when the migration was created.
	SourceNode string
}

// NotMigratedCause is why StartMigration created no migration although it
// could read everything it needed.
type NotMigratedCause string

const (
	// NotOnNode: the Machine is not bound to a node yet.
	NotOnNode NotMigratedCause = "NotOnNode"
	// AlreadyOnTarget: the Machine runs on the target node asked for.
	AlreadyOnTarget NotMigratedCause = "AlreadyOnTarget"
	// Deleting: the Machine is being deleted.
	Deleting NotMigratedCause = "Deleting"
	// InFlight: a migration already moves the Machine (Migration names it).
	InFlight NotMigratedCause = "InFlight"
	// Blocked: a budget does not allow disrupting the Machine now (Reason
	// names the budgets and their numbers).
	Blocked NotMigratedCause = "Blocked"
	// Refused: the MachineMigration webhook refused the create because the
	// cluster moved on since the plan read it (IsMigrationRefusal); Err is
	// its answer.
	Refused NotMigratedCause = "Refused"
)

// NotMigrated is StartMigration declining, or the webhook refusing, one
// Machine's migration: not a failure of the cluster, and each caller words
// it its own way.
type NotMigrated struct {
	Cause   NotMigratedCause
	Machine *kaironv1.Machine
	// Migration is, for InFlight, the migration already moving it.
	Migration *kaironv1.MachineMigration
	// Reason is, for Blocked, the budgets' reason.
	Reason string
	// Err is, for Refused, the API server's answer.
	Err error
}

func (e *NotMigrated) Error() string {
	if e.Err != nil {
		return e.Err.Error()
	}
	return string(e.Cause) + ": " + e.Machine.Namespace + "/" + e.Machine.Name
}

func (e *NotMigrated) Unwrap() error { return e.Err }

// MachineLookupError is StartMigration failing to read the Machine; its
// text and status are the API server's.
type MachineLookupError struct{ Err error }

func (e *MachineLookupError) Error() string { return e.Err.Error() }
func (e *MachineLookupError) Unwrap() error { return e.Err }

// CreateError is the create of a Machine's migration failing for another
// reason than IsMigrationRefusal; its text and status are the API
// server's.
type CreateError struct {
	Machine *kaironv1.Machine
	Err     error
}

func (e *CreateError) Error() string { return e.Err.Error() }
func (e *CreateError) Unwrap() error { return e.Err }

// StartMigration is `migrate MACHINE`: it reads the Machine, asks the
// budgets with the shared evacuation plan (rules.EvacuationSnapshot.Plan),
// and creates the MachineMigration (named MACHINE-mig-XXXXX) through c, so
// RBAC and the MachineMigration webhook judge as whoever c is. It errs
// with *MachineLookupError, *NotMigrated or *CreateError, or with the
// plan's read error. Following the migration is the caller's.
func StartMigration(ctx context.Context, c client.Client, req Migration) (*StartedMigration, error) {
	m := &kaironv1.Machine{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: req.Namespace, Name: req.Machine}, m); err != nil {
		return nil, &MachineLookupError{Err: err}
	}
	if m.Spec.NodeName == "" {
		return nil, &NotMigrated{Cause: NotOnNode, Machine: m}
	}
	if req.TargetNode != "" && req.TargetNode == m.Spec.NodeName {
		return nil, &NotMigrated{Cause: AlreadyOnTarget, Machine: m}
	}
	snap, err := rules.LoadEvacuationSnapshot(ctx, c)
	if err != nil {
		return nil, err
	}
	switch d := snap.Plan([]*kaironv1.Machine{m})[0]; d.Verdict {
	case rules.EvacuationDeleting:
		return nil, &NotMigrated{Cause: Deleting, Machine: m}
	case rules.EvacuationInFlight:
		return nil, &NotMigrated{Cause: InFlight, Machine: m, Migration: d.Migration}
	case rules.EvacuationBlocked:
		return nil, &NotMigrated{Cause: Blocked, Machine: m, Reason: d.Reason}
	}
	mig := &kaironv1.MachineMigration{
		ObjectMeta: metav1.ObjectMeta{Namespace: req.Namespace, GenerateName: req.Machine + "-mig-"},
		Spec:       kaironv1.MachineMigrationSpec{MachineName: req.Machine, Strategy: req.Strategy, TargetNode: req.TargetNode},
	}
	if err := c.Create(ctx, mig); err != nil {
		if IsMigrationRefusal(err) {
			return nil, &NotMigrated{Cause: Refused, Machine: m, Err: err}
		}
		return nil, &CreateError{Machine: m, Err: err}
	}
	return &StartedMigration{Migration: mig, SourceNode: m.Spec.NodeName}, nil
}
