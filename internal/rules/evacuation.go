package rules

import (
	"context"
	"fmt"
	"sort"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// This file is what `kaironctl evacuate` and cordon-triggered evacuation
// share: which Machines of a node one evacuation pass migrates, which it
// leaves alone and why, and the MachineMigration it creates. The budget
// decisions are DisruptionPass's (disruption.go); nothing here counts
// budgets itself.

// EvacuationVerdict is what one evacuation pass does with one Machine.
type EvacuationVerdict string

const (
	// EvacuationMigrate: the budgets allow it; create a MachineMigration.
	// The pass has already spent the allowance.
	EvacuationMigrate EvacuationVerdict = "Migrate"
	// EvacuationInFlight: a MachineMigration that is Pending, Running or
	// has no phase yet already targets the Machine; never create another.
	EvacuationInFlight EvacuationVerdict = "InFlight"
	// EvacuationBlocked: a budget does not allow disrupting the Machine now.
	EvacuationBlocked EvacuationVerdict = "Blocked"
	// EvacuationDeleting: the Machine is being deleted and leaves the node
	// without being moved.
	EvacuationDeleting EvacuationVerdict = "Deleting"
)

// EvacuationDecision is a pass's verdict on one Machine.
type EvacuationDecision struct {
	Machine *kaironv1.Machine
	Verdict EvacuationVerdict
	// Migration is, for EvacuationInFlight, the non-terminal migration
	// already moving the Machine (the first by name when there are several).
	Migration *kaironv1.MachineMigration
	// Reason is, for EvacuationBlocked, AdmitDisruption's reason: every
	// blocking budget with its numbers.
	Reason string
	// Budgets are, for EvacuationBlocked, the blocking budgets as
	// "namespace/name", sorted.
	Budgets []string
}

// EvacuationSnapshot is the cluster as one evacuation pass sees it: every
// Machine, MachineMigration and budget, read together, and the budgets
// evaluated on exactly those Machines and migrations with
// ComputeBudgetStates (what LoadBudgetStates does), so the budget numbers
// and the in-flight migrations a pass skips agree.
type EvacuationSnapshot struct {
	Budgets    []BudgetState
	Machines   []kaironv1.Machine
	Migrations []kaironv1.MachineMigration
}

// LoadEvacuationSnapshot reads the snapshot through reader. Decisions
// should use a reader that goes to the API server, not a cache: a cache
// that lags does not show the migrations a previous pass just created.
//
// The migrations are read before the Machines. The lists are not one
// read, and a migration completes with its Machine moved first and the
// migration Succeeded after: read the other way round, a migration that
// completed between the two lists showed its Machine still on the node
// and nothing moving it, and a pass migrated it a second time.
func LoadEvacuationSnapshot(ctx context.Context, reader client.Reader) (*EvacuationSnapshot, error) {
	var budgets kaironv1.MachineDisruptionBudgetList
	if err := reader.List(ctx, &budgets); err != nil {
		return nil, fmt.Errorf("listing machinedisruptionbudgets: %w", err)
	}
	var migrations kaironv1.MachineMigrationList
	if err := reader.List(ctx, &migrations); err != nil {
		return nil, fmt.Errorf("listing machinemigrations: %w", err)
	}
	var machines kaironv1.MachineList
	if err := reader.List(ctx, &machines); err != nil {
		return nil, fmt.Errorf("listing machines: %w", err)
	}
	return &EvacuationSnapshot{
		Budgets:    ComputeBudgetStates(budgets.Items, machines.Items, migrations.Items),
		Machines:   machines.Items,
		Migrations: migrations.Items,
	}, nil
}

// MachinesOn returns the Machines whose spec.nodeName is node, in every
// namespace, sorted by namespace and name.
func (s *EvacuationSnapshot) MachinesOn(node string) []*kaironv1.Machine {
	var out []*kaironv1.Machine
	for i := range s.Machines {
		if s.Machines[i].Spec.NodeName == node {
			out = append(out, &s.Machines[i])
		}
	}
	sortEvacuationMachines(out)
	return out
}

// Plan is PlanEvacuation on the snapshot's budgets and migrations.
func (s *EvacuationSnapshot) Plan(machines []*kaironv1.Machine) []EvacuationDecision {
	return PlanEvacuation(s.Budgets, machines, s.Migrations)
}

// PlanEvacuation decides, in order, what one evacuation pass does with each
// of machines (the Machines of the node or nodes being evacuated that the
// caller wants considered now), given the budget states and every
// MachineMigration in the cluster:
//
//   - a Machine being deleted is left to go (EvacuationDeleting);
//   - a Machine with a non-terminal migration is skipped, never given a
//     second one (EvacuationInFlight); that migration already counts
//     against its budgets;
//   - every other Machine goes through one DisruptionPass: admitted
//     (EvacuationMigrate, spending one allowance of every budget matching
//     it for the rest of the plan) or blocked with the pass's reason.
func PlanEvacuation(states []BudgetState, machines []*kaironv1.Machine, migrations []kaironv1.MachineMigration) []EvacuationDecision {
	inFlight := inFlightMigrations(migrations)
	pass := NewDisruptionPass(states)
	out := make([]EvacuationDecision, 0, len(machines))
	for _, m := range machines {
		d := EvacuationDecision{Machine: m}
		switch {
		case m.DeletionTimestamp != nil:
			d.Verdict = EvacuationDeleting
		case inFlight[m.Namespace+"/"+m.Name] != nil:
			d.Verdict = EvacuationInFlight
			d.Migration = inFlight[m.Namespace+"/"+m.Name]
		default:
			ok, reason := pass.Admit(m)
			if ok {
				d.Verdict = EvacuationMigrate
				break
			}
			d.Verdict, d.Reason = EvacuationBlocked, reason
			for i := range states {
				if !states[i].Matches(m) {
					continue
				}
				if left, _ := pass.Remaining(states[i].Namespace, states[i].Name); left <= 0 {
					d.Budgets = append(d.Budgets, states[i].Key())
				}
			}
		}
		out = append(out, d)
	}
	return out
}

// inFlightMigrations indexes the non-terminal migrations by the
// "namespace/name" of their Machine; of several, the first by name.
func inFlightMigrations(migrations []kaironv1.MachineMigration) map[string]*kaironv1.MachineMigration {
	out := map[string]*kaironv1.MachineMigration{}
	for i := range migrations {
		mig := &migrations[i]
		if mig.Spec.MachineName == "" || !migrationInFlight(mig) {
			continue
		}
		key := mig.Namespace + "/" + mig.Spec.MachineName
		if cur := out[key]; cur == nil || mig.Name < cur.Name {
			out[key] = mig
		}
	}
	return out
}

// NewEvacuationMigration is the MachineMigration evacuation creates to move
// m off node: in m's namespace, named <machine>-evac-<random> by the API
// server, labeled with the node it evacuates. The target node is left to
// the scheduler.
func NewEvacuationMigration(m *kaironv1.Machine, node string, strategy kaironv1.MigrationStrategy) *kaironv1.MachineMigration {
	mig := &kaironv1.MachineMigration{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:    m.Namespace,
			GenerateName: m.Name + "-evac-",
		},
		Spec: kaironv1.MachineMigrationSpec{MachineName: m.Name, Strategy: strategy},
	}
	// A node name can be longer than a label value may be; such a
	// migration goes without the label rather than not at all.
	if len(validation.IsValidLabelValue(node)) == 0 {
		mig.Labels = map[string]string{kaironv1.LabelEvacuatedNode: node}
	}
	return mig
}

// MigrationInFlight reports whether mig still counts as moving its Machine:
// Pending, Running, or not given a phase yet.
func MigrationInFlight(mig *kaironv1.MachineMigration) bool { return migrationInFlight(mig) }

func sortEvacuationMachines(ms []*kaironv1.Machine) {
	sort.Slice(ms, func(i, j int) bool {
		if ms[i].Namespace != ms[j].Namespace {
			return ms[i].Namespace < ms[j].Namespace
		}
		return ms[i].Name < ms[j].Name
	})
}
