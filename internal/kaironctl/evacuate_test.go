package kaironctl_test

// kaironctl evacuate against the real API server. Nothing carries out
// migrations here: where a test needs one done, it plays the node agents by
// moving the Machine (spec.nodeName) and setting the migration's phase.

import (
	"bytes"
	"context"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
)

// evacNode creates a Kairon Node named after the test's namespace (Nodes
// are shared by every test) and deletes it when the test ends.
func evacNode(t *testing.T, env *testenv.Env, ns, name string) string {
	t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: ns + "-" + name, Labels: map[string]string{kaironv1.LabelNode: "true"}}}
	env.Create(t, n)
	t.Cleanup(func() {
		if err := env.Client.Delete(context.Background(), n); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting node %s: %v", n.Name, err)
		}
	})
	return n.Name
}

// runningOn creates a Running Machine on node with labels.
func runningOn(t *testing.T, env *testenv.Env, ns, name, node string, labels map[string]string) {
	t.Helper()
	m := &kaironv1.Machine{ObjectMeta: meta(ns, name), Spec: vmSpec()}
	m.Labels = labels
	m.Spec.NodeName = node
	env.Create(t, m)
	m.Status.Phase = kaironv1.MachineRunning
	env.SetStatus(t, m)
}

func minAvailableBudget(t *testing.T, env *testenv.Env, ns, name string, selector map[string]string, n int32) {
	t.Helper()
	env.Create(t, &kaironv1.MachineDisruptionBudget{ObjectMeta: meta(ns, name), Spec: kaironv1.MachineDisruptionBudgetSpec{
		Selector: selector, MinAvailable: ptr.To(intstr.FromInt32(n)),
	}})
}

func migrationsIn(t *testing.T, env *testenv.Env, ns string) []kaironv1.MachineMigration {
	t.Helper()
	var l kaironv1.MachineMigrationList
	if err := env.Client.List(context.Background(), &l, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	sort.Slice(l.Items, func(i, j int) bool { return l.Items[i].CreationTimestamp.Before(&l.Items[j].CreationTimestamp) })
	return l.Items
}

func migrationsSummary(migs []kaironv1.MachineMigration) string {
	var parts []string
	for _, m := range migs {
		parts = append(parts, fmt.Sprintf("%s(%s,%s,%q)", m.Name, m.Spec.MachineName, m.Spec.Strategy, m.Status.Phase))
	}
	return strings.Join(parts, " ")
}

var generatedSuffix = regexp.MustCompile(`-evac-[a-z0-9]{5}\b`)

// stable replaces the random part of generated migration names.
func stable(s string) string { return generatedSuffix.ReplaceAllString(s, "-evac-XXXXX") }

// finish plays the node agent for a migration: with phase Succeeded it
// moves the Machine to target first; with Failed it leaves it where it is.
func finish(ctx context.Context, env *testenv.Env, mig *kaironv1.MachineMigration, phase kaironv1.MigrationPhase, target string) error {
	var m kaironv1.Machine
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: mig.Namespace, Name: mig.Spec.MachineName}, &m); err != nil {
		return err
	}
	source := m.Spec.NodeName
	if phase == kaironv1.MigrationSucceeded {
		orig := m.DeepCopy()
		m.Spec.NodeName = target
		if err := env.Client.Patch(ctx, &m, client.MergeFrom(orig)); err != nil {
			return fmt.Errorf("moving machine %s: %w", m.Name, err)
		}
	}
	orig := mig.DeepCopy()
	mig.Status.Phase, mig.Status.SourceNode, mig.Status.TargetNode = phase, source, target
	if phase == kaironv1.MigrationFailed {
		mig.Status.Reason, mig.Status.Message = "TargetUnavailable", "node "+target+" refused the machine"
	}
	return env.Client.Status().Patch(ctx, mig, client.MergeFrom(orig))
}

// finishAll finishes every migration in ns that is still in flight.
func finishAll(t *testing.T, env *testenv.Env, ns string, phase kaironv1.MigrationPhase, target string) {
	t.Helper()
	for _, mig := range migrationsIn(t, env, ns) {
		if !mig.Status.Phase.IsTerminal() {
			if err := finish(context.Background(), env, &mig, phase, target); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// One pass at a time: what is created, what is skipped and why, the exit
// code, and that a second run never duplicates a migration in flight.
func TestEvacuate(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	n1, n2 := evacNode(t, env, ns, "n1"), evacNode(t, env, ns, "n2")
	web := map[string]string{"app": ns} // budgets match across the cluster
	runningOn(t, env, ns, "solo", n1, nil)
	for _, name := range []string{"web-1", "web-2", "web-3"} {
		runningOn(t, env, ns, name, n1, web)
	}
	runningOn(t, env, ns, "elsewhere", n2, nil)
	minAvailableBudget(t, env, ns, "web-tier", web, 2)

	created := func(m string) string {
		return fmt.Sprintf("machine %s/%s: migration %s/%s-evac-XXXXX created", ns, m, ns, m)
	}
	inFlight := func(m, phase string) string {
		return fmt.Sprintf("machine %s/%s skipped: migration %s/%s-evac-XXXXX already in flight (%s); not creating another", ns, m, ns, m, phase)
	}
	skipped := func(m, numbers string) string {
		return fmt.Sprintf("machine %s/%s skipped: budget %s/web-tier allows no more disruptions (%s)", ns, m, ns, numbers)
	}
	steps := []struct {
		name     string
		before   func(t *testing.T) // plays the node agents before the run
		strategy string
		stdout   []string
		err      string // the error line, "" for success
		// the migrations afterwards: machine/strategy
		migrations []string
	}{{
		name: "first pass: one web Machine within the budget, the rest skipped",
		stdout: []string{
			created("solo"),
			created("web-1"),
			skipped("web-2", "3 healthy, 2 desired, 0 allowed; 1 already spent in this pass"),
			skipped("web-3", "3 healthy, 2 desired, 0 allowed; 1 already spent in this pass"),
			"node " + n1 + ": 4 Machines, 2 migrations created, 2 skipped",
		},
		err: fmt.Sprintf("error: 2 of 4 Machines on node %s skipped: %s/web-2, %s/web-3; run kaironctl evacuate %s again once migrations have finished, or add --wait",
			n1, ns, ns, n1),
		migrations: []string{"solo/cold", "web-1/cold"},
	}, {
		name: "second pass: nothing duplicated; web-1 in flight spends the budget",
		stdout: []string{
			inFlight("solo", "not started yet"),
			inFlight("web-1", "not started yet"),
			skipped("web-2", "2 healthy, 2 desired, 0 allowed"),
			skipped("web-3", "2 healthy, 2 desired, 0 allowed"),
			"node " + n1 + ": 4 Machines, 0 migrations created, 2 already migrating, 2 skipped",
		},
		// Machines already migrating have not left the node: skipped too.
		err: fmt.Sprintf("error: 4 of 4 Machines on node %s skipped (2 already migrating): %s/solo, %s/web-1, %s/web-2, %s/web-3;",
			n1, ns, ns, ns, ns),
		migrations: []string{"solo/cold", "web-1/cold"},
	}, {
		name: "web-1 moved, solo's migration failed: both get a new one, live this time",
		before: func(t *testing.T) {
			for _, mig := range migrationsIn(t, env, ns) {
				phase := kaironv1.MigrationSucceeded
				if mig.Spec.MachineName == "solo" {
					phase = kaironv1.MigrationFailed
				}
				if err := finish(context.Background(), env, &mig, phase, n2); err != nil {
					t.Fatal(err)
				}
			}
		},
		strategy: "live",
		stdout: []string{
			created("solo"),
			created("web-2"),
			skipped("web-3", "3 healthy, 2 desired, 0 allowed; 1 already spent in this pass"),
			"node " + n1 + ": 3 Machines, 2 migrations created, 1 skipped",
		},
		err:        "error: 1 of 3 Machines on node " + n1 + " skipped: " + ns + "/web-3;",
		migrations: []string{"solo/cold", "web-1/cold", "solo/live", "web-2/live"},
	}, {
		name:       "the last one goes: exit 0",
		before:     func(t *testing.T) { finishAll(t, env, ns, kaironv1.MigrationSucceeded, n2) },
		stdout:     []string{created("web-3"), "node " + n1 + ": 1 Machine, 1 migration created, 0 skipped"},
		migrations: []string{"solo/cold", "web-1/cold", "solo/live", "web-2/live", "web-3/cold"},
	}, {
		name:       "an empty node",
		before:     func(t *testing.T) { finishAll(t, env, ns, kaironv1.MigrationSucceeded, n2) },
		stdout:     []string{"node " + n1 + " has no Machines; nothing to evacuate"},
		migrations: []string{"solo/cold", "web-1/cold", "solo/live", "web-2/live", "web-3/cold"},
	}}
	for _, step := range steps {
		t.Run(step.name, func(t *testing.T) {
			if step.before != nil {
				step.before(t)
			}
			args := []string{"evacuate", n1}
			if step.strategy != "" {
				args = append(args, "--strategy", step.strategy)
			}
			r := kctl(t, env, args...)
			if got, want := stable(r.stdout), strings.Join(step.stdout, "\n")+"\n"; got != want {
				t.Errorf("stdout:\n%s\nwant:\n%s", got, want)
			}
			if step.err == "" {
				if r.code != 0 || r.stderr != "" {
					t.Errorf("exit %d, stderr %q; want success", r.code, r.stderr)
				}
			} else {
				r.failed(t, step.err)
			}
			var got []string
			for _, mig := range migrationsIn(t, env, ns) {
				got = append(got, mig.Spec.MachineName+"/"+string(mig.Spec.Strategy))
				if mig.Labels[kaironv1.LabelEvacuatedNode] != n1 || !strings.HasPrefix(mig.Name, mig.Spec.MachineName+"-evac-") {
					t.Errorf("migration %s: labels %v", mig.Name, mig.Labels)
				}
			}
			// Creation times have whole seconds: compare as sets.
			sort.Strings(got)
			want := append([]string(nil), step.migrations...)
			sort.Strings(want)
			if strings.Join(got, " ") != strings.Join(want, " ") {
				t.Errorf("migrations %v, want %v", got, step.migrations)
			}
		})
	}
	// The Machine on the other node was never touched.
	for _, mig := range migrationsIn(t, env, ns) {
		if mig.Spec.MachineName == "elsewhere" {
			t.Errorf("migration %s for a Machine on another node", mig.Name)
		}
	}
}

func TestEvacuateMistakes(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	n1 := evacNode(t, env, ns, "n1")
	runningOn(t, env, ns, "m", n1, nil)
	missing := ns + "-gone"
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"evacuate"}, "evacuate needs a NODE (see 'kaironctl evacuate --help')"},
		{[]string{"evacuate", n1, "x"}, "evacuate takes one NODE, got 2 arguments"},
		{[]string{"evacuate", n1, "--strategy", "warm"}, `invalid --strategy "warm": use cold or live`},
		{[]string{"evacuate", n1, "--timeout", "1m"}, "--timeout only applies with --wait"},
		{[]string{"evacuate", n1, "--poll-interval", "1s"}, "--poll-interval only applies with --wait"},
		{[]string{"evacuate", n1, "--wait", "--poll-interval", "0s"}, "--poll-interval must be positive"},
		{[]string{"evacuate", n1, "--wait", "--timeout", "-1s"}, "--timeout must be positive"},
		{[]string{"evacuate", missing}, `node "` + missing + `" not found, and no Machine has spec.nodeName "` + missing + `"; list the nodes with: kaironctl get nodes`},
	} {
		r := kctl(t, env, tc.args...)
		r.failed(t, tc.want)
		if r.stdout != "" {
			t.Errorf("%v printed %q", tc.args, r.stdout)
		}
	}
	if migs := migrationsIn(t, env, ns); len(migs) != 0 {
		t.Errorf("a mistake created migrations: %s", migrationsSummary(migs))
	}

	// A Node that is gone while Machines still name it is evacuated with
	// a note.
	runningOn(t, env, ns, "orphan", missing, nil)
	r := kctl(t, env, "evacuate", missing).ok(t)
	want := fmt.Sprintf("note: node %q does not exist, but 1 Machine still names it in spec.nodeName; evacuating it\n"+
		"machine %s/orphan: migration %s/orphan-evac-XXXXX created\nnode %s: 1 Machine, 1 migration created, 0 skipped\n", missing, ns, ns, missing)
	if got := stable(r.stdout); got != want {
		t.Errorf("stdout:\n%s\nwant:\n%s", got, want)
	}
}

// --wait empties the node as migrations finish, one at a time as the
// budget lets them, and reports what moved and what waits on which budget.
func TestEvacuateWait(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	n1, n2 := evacNode(t, env, ns, "n1"), evacNode(t, env, ns, "n2")
	web := map[string]string{"app": ns}
	for _, name := range []string{"web-1", "web-2", "web-3"} {
		runningOn(t, env, ns, name, n1, web)
	}
	minAvailableBudget(t, env, ns, "web-tier", web, 2)

	// The node agents: every migration is carried out as soon as it
	// appears. peak is the most migrations in flight at once, as the
	// stream of changes shows them.
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	var (
		wg       sync.WaitGroup
		peak     int
		agentErr error
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		inFlight := map[string]bool{}
		err := watchEvents(ctx, env, &kaironv1.MachineMigrationList{}, ns, func(ev watch.Event) (bool, error) {
			mig, ok := ev.Object.(*kaironv1.MachineMigration)
			if !ok {
				return false, nil
			}
			if ev.Type == watch.Deleted || mig.Status.Phase.IsTerminal() {
				delete(inFlight, mig.Name)
				return false, nil
			}
			inFlight[mig.Name] = true
			peak = max(peak, len(inFlight))
			if ev.Type != watch.Added {
				return false, nil
			}
			return false, finish(ctx, env, mig, kaironv1.MigrationSucceeded, n2)
		})
		if ctx.Err() == nil {
			agentErr = err
		}
	}()

	r := kctl(t, env, "evacuate", n1, "--wait", "--poll-interval", "500ms", "--timeout", "1m").ok(t)
	cancel()
	wg.Wait()
	if agentErr != nil {
		t.Errorf("node agent stand-in: %v", agentErr)
	}
	if peak > 1 {
		t.Errorf("%d migrations in flight at once; the budget allows 1", peak)
	}
	out := stable(r.stdout)
	for _, want := range []string{
		fmt.Sprintf("machine %s/web-1: migration %s/web-1-evac-XXXXX created\n", ns, ns),
		fmt.Sprintf("machine %s/web-2 skipped: budget %s/web-tier allows no more disruptions (3 healthy, 2 desired, 0 allowed; 1 already spent in this pass); waiting\n", ns, ns),
		fmt.Sprintf("] node %s: 0 of 3 Machines moved off; still on it: 1 migrating, 2 waiting (2 on budget %s/web-tier); next pass in 500ms\n", n1, ns),
		fmt.Sprintf("machine %s/web-1 moved to %s\n", ns, n2),
		fmt.Sprintf("machine %s/web-2: migration %s/web-2-evac-XXXXX created\n", ns, ns),
		fmt.Sprintf("machine %s/web-3 moved to %s\n", ns, n2),
		fmt.Sprintf("node %s is empty: 3 Machines moved off in ", n1),
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if !strings.HasPrefix(out[strings.LastIndex(strings.TrimSuffix(out, "\n"), "\n")+1:], "node "+n1+" is empty: ") {
		t.Errorf("the last line is not the summary:\n%s", out)
	}
	// Each Machine got exactly one migration.
	migs := migrationsIn(t, env, ns)
	seen := map[string]int{}
	for _, mig := range migs {
		seen[mig.Spec.MachineName]++
	}
	if len(migs) != 3 || seen["web-1"] != 1 || seen["web-2"] != 1 || seen["web-3"] != 1 {
		t.Errorf("migrations: %s", migrationsSummary(migs))
	}
}

// --wait gives up after --timeout, exits non-zero and says what is left.
func TestEvacuateWaitTimeout(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	n1 := evacNode(t, env, ns, "n1")
	web := map[string]string{"app": ns}
	for _, name := range []string{"web-1", "web-2"} {
		runningOn(t, env, ns, name, n1, web)
	}
	// A budget that can never be satisfied.
	minAvailableBudget(t, env, ns, "web-tier", web, 2)

	var stdout bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	r := kctlContext(ctx, env.Kubeconfig, &stdout, "evacuate", n1, "--wait", "--timeout", "2s", "--poll-interval", "500ms")
	if took := time.Since(start); took < 2*time.Second || took > 20*time.Second {
		t.Errorf("took %s with --timeout 2s", took)
	}
	blocked := fmt.Sprintf("budget %s/web-tier allows no more disruptions (2 healthy, 2 desired, 0 allowed)", ns)
	r.failed(t, fmt.Sprintf("error: timed out after 2s waiting for node %s to empty; still on it: %s/web-1 (%s), %s/web-2 (%s)", n1, ns, blocked, ns, blocked))
	want := []string{
		fmt.Sprintf("machine %s/web-1 skipped: %s; waiting", ns, blocked),
		fmt.Sprintf("machine %s/web-2 skipped: %s; waiting", ns, blocked),
	}
	// Each skip is printed once: on later passes the reason is the same,
	// and only the progress line counts the Machines waiting.
	lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
	if len(lines) < 4 || lines[0] != want[0] || lines[1] != want[1] {
		t.Fatalf("stdout:\n%s", r.stdout)
	}
	progress := regexp.MustCompile(`^\[[0-9.]+m?s\] node ` + regexp.QuoteMeta(n1) + `: 0 of 2 Machines moved off; still on it: 2 waiting \(2 on budget ` + regexp.QuoteMeta(ns) + `/web-tier\); next pass in [0-9.]+m?s$`)
	for _, l := range lines[2 : len(lines)-1] {
		if !progress.MatchString(l) {
			t.Errorf("not a progress line: %q", l)
		}
	}
	if last, want := lines[len(lines)-1], fmt.Sprintf("node %s: 0 of 2 Machines moved off in 2s; 2 still on it", n1); last != want {
		t.Errorf("last line %q, want %q", last, want)
	}
	if migs := migrationsIn(t, env, ns); len(migs) != 0 {
		t.Errorf("migrations created past the budget: %s", migrationsSummary(migs))
	}
}

// evacuate appears in help with the other verbs, with its defaults as typed.
func TestEvacuateIsAVerb(t *testing.T) {
	r := kctlContext(context.Background(), "", &bytes.Buffer{}, "--help").ok(t)
	if !regexp.MustCompile(`(?m)^  evacuate `).MatchString(r.stdout) {
		t.Errorf("help does not list evacuate:\n%s", r.stdout)
	}
	r = kctlContext(context.Background(), "", &bytes.Buffer{}, "evacuate", "--help").ok(t)
	for _, want := range []string{"(default 15m)", "(default 10s)", `(default "cold")`, "kaironctl evacuate NODE [--wait]"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("evacuate --help lacks %q:\n%s", want, r.stdout)
		}
	}
}
