package kaironctl_test

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
)

var migGenerated = regexp.MustCompile(`-mig-[a-z0-9]{5}\b`)

// TestMigrate: one migration per call, within the budgets, never a second
// one in flight; --wait reports the move or the failure.
func TestMigrate(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	n1, n2 := evacNode(t, env, ns, "n1"), evacNode(t, env, ns, "n2")
	web := map[string]string{"app": ns}
	for _, name := range []string{"web-1", "web-2"} {
		runningOn(t, env, ns, name, n1, web)
	}
	minAvailableBudget(t, env, ns, "web-tier", web, 1)

	r := kctl(t, env, "-n", ns, "migrate", "web-1", "--strategy", "live", "--to", n2).ok(t, "migrate")
	want := "machinemigration " + ns + "/web-1-mig-XXXXX created: machine web-1 from node " + n1 + " to " + n2 + " (live)\n"
	if got := migGenerated.ReplaceAllString(r.stdout, "-mig-XXXXX"); got != want {
		t.Errorf("stdout %q, want %q", got, want)
	}
	migs := migrationsIn(t, env, ns)
	if len(migs) != 1 || migs[0].Spec.MachineName != "web-1" || migs[0].Spec.Strategy != kaironv1.MigrationLive || migs[0].Spec.TargetNode != n2 {
		t.Fatalf("migrations: %s", migrationsSummary(migs))
	}

	// web-1 is in flight: it keeps its migration, and the budget (2
	// matching, minAvailable 1) has nothing left for web-2.
	kctl(t, env, "-n", ns, "migrate", "web-1").failed(t, "machine "+ns+"/web-1 already has migration "+migs[0].Name+" in flight")
	kctl(t, env, "-n", ns, "migrate", "web-2").failed(t, "machine "+ns+"/web-2 not migrated: budget "+ns+"/web-tier allows no more disruptions (1 healthy, 1 desired, 0 allowed)")
	if got := migrationsIn(t, env, ns); len(got) != 1 {
		t.Errorf("refused migrates created migrations: %s", migrationsSummary(got))
	}

	finishAll(t, env, ns, kaironv1.MigrationSucceeded, n2)
	// --wait, with the test as the node agents: success, then a failure.
	for _, tc := range []struct {
		phase kaironv1.MigrationPhase
		check func(result)
	}{
		{kaironv1.MigrationSucceeded, func(r result) {
			r.ok(t, "migrate --wait")
			if !strings.Contains(r.stdout, "machine "+ns+"/web-2 moved from node "+n1+" to node "+n2+" (cold) in ") {
				t.Errorf("--wait stdout %q lacks the move", r.stdout)
			}
		}},
		{kaironv1.MigrationFailed, func(r result) {
			r.failed(t, "failed (TargetUnavailable): node "+n1+" refused the machine")
		}},
	} {
		done := make(chan result, 1)
		go func() {
			done <- kctl(t, env, "-n", ns, "migrate", "web-2", "--wait", "--timeout", "1m")
		}()
		var open []kaironv1.MachineMigration
		testenv.Eventually(t, time.Minute, "migrate --wait to create a migration", func() (bool, string) {
			all := migrationsIn(t, env, ns)
			open = nil
			for _, mig := range all {
				if !mig.Status.Phase.IsTerminal() {
					open = append(open, mig)
				}
			}
			return len(open) == 1, migrationsSummary(all)
		})
		target := n2
		if tc.phase == kaironv1.MigrationFailed {
			target = n1
		}
		if err := finish(context.Background(), env, &open[0], tc.phase, target); err != nil {
			t.Fatal(err)
		}
		tc.check(<-done)
	}
}

func TestMigrateMistakes(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	n1 := evacNode(t, env, ns, "n1")
	runningOn(t, env, ns, "web-1", n1, nil)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"migrate"}, "migrate needs a MACHINE"},
		{[]string{"migrate", "a", "b"}, "migrate takes one MACHINE, got 2 arguments"},
		{[]string{"migrate", "web-1", "--strategy", "hot"}, `invalid --strategy "hot": use cold or live`},
		{[]string{"migrate", "web-1", "--timeout", "1m"}, "--timeout only applies with --wait"},
		{[]string{"migrate", "web-1", "--wait", "--timeout", "0s"}, "--timeout must be positive"},
		{[]string{"migrate", "nope"}, "machine " + ns + "/nope not found"},
		{[]string{"migrate", "web-1", "--to", n1}, "machine " + ns + "/web-1 already runs on node " + n1},
	} {
		kctl(t, env, append([]string{"-n", ns}, tc.args...)...).failed(t, tc.want)
	}
	if got := migrationsIn(t, env, ns); len(got) != 0 {
		t.Errorf("mistakes created migrations: %s", migrationsSummary(got))
	}
}
