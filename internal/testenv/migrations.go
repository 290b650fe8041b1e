package testenv

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/rules"
)

// RunMigrations stands in for the node agents of tests that have none,
// until the returned function is called: every migration in ns that has
// been in flight for moveTime moves its Machine to target and Succeeds.
// moveTime stands for the time a real move takes, during which the
// migration is seen in flight beside the others. The function returns the
// most migrations it saw in flight at once, and fails the test on any
// error met while moving one.
func RunMigrations(t *testing.T, env *Env, ns, target string, moveTime time.Duration) (stop func() int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var (
		wg   sync.WaitGroup
		peak int
		errs []error
	)
	wg.Go(func() {
		ticker := time.NewTicker(PollInterval)
		defer ticker.Stop()
		seen := map[types.UID]time.Time{}
		for {
			select {
			case <-ctx.Done():
				return
			case <-ticker.C:
			}
			var l kaironv1.MachineMigrationList
			if err := env.Client.List(ctx, &l, client.InNamespace(ns)); err != nil {
				continue
			}
			var inFlight []*kaironv1.MachineMigration
			for i := range l.Items {
				if mig := &l.Items[i]; rules.MigrationInFlight(mig) {
					inFlight = append(inFlight, mig)
					if _, ok := seen[mig.UID]; !ok {
						seen[mig.UID] = time.Now()
					}
				}
			}
			peak = max(peak, len(inFlight))
			for _, mig := range inFlight {
				if time.Since(seen[mig.UID]) < moveTime {
					continue
				}
				if err := completeMigration(ctx, env, mig, target); err != nil && ctx.Err() == nil {
					errs = append(errs, err)
				}
			}
		}
	})
	return func() int {
		cancel()
		wg.Wait()
		for _, err := range errs {
			t.Errorf("running migrations: %v", err)
		}
		return peak
	}
}

// completeMigration moves mig's Machine to target and marks mig Succeeded,
// as a node agent does.
func completeMigration(ctx context.Context, env *Env, mig *kaironv1.MachineMigration, target string) error {
	var m kaironv1.Machine
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: mig.Namespace, Name: mig.Spec.MachineName}, &m); err != nil {
		return err
	}
	source := m.Spec.NodeName
	orig := m.DeepCopy()
	m.Spec.NodeName = target
	if err := env.Client.Patch(ctx, &m, client.MergeFrom(orig)); err != nil {
		return fmt.Errorf("moving %s: %w", m.Name, err)
	}
	origMig := mig.DeepCopy()
	now := metav1.Now()
	mig.Status = kaironv1.MachineMigrationStatus{
		Phase: kaironv1.MigrationSucceeded, SourceNode: source, TargetNode: target, StartTime: &now, CompletionTime: &now,
	}
	if err := env.Client.Status().Patch(ctx, mig, client.MergeFrom(origMig)); err != nil {
		return fmt.Errorf("finishing %s: %w", mig.Name, err)
	}
	return nil
}
