package rules

import (
	"context"
	"errors"
	"fmt"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// This file is the one place that decides whether disrupting a Machine
// (migrating it away from its node) is allowed by the MachineDisruptionBudgets
// that select it. LoadBudgetStates serves the budget status reconciler,
// `kaironctl describe budget`, the MachineMigration admission webhook and
// kairon-ui's budgets page. Evacuation (kaironctl evacuate and migrate,
// cordon-triggered evacuation, kairon-ui's evacuate) reads its snapshot
// with LoadEvacuationSnapshot (evacuation.go), which reads the migrations
// before the Machines and then runs the same ComputeBudgetStates. None of
// them has its own copy of the arithmetic.
//
// The numbers follow Kubernetes' PodDisruptionBudget:
//
//	expected           = Machines, in any namespace, whose labels carry every
//	                     key=value of spec.selector
//	currentHealthy     = of those, Machines with status.phase Running that are
//	                     not the target of a non-terminal MachineMigration
//	                     and not on a node whose agent is unreachable
//	desiredHealthy     = minAvailable, or expected - maxUnavailable, where a
//	                     percentage is of expected and rounded up
//	disruptionsAllowed = max(0, currentHealthy - desiredHealthy)

// Reasons a matching Machine is not healthy, as BudgetMachine.Reason says them
// (the phase reason has the phase in it: "status.phase is Booting, not Running").
const (
	UnhealthyMigrationInFlight = "non-terminal MachineMigration in flight"
	// UnhealthyNodeUnreachable: its node's agent stopped renewing its
	// Lease (MachineNodeReachable), so nobody knows whether it runs.
	UnhealthyNodeUnreachable = "its node's agent is unreachable"
)

// BudgetState is one MachineDisruptionBudget evaluated against the Machines
// and MachineMigrations of the whole cluster at one moment.
type BudgetState struct {
	// Budget is the object evaluated, as read (it points into the slice
	// ComputeBudgetStates was given).
	Budget *kaironv1.MachineDisruptionBudget
	// Namespace and Name identify the budget.
	Namespace, Name string
	// Generation is the budget's metadata.generation the state was
	// computed from.
	Generation int64
	// Selector is the budget's spec.selector; empty matches every Machine.
	Selector map[string]string

	// ExpectedMachines counts the Machines the selector matches.
	ExpectedMachines int32
	// CurrentHealthy counts the matching Machines that are healthy.
	CurrentHealthy int32
	// DesiredHealthy is the fewest healthy Machines the budget accepts.
	DesiredHealthy int32
	// DisruptionsAllowed is max(0, CurrentHealthy-DesiredHealthy).
	DisruptionsAllowed int32

	// Machines are the matching Machines, sorted by namespace and name.
	Machines []BudgetMachine

	// Err is set when the budget's spec is invalid (both or neither of
	// minAvailable and maxUnavailable, or a malformed value). Such a budget
	// blocks every disruption of the Machines it matches: DesiredHealthy is
	// then ExpectedMachines and DisruptionsAllowed 0.
	Err error
}

// Key is "namespace/name", how messages name the budget.
func (s *BudgetState) Key() string { return s.Namespace + "/" + s.Name }

// Matches reports whether the budget selects m.
func (s *BudgetState) Matches(m *kaironv1.Machine) bool {
	return selectorMatches(s.Selector, m.Labels)
}

// BudgetMachine is one Machine a budget matches, and whether it counts as
// healthy.
type BudgetMachine struct {
	Namespace, Name string
	Phase           kaironv1.MachinePhase
	Healthy         bool
	// Migration names the non-terminal MachineMigration targeting the
	// Machine, if there is one.
	Migration string
	// Reason says why the Machine is not healthy; empty when it is.
	Reason string
}

// LoadBudgetStates reads every MachineDisruptionBudget, Machine and
// MachineMigration in the cluster through reader and evaluates every budget.
// The states are sorted by namespace and name. Errors are only failures to
// list; an invalid budget is a state with Err set.
func LoadBudgetStates(ctx context.Context, reader client.Reader) ([]BudgetState, error) {
	var budgets kaironv1.MachineDisruptionBudgetList
	if err := reader.List(ctx, &budgets); err != nil {
		return nil, fmt.Errorf("listing machinedisruptionbudgets: %w", err)
	}
	if len(budgets.Items) == 0 {
		// Nothing to evaluate: spare listing every Machine.
		return nil, nil
	}
	// Machines before migrations, the order that errs towards refusing: a
	// migration created between the two lists still counts against its
	// Machine. (Evacuation reads the other way round, for its own reason.)
	var machines kaironv1.MachineList
	if err := reader.List(ctx, &machines); err != nil {
		return nil, fmt.Errorf("listing machines: %w", err)
	}
	var migrations kaironv1.MachineMigrationList
	if err := reader.List(ctx, &migrations); err != nil {
		return nil, fmt.Errorf("listing machinemigrations: %w", err)
	}
	return ComputeBudgetStates(budgets.Items, machines.Items, migrations.Items), nil
}

// FindBudgetState returns the state of budget namespace/name, or nil.
func FindBudgetState(states []BudgetState, namespace, name string) *BudgetState {
	for i := range states {
		if states[i].Namespace == namespace && states[i].Name == name {
			return &states[i]
		}
	}
	return nil
}

// ComputeBudgetStates is LoadBudgetStates on objects already read.
func ComputeBudgetStates(budgets []kaironv1.MachineDisruptionBudget, machines []kaironv1.Machine, migrations []kaironv1.MachineMigration) []BudgetState {
	// The Machines a non-terminal migration targets, by namespace/name.
	inFlight := map[string]string{}
	for i := range migrations {
		mig := &migrations[i]
		if mig.Spec.MachineName == "" || !migrationInFlight(mig) {
			continue
		}
		key := mig.Namespace + "/" + mig.Spec.MachineName
		// Several in flight for one Machine: name the first, stably.
		if cur, ok := inFlight[key]; !ok || mig.Name < cur {
			inFlight[key] = mig.Name
		}
	}

	sorted := make([]*kaironv1.Machine, len(machines))
	for i := range machines {
		sorted[i] = &machines[i]
	}
	sort.Slice(sorted, func(i, j int) bool {
		if sorted[i].Namespace != sorted[j].Namespace {
			return sorted[i].Namespace < sorted[j].Namespace
		}
		return sorted[i].Name < sorted[j].Name
	})

	states := make([]BudgetState, 0, len(budgets))
	for i := range budgets {
		b := &budgets[i]
		s := BudgetState{Budget: b, Namespace: b.Namespace, Name: b.Name, Generation: b.Generation, Selector: b.Spec.Selector}
		for _, m := range sorted {
			if !selectorMatches(b.Spec.Selector, m.Labels) {
				continue
			}
			bm := machineHealth(m, inFlight[m.Namespace+"/"+m.Name])
			s.ExpectedMachines++
			if bm.Healthy {
				s.CurrentHealthy++
			}
			s.Machines = append(s.Machines, bm)
		}
		desired, err := DesiredHealthy(&b.Spec, s.ExpectedMachines)
		if err != nil {
			s.Err = err
			desired = s.ExpectedMachines
		}
		s.DesiredHealthy = desired
		s.DisruptionsAllowed = max(0, s.CurrentHealthy-desired)
		if s.Err != nil {
			s.DisruptionsAllowed = 0
		}
		states = append(states, s)
	}
	sort.Slice(states, func(i, j int) bool { return states[i].Key() < states[j].Key() })
	return states
}

// migrationInFlight is true for a migration that is Pending or Running. A
// migration nobody has given a phase yet has just been created and is
// Pending in all but name.
func migrationInFlight(mig *kaironv1.MachineMigration) bool {
	return !mig.Status.Phase.IsTerminal()
}

func machineHealth(m *kaironv1.Machine, migration string) BudgetMachine {
	bm := BudgetMachine{Namespace: m.Namespace, Name: m.Name, Phase: m.Status.Phase, Migration: migration}
	var why []string
	if m.Status.Phase != kaironv1.MachineRunning {
		why = append(why, phaseNotRunning(m.Status.Phase))
	}
	if !MachineNodeReachable(m) {
		why = append(why, UnhealthyNodeUnreachable)
	}
	if migration != "" {
		why = append(why, UnhealthyMigrationInFlight)
	}
	bm.Healthy = len(why) == 0
	bm.Reason = strings.Join(why, "; ")
	return bm
}

func phaseNotRunning(phase kaironv1.MachinePhase) string {
	if phase == "" {
		return "status.phase is not set yet, not Running"
	}
	return fmt.Sprintf("status.phase is %s, not Running", phase)
}

// selectorMatches is true when labels carry every key=value of selector.
// An empty selector matches everything.
func selectorMatches(selector, labels map[string]string) bool {
	for k, v := range selector {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// DesiredHealthy is the fewest healthy Machines a budget with spec accepts
// when expected Machines match it. Exactly one of minAvailable and
// maxUnavailable must be set, each an integer (also as a string of digits)
// or a percentage from 0% to 100% of expected, rounded up:
//
//	minAvailable N     -> N
//	minAvailable P%    -> ceil(P*expected/100)
//	maxUnavailable N   -> max(0, expected-N)
//	maxUnavailable P%  -> expected - ceil(P*expected/100)
func DesiredHealthy(spec *kaironv1.MachineDisruptionBudgetSpec, expected int32) (int32, error) {
	switch {
	case spec.MinAvailable != nil && spec.MaxUnavailable != nil:
		return 0, errors.New("both spec.minAvailable and spec.maxUnavailable are set; set exactly one")
	case spec.MinAvailable == nil && spec.MaxUnavailable == nil:
		return 0, errors.New("neither spec.minAvailable nor spec.maxUnavailable is set; set exactly one")
	case spec.MinAvailable != nil:
		n, err := ScaledBudgetValue(*spec.MinAvailable, expected)
		if err != nil {
			return 0, fmt.Errorf("spec.minAvailable: %w", err)
		}
		return n, nil
	default:
		n, err := ScaledBudgetValue(*spec.MaxUnavailable, expected)
		if err != nil {
			return 0, fmt.Errorf("spec.maxUnavailable: %w", err)
		}
		return max(0, expected-n), nil
	}
}

var (
	budgetInteger = regexp.MustCompile(`^[0-9]+$`)
	budgetPercent = regexp.MustCompile(`^([0-9]|[1-9][0-9]|100)%$`)
)

// ParseBudgetValue checks a minAvailable/maxUnavailable value as the API
// server does: a non-negative integer, or a percentage from 0% to 100%. A
// string of digits becomes an integer.
func ParseBudgetValue(s string) (intstr.IntOrString, error) {
	switch {
	case budgetInteger.MatchString(s):
		n, err := strconv.ParseInt(s, 10, 32)
		if err != nil {
			return intstr.IntOrString{}, fmt.Errorf("%q is too large (at most %d)", s, math.MaxInt32)
		}
		return intstr.FromInt32(int32(n)), nil
	case budgetPercent.MatchString(s):
		return intstr.FromString(s), nil
	}
	return intstr.IntOrString{}, fmt.Errorf("%q is not a non-negative integer (e.g. 2) or a percentage from 0%% to 100%% (e.g. 25%%)", s)
}

// ScaledBudgetValue is v as a number of Machines out of expected: an integer
// as it is, a percentage of expected rounded up.
func ScaledBudgetValue(v intstr.IntOrString, expected int32) (int32, error) {
	if v.Type == intstr.Int {
		if v.IntVal < 0 {
			return 0, fmt.Errorf("%d is negative", v.IntVal)
		}
		return v.IntVal, nil
	}
	if budgetInteger.MatchString(v.StrVal) {
		parsed, err := ParseBudgetValue(v.StrVal)
		if err != nil {
			return 0, err
		}
		return parsed.IntVal, nil
	}
	if !budgetPercent.MatchString(v.StrVal) {
		return 0, fmt.Errorf("%q is not a non-negative integer or a percentage from 0%% to 100%%", v.StrVal)
	}
	p, _ := strconv.ParseInt(strings.TrimSuffix(v.StrVal, "%"), 10, 64)
	// ceil(p*expected/100) in integers; p <= 100 and expected fits in int32.
	return int32((p*int64(expected) + 99) / 100), nil
}

// AdmitDisruption says whether the budgets in states allow disrupting m right
// now: it does not when, for any budget that matches m, currentHealthy -
// desiredHealthy <= 0, or the budget is invalid. A Machine no budget matches
// is never blocked. The reason names every blocking budget with its numbers,
// e.g.
//
//	budget default/web-tier allows no more disruptions (2 healthy, 2 desired, 0 allowed)
//
// It does not spend anything; use a DisruptionPass to disrupt several
// Machines in a row.
func AdmitDisruption(states []BudgetState, m *kaironv1.Machine) (ok bool, reason string) {
	return NewDisruptionPass(states).check(m)
}

// DisruptionPass decides for several Machines in a row, as one evacuation
// pass does: every Machine it admits spends one allowance from every budget
// that matches it, for the rest of the pass. Nothing is persisted; a new
// pass starts from freshly loaded states.
type DisruptionPass struct {
	states []BudgetState
	// spent is how many disruptions this pass admitted, per state index.
	spent []int32
}

// NewDisruptionPass starts a pass over states, which it does not modify.
func NewDisruptionPass(states []BudgetState) *DisruptionPass {
	return &DisruptionPass{states: states, spent: make([]int32, len(states))}
}

// Admit is AdmitDisruption counting what this pass already admitted; when
// it admits m, it spends one allowance from every budget matching m.
func (p *DisruptionPass) Admit(m *kaironv1.Machine) (ok bool, reason string) {
	if ok, reason = p.check(m); !ok {
		return false, reason
	}
	for i := range p.states {
		if p.states[i].Matches(m) {
			p.spent[i]++
		}
	}
	return true, ""
}

// Remaining is how many more disruptions the budget namespace/name allows
// in this pass, and false when the pass has no such budget.
func (p *DisruptionPass) Remaining(namespace, name string) (int32, bool) {
	for i := range p.states {
		if s := &p.states[i]; s.Namespace == namespace && s.Name == name {
			if s.Err != nil {
				return 0, true
			}
			return max(0, s.CurrentHealthy-s.DesiredHealthy-p.spent[i]), true
		}
	}
	return 0, false
}

func (p *DisruptionPass) check(m *kaironv1.Machine) (bool, string) {
	var blocked []string
	for i := range p.states {
		s := &p.states[i]
		if !s.Matches(m) {
			continue
		}
		if s.Err != nil {
			blocked = append(blocked, fmt.Sprintf("budget %s is invalid and blocks every disruption: %v", s.Key(), s.Err))
			continue
		}
		if left := s.CurrentHealthy - s.DesiredHealthy - p.spent[i]; left > 0 {
			continue
		}
		numbers := fmt.Sprintf("%d healthy, %d desired, %d allowed", s.CurrentHealthy, s.DesiredHealthy, max(0, s.CurrentHealthy-s.DesiredHealthy-p.spent[i]))
		if p.spent[i] > 0 {
			numbers += fmt.Sprintf("; %d already spent in this pass", p.spent[i])
		}
		blocked = append(blocked, fmt.Sprintf("budget %s allows no more disruptions (%s)", s.Key(), numbers))
	}
	if len(blocked) > 0 {
		return false, strings.Join(blocked, "; ")
	}
	return true, ""
}

// BudgetSummary is "3 matching, 2 healthy, 2 desired healthy, 0
// disruptions allowed".
func BudgetSummary(s *BudgetState) string {
	return fmt.Sprintf("%d matching, %d healthy, %d desired healthy, %d disruptions allowed",
		s.ExpectedMachines, s.CurrentHealthy, s.DesiredHealthy, s.DisruptionsAllowed)
}
