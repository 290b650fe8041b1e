package ops

import (
	"context"

	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/rules"
)

// EvacuationPass is one pass of `evacuate NODE`: it reads the cluster
// (rules.LoadEvacuationSnapshot), plans over the Machines on Node
// (rules.EvacuationSnapshot.Plan), and creates the MachineMigration
// rules.NewEvacuationMigration builds for every Machine the budgets allow.
// A Machine the webhook refuses (IsMigrationRefusal) is skipped and the
// pass goes on; any other failed create ends it.
type EvacuationPass struct {
	Node     string
	Strategy kaironv1.MigrationStrategy
	// Read, if set, is told what the pass read before it acts on anything:
	// kaironctl reports from it which Machines left the node since its
	// last pass.
	Read func(snap *rules.EvacuationSnapshot, onNode []*kaironv1.Machine)
	// Acted, if set, is told each decision as soon as the pass acted on
	// it, in plan order, so a caller reports as the pass goes and a pass
	// that fails half way has reported the Machines before.
	Acted func(EvacuationOutcome)
}

// EvacuationOutcome is what a pass did with one Machine.
type EvacuationOutcome struct {
	rules.EvacuationDecision
	// Created is, for rules.EvacuationMigrate, the migration created.
	Created *kaironv1.MachineMigration
	// Refused is, for rules.EvacuationMigrate, the webhook's refusal
	// (IsMigrationRefusal): nothing was created and the Machine is skipped.
	Refused error
	// Failed is, for rules.EvacuationMigrate, a create that failed for
	// another reason; the pass ends with it as a *CreateError.
	Failed error
}

// EvacuationResult is what a whole pass saw and did.
type EvacuationResult struct {
	Snapshot *rules.EvacuationSnapshot
	// OnNode are the Machines whose spec.nodeName was Node.
	OnNode   []*kaironv1.Machine
	Outcomes []EvacuationOutcome
}

// Run makes the pass through c: the reads and the creates are whoever c
// is, so RBAC, the webhook and the admission policies judge them. It errs
// with the snapshot's read error, or with *CreateError when a create
// failed for another reason than IsMigrationRefusal.
func (p EvacuationPass) Run(ctx context.Context, c client.Client) (*EvacuationResult, error) {
	snap, err := rules.LoadEvacuationSnapshot(ctx, c)
	if err != nil {
		return nil, err
	}
	res := &EvacuationResult{Snapshot: snap, OnNode: snap.MachinesOn(p.Node)}
	if p.Read != nil {
		p.Read(snap, res.OnNode)
	}
	for _, d := range snap.Plan(res.OnNode) {
		o := EvacuationOutcome{EvacuationDecision: d}
		if d.Verdict == rules.EvacuationMigrate {
			mig := rules.NewEvacuationMigration(d.Machine, p.Node, p.Strategy)
			switch err := c.Create(ctx, mig); {
			case err == nil:
				o.Created = mig
			case IsMigrationRefusal(err):
				// The MachineMigration webhook judged again and refused:
				// the budgets were spent, or the Machine deleted, by
				// someone else since this pass read the cluster.
				o.Refused = err
			default:
				o.Failed = err
			}
		}
		res.Outcomes = append(res.Outcomes, o)
		if p.Acted != nil {
			p.Acted(o)
		}
		if o.Failed != nil {
			return nil, &CreateError{Machine: d.Machine, Err: o.Failed}
		}
	}
	return res, nil
}
