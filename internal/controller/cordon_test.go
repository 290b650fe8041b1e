package controller

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
)

// cordonRetryInterval is the test's -cordon-evacuate-min-retry-interval:
// short, so retries come within moments. The attempted-at stamp has whole
// seconds, so a retry waits this plus attemptStampPrecision, and stamps of
// one Machine are at least a second apart whatever the interval: that
// nothing is tried before its interval is TestCordonEvacuationRetryInterval's
// to show, with a clock it drives.
const cordonRetryInterval = 500 * time.Millisecond

// cordonQuietWindow is how long a test watches for cordon evacuation to do
// what it must not: time for a retry to have come, and a second more.
const cordonQuietWindow = cordonRetryInterval + attemptStampPrecision + time.Second

// Cordoning a node with cordon evacuation on gives its Machines migrations
// within their budget; a blocked Machine is stamped and tried again once
// its interval has passed; a Machine with a migration in flight never gets
// a second one; an uncordoned node is left alone.
func TestCordonEvacuation(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	nodeA := createNode(t, env, ns, "a", 16, "16Gi")
	nodeB := createNode(t, env, ns, "b", 16, "16Gi")

	web := map[string]string{"app": ns}
	for _, name := range []string{"web-1", "web-2", "web-3"} {
		m := createMachine(t, env, ns, name, 1, "256Mi", func(m *kaironv1.Machine) {
			m.Labels = web
			m.Spec.NodeName = nodeA.Name
		})
		setMachinePhase(t, env, m, kaironv1.MachineRunning)
	}
	other := createMachine(t, env, ns, "other", 1, "256Mi", func(m *kaironv1.Machine) { m.Spec.NodeName = nodeB.Name })
	setMachinePhase(t, env, other, kaironv1.MachineRunning)
	if err := env.Client.Create(ctx, &kaironv1.MachineDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web-tier"},
		Spec:       kaironv1.MachineDisruptionBudgetSpec{Selector: web, MinAvailable: ptr.To(intstr.FromInt32(2))},
	}); err != nil {
		t.Fatal(err)
	}

	startControllers(t, env, ns, Options{
		CordonEvacuate: true,
		// auto: these stand-in nodes name no backend, so every migration
		// is cold, and says why.
		CordonEvacuateStrategy:         CordonEvacuateAuto,
		CordonEvacuateMinRetryInterval: cordonRetryInterval,
	})

	// Nothing is cordoned yet: nothing happens.
	testenv.Consistently(t, time.Second, "no migrations before any cordon", func() (bool, string) {
		migs := listMigrations(t, env, ns)
		return len(migs) == 0, describeMigrations(migs)
	})

	cordon(t, env, nodeA.Name, true)

	var first kaironv1.MachineMigration
	eventually(t, "one migration, for web-1, and every Machine on the node stamped", func() (bool, string) {
		migs := listMigrations(t, env, ns)
		stamped := 0
		for _, name := range []string{"web-1", "web-2", "web-3"} {
			if attemptedAt(t, env, ns, name) != "" {
				stamped++
			}
		}
		if len(migs) == 1 {
			first = migs[0]
		}
		return len(migs) == 1 && stamped == 3, fmt.Sprintf("%d stamped; migrations %s", stamped, describeMigrations(migs))
	})
	if first.Spec.MachineName != "web-1" || first.Spec.Strategy != kaironv1.MigrationCold ||
		!strings.HasPrefix(first.Name, "web-1-evac-") || first.Labels[kaironv1.LabelEvacuatedNode] != nodeA.Name {
		t.Errorf("migration %s: machine %s strategy %s labels %v", first.Name, first.Spec.MachineName, first.Spec.Strategy, first.Labels)
	}
	if first.Annotations[kaironv1.AnnotationMigrationRequestedStrategy] != "auto" ||
		first.Annotations[kaironv1.AnnotationMigrationStrategyReason] != kaironv1.StrategyReasonSourceCannotSendLive || first.Spec.TargetNode != "" {
		t.Errorf("migration %s: auto's choice %v, target %q; want cold for want of a backend, target left to the scheduler", first.Name, first.Annotations, first.Spec.TargetNode)
	}
	stamp := attemptedAt(t, env, ns, "web-2")
	if _, err := time.Parse(time.RFC3339, stamp); err != nil {
		t.Errorf("attempted-at %q is not RFC 3339: %v", stamp, err)
	}
	wantBlocked := "budget " + ns + "/web-tier allows no more disruptions (3 healthy, 2 desired, 0 allowed; 1 already spent in this pass)"
	eventually(t, "events about the created and the blocked migrations", func() (bool, string) {
		created := machineEvents(t, env, ns, "web-1", corev1.EventTypeNormal, kaironv1.EventReasonEvacuationMigrationCreated)
		blocked := machineEvents(t, env, ns, "web-2", corev1.EventTypeWarning, kaironv1.EventReasonEvacuationBlocked)
		ok := len(created) > 0 && strings.Contains(created[0], first.Name) &&
			len(blocked) > 0 && strings.Contains(blocked[0], "Node "+nodeA.Name+" is cordoned") && strings.Contains(blocked[0], wantBlocked)
		return ok, fmt.Sprintf("created %q, blocked %q", created, blocked)
	})

	// While web-1's migration is in flight, web-2 and web-3 stay blocked
	// (2 healthy, 2 desired) and are tried again once their interval has
	// passed; web-1 gets no second migration and is not tried again.
	firstTries := map[string]string{}
	for _, name := range []string{"web-1", "web-2", "web-3"} {
		firstTries[name] = attemptedAt(t, env, ns, name)
	}
	stillOneMigration := func() {
		t.Helper()
		if migs := listMigrations(t, env, ns); len(migs) != 1 {
			t.Fatalf("while web-1's migration is in flight: %s", describeMigrations(migs))
		}
		if s := attemptedAt(t, env, ns, "web-1"); s != firstTries["web-1"] {
			t.Fatalf("web-1, whose migration is in flight, was tried again at %s (first at %s)", s, firstTries["web-1"])
		}
	}
	eventually(t, "web-2 and web-3 tried again", func() (bool, string) {
		stillOneMigration()
		again := 0
		tries := map[string]string{}
		for _, name := range []string{"web-2", "web-3"} {
			tries[name] = attemptedAt(t, env, ns, name)
			if tries[name] != firstTries[name] {
				again++
			}
		}
		return again == 2, fmt.Sprintf("first tries %v, now %v", firstTries, tries)
	})
	stillOneMigration()
	eventually(t, "a blocked event naming the in-flight numbers", func() (bool, string) {
		blocked := machineEvents(t, env, ns, "web-2", corev1.EventTypeWarning, kaironv1.EventReasonEvacuationBlocked)
		return strings.Contains(strings.Join(blocked, "\n"), "(2 healthy, 2 desired, 0 allowed)"), fmt.Sprintf("%q", blocked)
	})

	// Now play the node agents: carry out every migration, one at a time
	// as the budget lets them come. The node empties, and never more than
	// one web Machine is disrupted at once.
	stop := testenv.RunMigrations(t, env, ns, nodeB.Name, moveTime)
	testenv.Eventually(t, 3*time.Minute, "node "+nodeA.Name+" to empty", func() (bool, string) {
		var on []string
		for _, m := range listMachines(t, env, ns) {
			if m.Spec.NodeName == nodeA.Name {
				on = append(on, m.Name)
			}
		}
		return len(on) == 0, fmt.Sprintf("still on it: %v; migrations %s", on, describeMigrations(listMigrations(t, env, ns)))
	})
	if peak := stop(); peak > 1 {
		t.Errorf("%d web Machines were being migrated at once; the budget allows 1", peak)
	}

	// Node b was never cordoned: nothing there is touched, not even the
	// web Machines that arrived on it, and each web Machine had one cold
	// migration.
	testenv.Consistently(t, cordonQuietWindow, "one migration per web Machine, and node b left alone", func() (bool, string) {
		migs := listMigrations(t, env, ns)
		ok := len(migs) == 3
		for _, mig := range migs {
			ok = ok && mig.Spec.MachineName != "other" && mig.Spec.Strategy == kaironv1.MigrationCold
		}
		stamp := attemptedAt(t, env, ns, "other")
		return ok && stamp == "", fmt.Sprintf("migrations %s; other stamped %q", describeMigrations(migs), stamp)
	})
}

// Uncordoning stops the evacuation: the Machines still there stay.
func TestCordonEvacuationUncordon(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	nodeA := createNode(t, env, ns, "a", 16, "16Gi")
	m := createMachine(t, env, ns, "lone", 1, "256Mi", func(m *kaironv1.Machine) { m.Spec.NodeName = nodeA.Name })
	setMachinePhase(t, env, m, kaironv1.MachineRunning)
	var controllersCache cache.Cache
	startControllers(t, env, ns, Options{CordonEvacuate: true, CordonEvacuateMinRetryInterval: cordonRetryInterval}, func(o *ctrl.Options) {
		o.NewCache = func(cfg *rest.Config, opts cache.Options) (cache.Cache, error) {
			c, err := cache.New(cfg, opts)
			controllersCache = c
			return c, err
		}
	})

	cordon(t, env, nodeA.Name, true)
	eventually(t, "a migration for the lone Machine", func() (bool, string) {
		migs := listMigrations(t, env, ns)
		return len(migs) == 1, describeMigrations(migs)
	})
	// The migration fails; uncordoned, the node keeps its Machine and no
	// new migration comes, however long the interval has passed.
	cordon(t, env, nodeA.Name, false)
	// Uncordoned as the controllers see it: their cache of Nodes may lag
	// the API server (by over a second at load 30), and a pass that still
	// saw the node cordoned rightly tried the Machine again.
	eventually(t, "the controllers' cache to see node a uncordoned", func() (bool, string) {
		var n corev1.Node
		if err := controllersCache.Get(context.Background(), client.ObjectKey{Name: nodeA.Name}, &n); err != nil {
			return false, err.Error()
		}
		return !n.Spec.Unschedulable, "still cordoned"
	})
	// The migration controller may write it meanwhile: read it again on a
	// conflict.
	eventually(t, "the migration marked Failed", func() (bool, string) {
		mig := listMigrations(t, env, ns)[0]
		mig.Status.Phase = kaironv1.MigrationFailed
		err := env.Client.Status().Update(context.Background(), &mig)
		return err == nil, fmt.Sprint(err)
	})
	testenv.Consistently(t, cordonQuietWindow, "no new migration after uncordoning", func() (bool, string) {
		migs := listMigrations(t, env, ns)
		return len(migs) == 1, describeMigrations(migs)
	})
}

// kairon-controller refuses -cordon-evacuate-strategy live.
func TestCordonEvacuationNeverLive(t *testing.T) {
	env := testenv.Get(t)
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:                 env.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             testControllerConfig(),
	})
	if err != nil {
		t.Fatal(err)
	}
	err = SetupWithManager(mgr, Options{CordonEvacuate: true, CordonEvacuateStrategy: "live"})
	if err == nil || !strings.Contains(err.Error(), "never insists on live migrations") {
		t.Errorf("SetupWithManager with strategy live: %v", err)
	}
}

func cordon(t *testing.T, env *testenv.Env, node string, on bool) {
	t.Helper()
	var n corev1.Node
	if err := env.Client.Get(context.Background(), client.ObjectKey{Name: node}, &n); err != nil {
		t.Fatal(err)
	}
	orig := n.DeepCopy()
	n.Spec.Unschedulable = on
	if err := env.Client.Patch(context.Background(), &n, client.MergeFrom(orig)); err != nil {
		t.Fatalf("cordoning %s: %v", node, err)
	}
}

func listMigrations(t *testing.T, env *testenv.Env, ns string) []kaironv1.MachineMigration {
	t.Helper()
	var l kaironv1.MachineMigrationList
	if err := env.Client.List(context.Background(), &l, client.InNamespace(ns)); err != nil {
		t.Fatalf("listing migrations: %v", err)
	}
	sort.Slice(l.Items, func(i, j int) bool { return l.Items[i].Name < l.Items[j].Name })
	return l.Items
}

func describeMigrations(migs []kaironv1.MachineMigration) string {
	parts := make([]string, len(migs))
	for i, m := range migs {
		parts[i] = fmt.Sprintf("%s(%s,%q)", m.Name, m.Spec.MachineName, m.Status.Phase)
	}
	return "[" + strings.Join(parts, " ") + "]"
}

func attemptedAt(t *testing.T, env *testenv.Env, ns, name string) string {
	t.Helper()
	return getMachine(t, env, ns, name).Annotations[kaironv1.AnnotationCordonEvacuateAttemptedAt]
}

// machineEvents returns the notes of the events of type typ (Normal,
// Warning) with reason about Machine name, oldest first.
func machineEvents(t *testing.T, env *testenv.Env, ns, name, typ, reason string) []string {
	t.Helper()
	var l eventsv1.EventList
	if err := env.Client.List(context.Background(), &l, client.InNamespace(ns)); err != nil {
		t.Fatalf("listing events: %v", err)
	}
	sort.Slice(l.Items, func(i, j int) bool { return l.Items[i].EventTime.Before(&l.Items[j].EventTime) })
	var notes []string
	for _, e := range l.Items {
		if e.Regarding.Kind == "Machine" && e.Regarding.Name == name && e.Type == typ && e.Reason == reason {
			notes = append(notes, e.Note)
		}
	}
	return notes
}

// moveTime is how long the stand-in node agents of testenv.RunMigrations take
// over a migration. It stands for the time a real move takes, during which
// passes see the migration in flight and, were the budget not kept, would
// start others beside it.
const moveTime = 300 * time.Millisecond
