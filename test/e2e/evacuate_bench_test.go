package e2e

import (
	"context"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
)

// BenchmarkEvacuateSim20 measures `kaironctl evacuate NODE --wait` emptying
// a node of 20 Machines through the real executor (bin/kairon-controller and
// two bin/kairon-node agents with the sim backend, 200ms boot delay), under
// a MachineDisruptionBudget of maxUnavailable 25% (5 of 20). Each iteration
// empties the node the previous one filled, so the Machines go back and
// forth between the two nodes.
//
// It reports the time from starting kaironctl until no Machine has
// spec.nodeName NODE (ms-to-empty, seen through a watch), until kaironctl
// exits (ms-to-exit), the passes kaironctl made, and the most Machines
// disrupted at once (peak-disrupted: matching Machines not Running, or the
// target of a non-terminal MachineMigration), replayed from every watch
// event, against the budget. It fails if the peak ever exceeds the budget.
//
//	KAIRON_BIN_DIR=$PWD/bin go test ./test/e2e -run '^$' -bench EvacuateSim20 -benchtime 3x
func BenchmarkEvacuateSim20(b *testing.B) {
	const (
		machines = 20
		budget   = 5 // 25% of 20, rounded up
	)
	env := testenv.Get(b)
	ns := env.Namespace(b)
	ctx := context.Background()
	startController(b, env)
	nodeA, nodeB := ns+"-a", ns+"-b"
	agents := map[string]*agent{
		nodeA: startSimAgent(b, env, nodeA, "10.88.63.0/24", 24, "16Gi"),
		nodeB: startSimAgent(b, env, nodeB, "10.88.64.0/24", 24, "16Gi"),
	}
	deleteMachinesAtEnd(b, env, ns)
	waitNodeReady(b, env, nodeA)
	waitNodeReady(b, env, nodeB)

	selector := map[string]string{"app": ns}
	mdb := &kaironv1.MachineDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "fleet"},
		Spec:       kaironv1.MachineDisruptionBudgetSpec{Selector: selector, MaxUnavailable: ptrTo(intstr.FromString("25%"))},
	}
	if err := env.Client.Create(ctx, mdb); err != nil {
		b.Fatal(err)
	}
	var names []string
	for i := range machines {
		names = append(names, fmt.Sprintf("vm-%02d", i))
	}
	createMachinesOn(b, env, ns, nodeA, selector, names...)

	passesRE := regexp.MustCompile(`is empty: ` + strconv.Itoa(machines) + ` Machines moved off in \S+ \(([0-9]+) passes\)\n$`)
	var toEmpty, toExit []time.Duration
	peak, passes := 0, 0
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		from, to := nodeA, nodeB
		if i%2 == 1 {
			from, to = to, from
		}
		// Start from a settled cluster: every Machine Running on from,
		// and the previous iteration's sources (now to) done cleaning up.
		waitAllRunning(b, env, ns, from, machines)
		testenv.Eventually(b, time.Minute, "previous migrations cleaned up", func() (bool, string) {
			left := simInstances(agents[to])
			files := append(migrationFiles(agents[from]), migrationFiles(agents[to])...)
			return len(left) == 0 && len(files) == 0, fmt.Sprintf("instances on %s: %v; migration files: %v", to, left, files)
		})
		for _, mig := range migrationsIn(b, env, ns) {
			if !mig.Status.Phase.IsTerminal() {
				b.Fatalf("migration %s still in flight before iteration %d", mig.Name, i)
			}
		}
		rec := recordDisruptions(b, env, ns, selector)

		b.StartTimer()
		start := time.Now()
		run := runKaironctl(b, env, 6*time.Minute, "evacuate", from, "--wait", "--poll-interval", "500ms", "--timeout", "5m")
		b.StopTimer()

		if run.code != 0 {
			b.Fatalf("kaironctl evacuate %s --wait exited %d\nstdout:\n%s\nstderr:\n%s", from, run.code, run.stdout, run.stderr)
		}
		m := passesRE.FindStringSubmatch(run.stdout)
		if m == nil {
			b.Fatalf("kaironctl evacuate did not end with %q:\n%s", passesRE, tail(run.stdout, 5))
		}
		n, _ := strconv.Atoi(m[1])
		passes += n
		if strings.Contains(run.stdout, "failed") {
			b.Errorf("a migration failed:\n%s", run.stdout)
		}

		// Every Machine moved by a migration that Succeeds, none failed. The
		// node empties when the last Machines switch nodes, a moment
		// before the controller marks their migrations Succeeded; the
		// recording goes on until then.
		want := machines * (i + 1)
		testenv.Eventually(b, time.Minute, fmt.Sprintf("%d Succeeded migrations", want), func() (bool, string) {
			succeeded := 0
			for _, mig := range migrationsIn(b, env, ns) {
				switch mig.Status.Phase {
				case kaironv1.MigrationSucceeded:
					succeeded++
				case kaironv1.MigrationFailed:
					b.Fatalf("migration %s failed: %s: %s", mig.Name, mig.Status.Reason, mig.Status.Message)
				}
			}
			return succeeded == want, fmt.Sprintf("%d Succeeded", succeeded)
		})

		states := rec.replay(b, from)
		var emptyAt time.Time
		iterPeak := 0
		for _, s := range states {
			if s.matching != machines {
				b.Fatalf("the budget's selector matched %d Machines at %s, want %d", s.matching, s.at.Format(time.StampMilli), machines)
			}
			iterPeak = max(iterPeak, s.disrupted())
			if s.onNode == 0 && emptyAt.IsZero() {
				emptyAt = s.at
			}
		}
		if emptyAt.IsZero() {
			b.Fatalf("the watch never saw node %s empty, though kaironctl said so", from)
		}
		if iterPeak == 0 {
			b.Fatalf("the recording saw no Machine disrupted while 20 moved; it measures nothing")
		}
		toEmpty = append(toEmpty, emptyAt.Sub(start))
		toExit = append(toExit, run.took)
		peak = max(peak, iterPeak)
		b.Logf("iteration %d: %s -> %s, empty after %s, kaironctl exited after %s (%d passes), peak %d disrupted, %d states recorded",
			i, from, to, emptyAt.Sub(start).Round(time.Millisecond), run.took.Round(time.Millisecond), n, iterPeak, len(states))
		if st, count := migrationStages(rec); count > 0 {
			b.Logf("iteration %d: %d migrations, mean per stage: created->Running %s, ->saved %s, ->switched %s, ->reported Running %s, ->Succeeded %s",
				i, count, st[0].Round(time.Millisecond), st[1].Round(time.Millisecond), st[2].Round(time.Millisecond), st[3].Round(time.Millisecond), st[4].Round(time.Millisecond))
		}
		if iterPeak > budget {
			b.Fatalf("%d Machines disrupted at once, more than the budget's %d", iterPeak, budget)
		}
	}
	b.StopTimer()
	b.ReportMetric(meanMs(toEmpty), "ms-to-empty")
	b.ReportMetric(meanMs(toExit), "ms-to-exit")
	b.ReportMetric(float64(passes)/float64(b.N), "passes")
	b.ReportMetric(float64(peak), "peak-disrupted")
	b.ReportMetric(budget, "budget")
}

// migrationStages is where the time of the migrations recorded went, on
// average, each stage timed by when the watch saw its write: created ->
// Running (kairon-controller picked the target), -> state saved (source
// agent), -> Machine switched to the target (target agent fetched,
// restored and switched), -> reported Running by the target agent (status
// written for the switched spec), -> Succeeded (controller saw that).
// Only migrations created during the recording count.
func migrationStages(r *disruptionRecorder) (stages [5]time.Duration, count int) {
	r.mu.Lock()
	events := append([]recordedEvent(nil), r.events...)
	r.mu.Unlock()
	sort.SliceStable(events, func(i, j int) bool { return events[i].rv < events[j].rv })
	type times struct{ created, running, saved, switched, reported, succeeded time.Time }
	byMachine := map[string]*times{}
	lastNode := map[string]string{}
	for _, m := range r.machines {
		lastNode[m.Name] = m.Spec.NodeName
	}
	for _, e := range events {
		switch {
		case e.mig != nil && !e.deleted:
			mig := e.mig
			t := byMachine[mig.Spec.MachineName]
			if t == nil {
				t = &times{created: e.at}
				byMachine[mig.Spec.MachineName] = t
			}
			if t.running.IsZero() && mig.Status.Phase == kaironv1.MigrationRunning {
				t.running = e.at
			}
			if t.saved.IsZero() && mig.Annotations[kaironv1.AnnotationMigrationStateSaved] == "true" {
				t.saved = e.at
			}
			if t.succeeded.IsZero() && mig.Status.Phase == kaironv1.MigrationSucceeded {
				t.succeeded = e.at
			}
		case e.machine != nil && !e.deleted:
			m := e.machine
			if prev, ok := lastNode[m.Name]; ok && prev != m.Spec.NodeName {
				if t := byMachine[m.Name]; t != nil && t.switched.IsZero() {
					t.switched = e.at
				}
			}
			lastNode[m.Name] = m.Spec.NodeName
			if t := byMachine[m.Name]; t != nil && !t.switched.IsZero() && t.reported.IsZero() &&
				m.Status.Phase == kaironv1.MachineRunning && m.Status.ObservedGeneration == m.Generation {
				t.reported = e.at
			}
		}
	}
	for _, t := range byMachine {
		if t.running.IsZero() || t.saved.IsZero() || t.switched.IsZero() || t.reported.IsZero() || t.succeeded.IsZero() {
			continue
		}
		stages[0] += t.running.Sub(t.created)
		stages[1] += t.saved.Sub(t.running)
		stages[2] += t.switched.Sub(t.saved)
		stages[3] += t.reported.Sub(t.switched)
		stages[4] += t.succeeded.Sub(t.reported)
		count++
	}
	if count > 0 {
		for i := range stages {
			stages[i] /= time.Duration(count)
		}
	}
	return stages, count
}

func meanMs(ds []time.Duration) float64 {
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return ms(sum) / float64(len(ds))
}
