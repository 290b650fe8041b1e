package kaironctl

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/ops"
)

const defaultMigrateTimeout = 5 * time.Minute

type migrateFlags struct {
	to       string
	strategy string
	wait     bool
	timeout  time.Duration
}

func newMigrateCommand(o *Options) *cobra.Command {
	f := &migrateFlags{}
	cmd := &cobra.Command{
		Use:   "migrate MACHINE [--to NODE] [--strategy cold|live] [--wait] [--timeout 5m]",
		Short: "Move one Machine to another node, if its disruption budgets allow it",
		Long: `Create a MachineMigration for MACHINE (in the current namespace, or -n).

Like evacuate, migrate asks the MachineDisruptionBudgets first: a Machine a
budget does not allow to be disrupted now is not migrated, and the error
names the budget and its numbers. A Machine that already has a migration in
flight keeps it.

Without --to the target is the scheduler's choice among the other nodes.
--strategy live moves the guest while it runs (milliseconds of downtime);
cold, the default, pauses it for the move (seconds).

With --wait, migrate follows the migration and prints where the Machine went
and how long the guest did not run; it exits non-zero if the migration
fails or --timeout passes first.`,
		Example: `  kaironctl migrate web-1
  kaironctl migrate web-1 --to node-2 --strategy live --wait`,
		RunE: func(cmd *cobra.Command, args []string) error {
			machine, err := oneArg(cmd, "migrate", "MACHINE", args)
			if err != nil {
				return err
			}
			strategy, ok := ops.ParseStrategy(f.strategy)
			if !ok {
				return usageError(cmd, "invalid --strategy %q: use cold or live", f.strategy)
			}
			if !f.wait && cmd.Flags().Changed("timeout") {
				return usageError(cmd, "--timeout only applies with --wait")
			}
			if f.timeout <= 0 {
				return usageError(cmd, "--timeout must be positive, got %s", f.timeout)
			}
			return o.runMigrate(cmd.Context(), machine, strategy, f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.to, "to", "", "Target node (default: the scheduler's choice)")
	fl.StringVar(&f.strategy, "strategy", string(kaironv1.MigrationCold), "How to move the Machine: cold or live")
	fl.BoolVar(&f.wait, "wait", false, "Wait until the migration succeeded or failed")
	fl.DurationVar(&f.timeout, "timeout", defaultMigrateTimeout, "With --wait: give up, and exit non-zero, after this long")
	fl.Lookup("timeout").DefValue = "5m"
	return cmd
}

func (o *Options) runMigrate(ctx context.Context, name string, strategy kaironv1.MigrationStrategy, f *migrateFlags) error {
	ns, err := o.Namespace()
	if err != nil {
		return err
	}
	c, err := o.Client()
	if err != nil {
		return err
	}
	started, err := ops.StartMigration(ctx, c, ops.Migration{Namespace: ns, Machine: name, Strategy: strategy, TargetNode: f.to})
	if err != nil {
		return migrateError(ns, name, f.to, err)
	}
	mig := started.Migration
	target := f.to
	if target == "" {
		target = "the scheduler's choice"
	}
	fmt.Fprintf(o.Out, "machinemigration %s/%s created: machine %s from node %s to %s (%s)\n",
		ns, mig.Name, name, started.SourceNode, target, strategy)
	if !f.wait {
		return nil
	}
	return o.waitMigration(ctx, c, client.ObjectKeyFromObject(mig), f.timeout)
}

// migrateError words why ops.StartMigration did not migrate machine ns/name.
func migrateError(ns, name, to string, err error) error {
	var lookup *ops.MachineLookupError
	var not *ops.NotMigrated
	var create *ops.CreateError
	switch {
	case errors.As(err, &lookup):
		if apierrors.IsNotFound(lookup.Err) {
			return fmt.Errorf("machine %s/%s not found", ns, name)
		}
		return lookup.Err
	case errors.As(err, &create):
		return fmt.Errorf("creating the migration of machine %s/%s: %w", ns, name, create.Err)
	case !errors.As(err, &not):
		return err
	}
	switch not.Cause {
	case ops.NotOnNode:
		return fmt.Errorf("machine %s/%s is not on a node yet (phase %s): nothing to migrate", ns, name, orDash(string(not.Machine.Status.Phase)))
	case ops.AlreadyOnTarget:
		return fmt.Errorf("machine %s/%s already runs on node %s", ns, name, to)
	case ops.Deleting:
		return fmt.Errorf("machine %s/%s is being deleted", ns, name)
	case ops.InFlight:
		return fmt.Errorf("machine %s/%s already has migration %s in flight (%s)", ns, name, not.Migration.Name, migrationPhase(not.Migration))
	case ops.Blocked:
		return fmt.Errorf("machine %s/%s not migrated: %s", ns, name, not.Reason)
	}
	return fmt.Errorf("machine %s/%s not migrated: %w", ns, name, not.Err)
}

var errMigrationDeleted = errors.New("migration was deleted")

// waitMigration follows a migration until it ends and reports how.
func (o *Options) waitMigration(ctx context.Context, c client.WithWatch, key client.ObjectKey, timeout time.Duration) error {
	began := time.Now()
	mig, err := waitForObject(ctx, c, &kaironv1.MachineMigration{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}, timeout,
		func(mig *kaironv1.MachineMigration) (bool, error) {
			if mig == nil {
				return false, errMigrationDeleted
			}
			return mig.Status.Phase == kaironv1.MigrationSucceeded || mig.Status.Phase == kaironv1.MigrationFailed, nil
		})
	var stopped *waitError
	switch {
	case errors.Is(err, errMigrationDeleted):
		return fmt.Errorf("machinemigration %s was deleted before it finished", key)
	case errors.As(err, &stopped):
		if mig == nil {
			mig = &kaironv1.MachineMigration{}
		}
		return fmt.Errorf("machinemigration %s still %s after %s", key, migrationPhase(mig), timeout)
	case err != nil:
		return fmt.Errorf("machinemigration %s: %w", key, err)
	case mig.Status.Phase == kaironv1.MigrationFailed:
		return fmt.Errorf("machinemigration %s failed (%s): %s", key, mig.Status.Reason, mig.Status.Message)
	}
	fmt.Fprintf(o.Out, "machine %s/%s moved from node %s to node %s (%s) in %s; the guest did not run for %dms\n",
		key.Namespace, mig.Spec.MachineName, mig.Status.SourceNode, mig.Status.TargetNode, orCold(mig.Spec.Strategy),
		shortDuration(time.Since(began)), mig.Status.DowntimeMillis)
	return nil
}

func orCold(s kaironv1.MigrationStrategy) kaironv1.MigrationStrategy {
	if s == "" {
		return kaironv1.MigrationCold
	}
	return s
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
