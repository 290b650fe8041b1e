package controller

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
)

// runningMachine creates a Machine with labels, lets the scheduler place
// it and plays its node agent: Running.
func runningMachine(t *testing.T, env *testenv.Env, ns, name string, labels map[string]string) *kaironv1.Machine {
	t.Helper()
	createMachine(t, env, ns, name, 1, "256Mi", func(m *kaironv1.Machine) { m.Labels = labels })
	m := waitScheduled(t, env, ns, name)
	setMachinePhase(t, env, m, kaironv1.MachineRunning)
	return m
}

// scheduleSnapshots are the schedule's MachineSnapshots by Machine, names
// sorted.
func scheduleSnapshots(t *testing.T, env *testenv.Env, ns, schedule string) map[string][]kaironv1.MachineSnapshot {
	t.Helper()
	var list kaironv1.MachineSnapshotList
	if err := env.Client.List(context.Background(), &list, client.InNamespace(ns), client.MatchingLabels{kaironv1.LabelSnapshotSchedule: schedule}); err != nil {
		t.Fatal(err)
	}
	by := map[string][]kaironv1.MachineSnapshot{}
	for _, s := range list.Items {
		if s.DeletionTimestamp == nil {
			by[s.Spec.MachineName] = append(by[s.Spec.MachineName], s)
		}
	}
	for _, snaps := range by {
		sort.Slice(snaps, func(i, j int) bool { return snaps[i].Name < snaps[j].Name })
	}
	return by
}

func snapshotNames(by map[string][]kaironv1.MachineSnapshot) string {
	var parts []string
	for m, snaps := range by {
		var names []string
		for _, s := range snaps {
			names = append(names, s.Name+"="+string(s.Status.Phase))
		}
		parts = append(parts, m+": "+strings.Join(names, ","))
	}
	sort.Strings(parts)
	return strings.Join(parts, "; ")
}

// takeSnapshot plays the node agent of the snapshot's node: it reports the
// snapshot Ready, taken at the clock's time, in store.
func reportSnapshotReady(t *testing.T, env *testenv.Env, snap *kaironv1.MachineSnapshot, at time.Time, store string) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur := &kaironv1.MachineSnapshot{}
		if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(snap), cur); err != nil {
			return err
		}
		base := cur.DeepCopy()
		taken := metav1.NewTime(at)
		memory := resource.MustParse("256Mi")
		cur.Status.Phase, cur.Status.TakenAt, cur.Status.Store, cur.Status.File = kaironv1.SnapshotReady, &taken, store, cur.Name+".state"
		cur.Status.SizeBytes, cur.Status.PauseMillis, cur.Status.CPU, cur.Status.Memory = 64<<20, 120, 1, &memory
		return env.Client.Status().Patch(context.Background(), cur, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}))
	})
	if err != nil {
		t.Fatalf("reporting %s Ready: %v", snap.Name, err)
	}
}

// tick makes the schedule controller look at the schedule now, as the
// passing of its next slot would.
func tick(t *testing.T, env *testenv.Env, s *kaironv1.SnapshotSchedule, n int) {
	t.Helper()
	if err := env.Client.Patch(context.Background(), s, client.RawPatch("application/merge-patch+json",
		fmt.Appendf(nil, `{"metadata":{"annotations":{"test/tick":"%d"}}}`, n))); err != nil {
		t.Fatal(err)
	}
}

// A SnapshotSchedule driven by a test clock: each hourly slot snapshots the
// matching Running Machines (not the one that is not Running, nor the one
// the selector misses); retention keeps exactly 2 Ready per Machine once
// the agent reported them; a suspended schedule takes none; snapshots are
// handed to their Machine's node and labelled with it; the metrics count
// them.
func TestSnapshotScheduleRunsAndPrunes(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	clock := newTestClock(time.Now())
	startControllers(t, env, ns, Options{snapshotClock: clock.Now})
	createNode(t, env, ns, "n1", 8, "8Gi")

	web1 := runningMachine(t, env, ns, "web-1", map[string]string{"tier": "web"})
	runningMachine(t, env, ns, "web-2", map[string]string{"tier": "web"})
	createMachine(t, env, ns, "web-booting", 1, "256Mi", func(m *kaironv1.Machine) { m.Labels = map[string]string{"tier": "web"} })
	runningMachine(t, env, ns, "db", map[string]string{"tier": "db"})
	readyBefore := testutil.ToFloat64(machineSnapshots.WithLabelValues(string(kaironv1.SnapshotReady)))

	s := &kaironv1.SnapshotSchedule{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "hourly"},
		Spec:       kaironv1.SnapshotScheduleSpec{Selector: map[string]string{"tier": "web"}, Schedule: "0 * * * *", Retention: 2},
	}
	if err := env.Client.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the schedule's status before any slot", func() (bool, string) {
		cur := getObject[kaironv1.SnapshotSchedule](t, env, ns, "hourly")
		c := meta.FindStatusCondition(cur.Status.Conditions, kaironv1.ConditionReady.String())
		return cur.Status.MatchingMachines == 3 && cur.Status.NextScheduleTime != nil && cur.Status.LastScheduleTime == nil &&
			c != nil && c.Reason == kaironv1.ScheduleReasonScheduled, fmtJSON(cur.Status)
	})
	if n := len(scheduleSnapshots(t, env, ns, "hourly")); n != 0 {
		t.Fatalf("%d Machines snapshotted before the first slot", n)
	}

	for run := 1; run <= 4; run++ {
		clock.Step(time.Hour)
		tick(t, env, s, run)
		var by map[string][]kaironv1.MachineSnapshot
		eventually(t, fmt.Sprintf("run %d: a new snapshot of web-1 and web-2", run), func() (bool, string) {
			by = scheduleSnapshots(t, env, ns, "hourly")
			pending := 0
			for _, m := range []string{"web-1", "web-2"} {
				for _, snap := range by[m] {
					if snap.Status.Phase != kaironv1.SnapshotReady {
						pending++
					}
				}
			}
			return pending == 2 && len(by) == 2, snapshotNames(by)
		})
		if _, ok := by["web-booting"]; ok {
			t.Errorf("run %d: the Machine that is not Running was snapshotted", run)
		}
		for _, m := range []string{"web-1", "web-2"} {
			for _, snap := range by[m] {
				if snap.Status.Phase == kaironv1.SnapshotReady {
					continue
				}
				if snap.Labels[kaironv1.LabelSnapshotMachine] != m {
					t.Errorf("%s: label %s=%q, want %s", snap.Name, kaironv1.LabelSnapshotMachine, snap.Labels[kaironv1.LabelSnapshotMachine], m)
				}
				node := getMachine(t, env, ns, m).Spec.NodeName
				eventually(t, snap.Name+" handed to node "+node, func() (bool, string) {
					cur := getObject[kaironv1.MachineSnapshot](t, env, ns, snap.Name)
					return cur.Status.Node == node && cur.Status.Phase == kaironv1.SnapshotPending, fmtJSON(cur.Status)
				})
				reportSnapshotReady(t, env, &snap, clock.Now(), "node."+node)
			}
		}
		want := min(run, 2)
		eventually(t, fmt.Sprintf("run %d: exactly %d Ready snapshots of each Machine", run, want), func() (bool, string) {
			by = scheduleSnapshots(t, env, ns, "hourly")
			cur := getObject[kaironv1.SnapshotSchedule](t, env, ns, "hourly")
			return len(by["web-1"]) == want && len(by["web-2"]) == want && int(cur.Status.Snapshots) == 2*want, snapshotNames(by) + " " + fmtJSON(cur.Status)
		})
	}
	// The newest two are kept: those of runs 3 and 4.
	by := scheduleSnapshots(t, env, ns, "hourly")
	for _, m := range []string{"web-1", "web-2"} {
		for _, snap := range by[m] {
			if age := clock.Now().Sub(snap.Status.TakenAt.Time); age > time.Hour+time.Minute {
				t.Errorf("%s kept, taken %s before the last run: an older one than the newest two", snap.Name, age)
			}
		}
	}
	if got := testutil.ToFloat64(machineSnapshots.WithLabelValues(string(kaironv1.SnapshotReady))) - readyBefore; got < 8 {
		t.Errorf("kairon_machine_snapshots_total{phase=Ready} went up by %v, want at least 8", got)
	}

	// Suspended: the next slots take nothing.
	cur := getObject[kaironv1.SnapshotSchedule](t, env, ns, "hourly")
	base := cur.DeepCopy()
	cur.Spec.Suspend = true
	if err := env.Client.Patch(ctx, cur, client.MergeFrom(base)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the schedule Suspended", func() (bool, string) {
		cur = getObject[kaironv1.SnapshotSchedule](t, env, ns, "hourly")
		c := meta.FindStatusCondition(cur.Status.Conditions, kaironv1.ConditionReady.String())
		return c != nil && c.Reason == kaironv1.ScheduleReasonSuspended && cur.Status.NextScheduleTime == nil, fmtJSON(cur.Status)
	})
	for run := 5; run <= 6; run++ {
		clock.Step(time.Hour)
		tick(t, env, cur, run)
	}
	// A snapshot taken would show within gcWindow.
	testenv.Consistently(t, gcWindow, "a suspended schedule to keep its snapshots", func() (bool, string) {
		by := scheduleSnapshots(t, env, ns, "hourly")
		return len(by["web-1"]) == 2 && len(by["web-2"]) == 2, snapshotNames(by)
	})

	// A snapshot of web-1 by hand is handed out too, and is none of the
	// schedule's business.
	manual := &kaironv1.MachineSnapshot{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "by-hand"}, Spec: kaironv1.MachineSnapshotSpec{MachineName: web1.Name}}
	if err := env.Client.Create(ctx, manual); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the snapshot by hand handed to the node and labelled", func() (bool, string) {
		got := getObject[kaironv1.MachineSnapshot](t, env, ns, "by-hand")
		return got.Status.Node == web1.Spec.NodeName && got.Labels[kaironv1.LabelSnapshotMachine] == web1.Name, fmtJSON(got)
	})
	// One of a Machine that is not Running waits, saying so.
	waiting := &kaironv1.MachineSnapshot{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "of-booting"}, Spec: kaironv1.MachineSnapshotSpec{MachineName: "web-booting"}}
	if err := env.Client.Create(ctx, waiting); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the snapshot of a Machine that is not Running waits", func() (bool, string) {
		got := getObject[kaironv1.MachineSnapshot](t, env, ns, "of-booting")
		c := meta.FindStatusCondition(got.Status.Conditions, kaironv1.ConditionReady.String())
		return got.Status.Phase == kaironv1.SnapshotPending && got.Status.Node == "" && c != nil &&
			c.Reason == kaironv1.SnapshotReasonWaitingForMachine && strings.Contains(got.Status.Message, "once it runs"), fmtJSON(got.Status)
	})
}

// A Machine restored from a snapshot waits, Pending with SnapshotNotReady,
// until the snapshot is Ready, and is then placed on a node whose
// snapshot-store label is the snapshot's store; when none of those can take
// it, on a node that can fetch the file from the snapshot's node.
func TestRestoredMachineWaitsForItsSnapshotAndStore(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	startControllers(t, env, ns, Options{})
	withStore := func(store string) func(*corev1.Node) {
		return func(n *corev1.Node) { n.Labels[kaironv1.LabelNodeSnapshotStore] = store }
	}
	// The big one would win on room; only the small one reaches the store.
	createNode(t, env, ns, "big", 16, "16Gi", withStore("elsewhere"))
	small := createNode(t, env, ns, "small", 2, "2Gi", withStore(ns+"-shared"))

	src := runningMachine(t, env, ns, "src", nil)
	snap := &kaironv1.MachineSnapshot{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "snap"}, Spec: kaironv1.MachineSnapshotSpec{MachineName: src.Name}}
	if err := env.Client.Create(ctx, snap); err != nil {
		t.Fatal(err)
	}
	createMachine(t, env, ns, "restored", 1, "256Mi", func(m *kaironv1.Machine) {
		m.Spec.RestoreFrom = &kaironv1.RestoreSource{SnapshotName: "snap"}
	})
	waitPending(t, env, ns, "restored", kaironv1.MachineReasonSnapshotNotReady, "spec.restoreFrom: MachineSnapshot snap is Pending, not Ready")
	createMachine(t, env, ns, "no-such", 1, "256Mi", func(m *kaironv1.Machine) {
		m.Spec.RestoreFrom = &kaironv1.RestoreSource{SnapshotName: "nothing"}
	})
	waitPending(t, env, ns, "no-such", kaironv1.MachineReasonSnapshotNotReady, "spec.restoreFrom: MachineSnapshot nothing not found")

	reportSnapshotReady(t, env, snap, time.Now(), ns+"-shared")
	m := waitScheduled(t, env, ns, "restored")
	if m.Spec.NodeName != small.Name {
		t.Errorf("restored placed on %s, want %s, the only node of store %s", m.Spec.NodeName, small.Name, ns+"-shared")
	}

	// No node of the store can take it (its one node is cordoned): a node
	// that can fetch the file from it does, while it is up; one without a
	// migration endpoint (big) cannot.
	// The agent publishes its port; kairon-controller makes it the endpoint.
	withPort := func(n *corev1.Node) { n.Annotations = map[string]string{kaironv1.AnnotationNodeMigrationPort: "10251"} }
	withAddress := func(n *corev1.Node) {
		base := n.DeepCopy()
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}}
		if err := env.Client.Status().Patch(ctx, n, client.MergeFrom(base)); err != nil {
			t.Fatal(err)
		}
	}
	owner := createNode(t, env, ns, "owner", 4, "4Gi", withStore("node."+ns+"-owner"), withPort, func(n *corev1.Node) { n.Spec.Unschedulable = true })
	withAddress(owner)
	fetcher := createNode(t, env, ns, "fetcher", 2, "2Gi", withPort)
	withAddress(fetcher)
	remote := &kaironv1.MachineSnapshot{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "remote"}, Spec: kaironv1.MachineSnapshotSpec{MachineName: src.Name}}
	if err := env.Client.Create(ctx, remote); err != nil {
		t.Fatal(err)
	}
	reportSnapshotReady(t, env, remote, time.Now(), "node."+ns+"-owner")
	remote = getObject[kaironv1.MachineSnapshot](t, env, ns, "remote")
	base := remote.DeepCopy()
	remote.Status.Node = owner.Name
	if err := env.Client.Status().Patch(ctx, remote, client.MergeFrom(base)); err != nil {
		t.Fatal(err)
	}
	createMachine(t, env, ns, "from-remote", 1, "256Mi", func(m *kaironv1.Machine) {
		m.Spec.RestoreFrom = &kaironv1.RestoreSource{SnapshotName: "remote"}
	})
	if m := waitScheduled(t, env, ns, "from-remote"); m.Spec.NodeName != fetcher.Name {
		t.Errorf("from-remote placed on %s, want %s, the node that can fetch it from %s", m.Spec.NodeName, fetcher.Name, owner.Name)
	}

	// A store no node reaches leaves it Pending, saying which store.
	lost := &kaironv1.MachineSnapshot{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "lost"}, Spec: kaironv1.MachineSnapshotSpec{MachineName: src.Name}}
	if err := env.Client.Create(ctx, lost); err != nil {
		t.Fatal(err)
	}
	reportSnapshotReady(t, env, lost, time.Now(), "node.gone")
	createMachine(t, env, ns, "from-lost", 1, "256Mi", func(m *kaironv1.Machine) {
		m.Spec.RestoreFrom = &kaironv1.RestoreSource{SnapshotName: "lost"}
	})
	eventually(t, "from-lost Pending, no node reaching store node.gone", func() (bool, string) {
		got := getMachine(t, env, ns, "from-lost")
		return got.Spec.NodeName == "" && strings.Contains(got.Status.Message, "nodes reach store node.gone of MachineSnapshot lost") &&
			strings.Contains(got.Status.Message, "cannot send it"), describeMachine(got)
	})
}
