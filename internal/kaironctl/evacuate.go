package kaironctl

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/ops"
	"github.com/zyvor/kairon/internal/rules"
)

// Defaults of evacuate's flags.
const (
	defaultEvacuateTimeout      = 15 * time.Minute
	defaultEvacuatePollInterval = 10 * time.Second
)

type evacuateFlags struct {
	wait         bool
	timeout      time.Duration
	pollInterval time.Duration
	strategy     string
}

func newEvacuateCommand(o *Options) *cobra.Command {
	f := &evacuateFlags{}
	cmd := &cobra.Command{
		Use:   "evacuate NODE [--wait] [--timeout 15m] [--poll-interval 10s] [--strategy cold|live]",
		Short: "Move every Machine off a node, within the disruption budgets",
		Long: `Create a MachineMigration for every Machine whose spec.nodeName is NODE, in
every namespace, as far as the MachineDisruptionBudgets allow.

One pass looks at each Machine on the node, in namespace/name order:

  - a Machine that already has a MachineMigration in flight (Pending,
    Running, or not started yet) keeps it; evacuate never creates a second;
  - a Machine the budgets allow to be disrupted gets a migration named
    MACHINE-evac-XXXXX, labeled kairon.zyvor.dev/evacuated-node=NODE, and
    uses up one allowance of every budget matching it for the rest of the
    pass;
  - a Machine a budget holds back is skipped, with the budget and its
    numbers: machine NS/NAME skipped: budget NS/BUDGET allows no more
    disruptions (2 healthy, 2 desired, 0 allowed).

Without --wait, evacuate makes one pass and exits non-zero if it skipped any
Machine; run it again once migrations have finished. With --wait it runs a
pass every --poll-interval until no Machine has spec.nodeName NODE any more,
printing what moved and what waits on which budget, and exits non-zero only
when --timeout passes first.

evacuate only creates the migrations; moving the Machines is up to the node
agents. It does not cordon the node: cordon it first (kubectl cordon NODE) so
the scheduler places nothing new there.`,
		Example: `  kubectl cordon node-3
  kaironctl evacuate node-3
  kaironctl evacuate node-3 --wait --timeout 30m
  kaironctl evacuate node-3 --strategy live`,
		RunE: func(cmd *cobra.Command, args []string) error {
			node, err := oneArg(cmd, "evacuate", "NODE", args)
			if err != nil {
				return err
			}
			strategy, err := f.check(cmd)
			if err != nil {
				return err
			}
			return o.runEvacuate(cmd.Context(), node, strategy, f)
		},
	}
	fl := cmd.Flags()
	fl.BoolVar(&f.wait, "wait", false, "Keep making passes until the node has no Machines, or --timeout passes")
	fl.DurationVar(&f.timeout, "timeout", defaultEvacuateTimeout, "With --wait: give up, and exit non-zero, after this long")
	fl.DurationVar(&f.pollInterval, "poll-interval", defaultEvacuatePollInterval, "With --wait: time between two passes")
	fl.StringVar(&f.strategy, "strategy", string(kaironv1.MigrationCold), "How the migrations move the Machines: cold or live")
	// As typed, not pflag's "15m0s" and "10s".
	fl.Lookup("timeout").DefValue = "15m"
	fl.Lookup("poll-interval").DefValue = "10s"
	return cmd
}

// check checks the flags before anything talks to the API server.
func (f *evacuateFlags) check(cmd *cobra.Command) (kaironv1.MigrationStrategy, error) {
	strategy, ok := ops.ParseStrategy(f.strategy)
	if !ok {
		return "", usageError(cmd, "invalid --strategy %q: use cold or live", f.strategy)
	}
	if !f.wait {
		for _, name := range []string{"timeout", "poll-interval"} {
			if cmd.Flags().Changed(name) {
				return "", usageError(cmd, "--%s only applies with --wait", name)
			}
		}
		return strategy, nil
	}
	if f.timeout <= 0 {
		return "", usageError(cmd, "--timeout must be positive, got %s", f.timeout)
	}
	if f.pollInterval <= 0 {
		return "", usageError(cmd, "--poll-interval must be positive, got %s", f.pollInterval)
	}
	return strategy, nil
}

// evacuation is one run of kaironctl evacuate: its passes and what they saw.
type evacuation struct {
	o        *Options
	c        client.WithWatch
	node     string
	strategy kaironv1.MigrationStrategy
	wait     bool
	poll     time.Duration

	// What --wait remembers between passes, by Machine UID.
	seen      map[types.UID]machineKey // every Machine seen on the node
	gone      map[types.UID]bool       // those that left it
	migration map[types.UID]machineKey // the migration last seen moving it
	reported  map[types.UID]string     // the last line printed about it
}

type machineKey struct{ namespace, name string }

func (k machineKey) String() string { return k.namespace + "/" + k.name }

// passResult is what one pass did.
type passResult struct {
	onNode   int
	created  int
	inFlight int
	skipped  int
	// alreadyMigrating are the Machines skipped because a migration of
	// theirs is in flight.
	alreadyMigrating []machineKey
	deleting         int
	// waiting are the Machines the pass skipped, with the budgets in the
	// way or, refused by the API server, its message.
	waiting []waitingMachine
	// migrating are Machines on the node with a migration in flight.
	migrating []waitingMachine
}

type waitingMachine struct {
	machine machineKey
	// why is the skip reason, or the in-flight migration and its phase.
	why string
	// budgets block it (empty for an admission refusal or a migration).
	budgets []string
}

func (o *Options) runEvacuate(ctx context.Context, node string, strategy kaironv1.MigrationStrategy, f *evacuateFlags) error {
	c, err := o.Client()
	if err != nil {
		return err
	}
	e := &evacuation{
		o: o, c: c, node: node, strategy: strategy, wait: f.wait, poll: f.pollInterval,
		seen: map[types.UID]machineKey{}, gone: map[types.UID]bool{},
		migration: map[types.UID]machineKey{}, reported: map[types.UID]string{},
	}
	if err := e.checkNode(ctx); err != nil {
		return err
	}
	if !f.wait {
		return e.once(ctx)
	}
	return e.untilEmpty(ctx, f.timeout)
}

// checkNode refuses a node nobody knows: neither a Node of that name nor a
// Machine naming it. A Node that is gone while Machines still name it is
// evacuated all the same, with a note.
func (e *evacuation) checkNode(ctx context.Context) error {
	var n corev1.Node
	err := e.c.Get(ctx, client.ObjectKey{Name: e.node}, &n)
	if err == nil {
		return nil
	}
	if !apierrors.IsNotFound(err) {
		return fmt.Errorf("node %q: %w", e.node, err)
	}
	var machines kaironv1.MachineList
	if err := e.c.List(ctx, &machines); err != nil {
		return fmt.Errorf("listing machines: %w", err)
	}
	naming := 0
	for i := range machines.Items {
		if machines.Items[i].Spec.NodeName == e.node {
			naming++
		}
	}
	if naming == 0 {
		return fmt.Errorf("node %q not found, and no Machine has spec.nodeName %q; list the nodes with: kaironctl get nodes", e.node, e.node)
	}
	if naming == 1 {
		fmt.Fprintf(e.o.Out, "note: node %q does not exist, but 1 Machine still names it in spec.nodeName; evacuating it\n", e.node)
	} else {
		fmt.Fprintf(e.o.Out, "note: node %q does not exist, but %d Machines still name it in spec.nodeName; evacuating them\n", e.node, naming)
	}
	return nil
}

// once is evacuate without --wait: one pass, non-zero exit if anything was
// skipped.
func (e *evacuation) once(ctx context.Context) error {
	res, err := e.pass(ctx)
	if err != nil {
		return err
	}
	if res.onNode == 0 {
		fmt.Fprintf(e.o.Out, "node %s has no Machines; nothing to evacuate\n", e.node)
		return nil
	}
	fmt.Fprintf(e.o.Out, "node %s: %s\n", e.node, res.summary())
	// A Machine already migrating is skipped too: it has not left the node,
	// and a script must not take this pass for a finished evacuation.
	if skipped := res.skipped + res.inFlight; skipped > 0 {
		var names []string
		for _, k := range res.alreadyMigrating {
			names = append(names, k.String())
		}
		for _, w := range res.waiting {
			names = append(names, w.machine.String())
		}
		// The summary counts them apart; the total here says why it is
		// larger than the summary's "skipped".
		migrating := ""
		if res.inFlight > 0 {
			migrating = fmt.Sprintf(" (%d already migrating)", res.inFlight)
		}
		return fmt.Errorf("%d of %s on node %s skipped%s: %s; run kaironctl evacuate %s again once migrations have finished, or add --wait",
			skipped, plural(res.onNode, "Machine", "Machines"), e.node, migrating, strings.Join(names, ", "), e.node)
	}
	return nil
}

// untilEmpty is evacuate --wait.
func (e *evacuation) untilEmpty(ctx context.Context, timeout time.Duration) error {
	start := time.Now()
	deadline := start.Add(timeout)
	var res *passResult
	for n := 1; ; n++ {
		var err error
		res, err = e.pass(ctx)
		if err != nil {
			if !ops.Retriable(err) || ctx.Err() != nil {
				return err
			}
			fmt.Fprintf(e.o.Out, "[%s] pass failed: %s; trying again in %s\n", shortDuration(time.Since(start)), oneLine(err.Error()), shortDuration(e.poll))
		} else if res.onNode == 0 {
			moved := len(e.gone)
			if moved == 0 {
				fmt.Fprintf(e.o.Out, "node %s has no Machines; nothing to evacuate\n", e.node)
			} else {
				fmt.Fprintf(e.o.Out, "node %s is empty: %s moved off in %s (%s)\n", e.node,
					plural(moved, "Machine", "Machines"), shortDuration(time.Since(start)), plural(n, "pass", "passes"))
			}
			return nil
		}
		now := time.Now()
		if !now.Before(deadline) {
			still := "the Machines could not be listed"
			if res != nil {
				fmt.Fprintf(e.o.Out, "node %s: %d of %s moved off in %s; %d still on it\n", e.node,
					len(e.gone), plural(len(e.seen), "Machine", "Machines"), shortDuration(time.Since(start)), res.onNode)
				still = waitingList(append(append([]waitingMachine(nil), res.migrating...), res.waiting...))
			}
			return fmt.Errorf("timed out after %s waiting for node %s to empty; still on it: %s", shortDuration(timeout), e.node, still)
		}
		sleep := min(e.poll, deadline.Sub(now))
		if res != nil {
			fmt.Fprintf(e.o.Out, "[%s] %s\n", shortDuration(time.Since(start)), e.progress(res, sleep))
		}
		if err := e.nextPass(ctx, sleep); err != nil {
			return err
		}
	}
}

// nextPass waits until the next pass is due: after d, or as soon as no
// Machine has spec.nodeName NODE any more, so that the pass reporting the
// node empty comes at once.
func (e *evacuation) nextPass(ctx context.Context, d time.Duration) error {
	onNode := selection{
		newList: func() client.ObjectList { return &kaironv1.MachineList{} },
		fields:  fields.OneTermEqualSelector("spec.nodeName", e.node),
	}
	_, err := waitFor(ctx, e.c, onNode, d, func(machines []client.Object) (bool, error) {
		return len(machines) == 0, nil
	})
	var stopped *waitError
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return ctx.Err()
	case errors.As(err, &stopped):
		return nil // d passed
	}
	return fmt.Errorf("watching the machines on node %s: %w", e.node, err)
}

// progress is the line --wait prints after each pass.
func (e *evacuation) progress(res *passResult, next time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "node %s: %d of %s moved off", e.node, len(e.gone), plural(len(e.seen), "Machine", "Machines"))
	var still []string
	if n := len(res.migrating); n > 0 {
		still = append(still, fmt.Sprintf("%d migrating", n))
	}
	if n := len(res.waiting); n > 0 {
		byBudget := map[string]int{}
		other := 0
		for _, w := range res.waiting {
			for _, b := range w.budgets {
				byBudget[b]++
			}
			if len(w.budgets) == 0 {
				other++
			}
		}
		budgets := make([]string, 0, len(byBudget))
		for b, count := range byBudget {
			budgets = append(budgets, fmt.Sprintf("%d on budget %s", count, b))
		}
		sort.Strings(budgets)
		if other > 0 {
			budgets = append(budgets, fmt.Sprintf("%d refused by the API server", other))
		}
		still = append(still, fmt.Sprintf("%d waiting (%s)", n, strings.Join(budgets, ", ")))
	}
	if res.deleting > 0 {
		still = append(still, fmt.Sprintf("%d being deleted", res.deleting))
	}
	if len(still) > 0 {
		fmt.Fprintf(&b, "; still on it: %s", strings.Join(still, ", "))
	}
	fmt.Fprintf(&b, "; next pass in %s", shortDuration(next))
	return b.String()
}

// pass makes one ops.EvacuationPass, printing a line per Machine as the
// pass acts on it (with --wait, only when what it has to say about the
// Machine changed).
func (e *evacuation) pass(ctx context.Context) (*passResult, error) {
	var res *passResult
	var migrations map[machineKey]*kaironv1.MachineMigration
	pass := ops.EvacuationPass{
		Node: e.node, Strategy: e.strategy,
		Read: func(snap *rules.EvacuationSnapshot, onNode []*kaironv1.Machine) {
			e.reportGone(snap, onNode)
			res = &passResult{onNode: len(onNode)}
			migrations = map[machineKey]*kaironv1.MachineMigration{}
			for i := range snap.Migrations {
				mig := &snap.Migrations[i]
				migrations[machineKey{mig.Namespace, mig.Name}] = mig
			}
		},
		Acted: func(o ops.EvacuationOutcome) { e.record(res, migrations, o) },
	}
	if _, err := pass.Run(ctx, e.c); err != nil {
		var create *ops.CreateError
		if errors.As(err, &create) {
			return nil, fmt.Errorf("creating a migration for machine %s: %w", machineKey{create.Machine.Namespace, create.Machine.Name}, create.Err)
		}
		return nil, err
	}
	return res, nil
}

// record notes in res what the pass did with one Machine, and says it.
func (e *evacuation) record(res *passResult, migrations map[machineKey]*kaironv1.MachineMigration, o ops.EvacuationOutcome) {
	m := o.Machine
	key := machineKey{m.Namespace, m.Name}
	e.seen[m.UID] = key
	e.reportFailedMigration(m, migrations)
	switch o.Verdict {
	case rules.EvacuationDeleting:
		res.deleting++
		e.say(m, fmt.Sprintf("machine %s is being deleted; not migrating it", key))
	case rules.EvacuationInFlight:
		res.inFlight++
		res.alreadyMigrating = append(res.alreadyMigrating, key)
		mig := o.Migration
		e.migration[m.UID] = machineKey{mig.Namespace, mig.Name}
		why := fmt.Sprintf("migration %s/%s %s", mig.Namespace, mig.Name, migrationPhase(mig))
		res.migrating = append(res.migrating, waitingMachine{machine: key, why: why})
		e.say(m, e.skippedLine(key, fmt.Sprintf("migration %s/%s already in flight (%s); not creating another", mig.Namespace, mig.Name, migrationPhase(mig))))
	case rules.EvacuationBlocked:
		res.skipped++
		res.waiting = append(res.waiting, waitingMachine{machine: key, why: o.Reason, budgets: o.Budgets})
		e.say(m, e.skippedLine(key, o.Reason))
	case rules.EvacuationMigrate:
		switch mig := o.Created; {
		case o.Refused != nil:
			res.skipped++
			res.waiting = append(res.waiting, waitingMachine{machine: key, why: o.Refused.Error()})
			e.say(m, e.skippedLine(key, oneLine(o.Refused.Error())))
		case mig != nil:
			res.created++
			e.migration[m.UID] = machineKey{mig.Namespace, mig.Name}
			res.migrating = append(res.migrating, waitingMachine{machine: key, why: fmt.Sprintf("migration %s/%s Pending", mig.Namespace, mig.Name)})
			e.say(m, fmt.Sprintf("machine %s: migration %s/%s created", key, mig.Namespace, mig.Name))
		}
	}
}

func (e *evacuation) skippedLine(key machineKey, reason string) string {
	line := fmt.Sprintf("machine %s skipped: %s", key, reason)
	if e.wait {
		line += "; waiting"
	}
	return line
}

// say prints line about m; with --wait, only when it is not what the last
// line about m said, so a Machine waiting on a budget is not reported again
// on every pass (the progress line counts it).
func (e *evacuation) say(m *kaironv1.Machine, line string) {
	if e.wait && e.reported[m.UID] == line {
		return
	}
	e.reported[m.UID] = line
	fmt.Fprintln(e.o.Out, line)
}

// reportGone prints the Machines seen on the node before that are not on
// it any more: moved (spec.nodeName changed) or deleted.
func (e *evacuation) reportGone(snap *rules.EvacuationSnapshot, onNode []*kaironv1.Machine) {
	here := map[types.UID]bool{}
	for _, m := range onNode {
		here[m.UID] = true
	}
	byUID := map[types.UID]*kaironv1.Machine{}
	for i := range snap.Machines {
		byUID[snap.Machines[i].UID] = &snap.Machines[i]
	}
	var left []types.UID
	for uid := range e.seen {
		if !here[uid] && !e.gone[uid] {
			left = append(left, uid)
		}
	}
	sort.Slice(left, func(i, j int) bool { return e.seen[left[i]].String() < e.seen[left[j]].String() })
	for _, uid := range left {
		e.gone[uid] = true
		key := e.seen[uid]
		switch m := byUID[uid]; {
		case m == nil:
			fmt.Fprintf(e.o.Out, "machine %s was deleted\n", key)
		case m.Spec.NodeName == "":
			fmt.Fprintf(e.o.Out, "machine %s left node %s (not bound to a node now)\n", key, e.node)
		default:
			fmt.Fprintf(e.o.Out, "machine %s moved to %s\n", key, m.Spec.NodeName)
		}
	}
}

// reportFailedMigration says so when the migration last seen moving m
// failed; the pass then decides about m afresh.
func (e *evacuation) reportFailedMigration(m *kaironv1.Machine, migrations map[machineKey]*kaironv1.MachineMigration) {
	ref, ok := e.migration[m.UID]
	if !ok {
		return
	}
	mig := migrations[ref]
	if mig == nil || mig.Status.Phase != kaironv1.MigrationFailed {
		return
	}
	delete(e.migration, m.UID)
	why := ""
	if mig.Status.Reason != "" || mig.Status.Message != "" {
		why = ": " + strings.TrimPrefix(string(mig.Status.Reason)+": "+mig.Status.Message, ": ")
	}
	fmt.Fprintf(e.o.Out, "machine %s/%s: migration %s failed%s\n", m.Namespace, m.Name, ref, why)
}

func (r *passResult) summary() string {
	parts := []string{plural(r.onNode, "Machine", "Machines"), fmt.Sprintf("%s created", plural(r.created, "migration", "migrations"))}
	if r.inFlight > 0 {
		parts = append(parts, fmt.Sprintf("%d already migrating", r.inFlight))
	}
	if r.deleting > 0 {
		parts = append(parts, fmt.Sprintf("%d being deleted", r.deleting))
	}
	parts = append(parts, fmt.Sprintf("%d skipped", r.skipped))
	return strings.Join(parts, ", ")
}

// waitingList is "ns/a (why), ns/b (why)".
func waitingList(ws []waitingMachine) string {
	parts := make([]string, len(ws))
	for i, w := range ws {
		parts[i] = fmt.Sprintf("%s (%s)", w.machine, oneLine(w.why))
	}
	return strings.Join(parts, ", ")
}

func migrationPhase(mig *kaironv1.MachineMigration) string {
	if mig.Status.Phase == "" {
		return "not started yet"
	}
	return string(mig.Status.Phase)
}

func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

// shortDuration is d rounded to what a person reads: "15m", "1m30s", "250ms".
func shortDuration(d time.Duration) string {
	if d < time.Second {
		return d.Round(time.Millisecond).String()
	}
	s := d.Round(time.Second).String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
