package e2e

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/controller"
	"github.com/zyvor/kairon/internal/rules"
	"github.com/zyvor/kairon/internal/testenv"
)

// TestCordonEvacuationWithRealMigrations: kairon-controller with
// -cordon-evacuate -cordon-evacuate-strategy auto empties a cordoned node by
// itself, through the real executor (two sim agents that both accept
// migrations), one Machine at a time as the budget allows, one migration
// per Machine, each Machine marked with the attempt annotation. Both nodes
// can migrate live, so auto moves every Machine live and says why in the
// migration's StrategyChosen condition.
func TestCordonEvacuationWithRealMigrations(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	source, target := ns+"-src", ns+"-dst"
	startControllerWith(t, env, "-interval", "1s", "-cordon-evacuate",
		"-cordon-evacuate-strategy", "auto", "-cordon-evacuate-min-retry-interval", "2s")
	startSimAgent(t, env, source, "10.88.63.0/24", 4, "4Gi")
	startSimAgent(t, env, target, "10.88.64.0/24", 4, "4Gi")
	deleteMachinesAtEnd(t, env, ns)
	waitNodeReady(t, env, source)
	waitNodeReady(t, env, target)

	web := map[string]string{"app": ns}
	createMachinesOn(t, env, ns, source, web, "web-1", "web-2", "web-3")
	budget := &kaironv1.MachineDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web-tier"},
		Spec:       kaironv1.MachineDisruptionBudgetSpec{Selector: web, MinAvailable: ptrTo(intstr.FromInt32(2))},
	}
	if err := env.Client.Create(ctx, budget); err != nil {
		t.Fatal(err)
	}
	waitAllRunning(t, env, ns, source, 3)
	if migs := migrationsIn(t, env, ns); len(migs) != 0 {
		t.Fatalf("migrations before the cordon: %s", describeMigrations(migs))
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("objects:\n%s", kubectlQuiet(env, "-n", ns, "get", "machines,machinemigrations,machinedisruptionbudgets", "-o", "wide"))
		}
	})
	rec := recordDisruptions(t, env, ns, web)

	env.Kubectl(t, "cordon", source)
	waitAllRunning(t, env, ns, target, 3)

	// A Machine runs on the target a moment before its migration records
	// that it succeeded.
	var migs []kaironv1.MachineMigration
	testenv.Eventually(t, time.Minute, "every migration to end", func() (bool, string) {
		migs = migrationsIn(t, env, ns)
		for _, m := range migs {
			if m.Status.Phase != kaironv1.MigrationSucceeded && m.Status.Phase != kaironv1.MigrationFailed {
				return false, describeMigrations(migs)
			}
		}
		return len(migs) >= 3, describeMigrations(migs)
	})
	if len(migs) != 3 {
		t.Errorf("%d migrations, want exactly one per Machine: %s", len(migs), describeMigrations(migs))
	}
	seen := map[string]bool{}
	for _, mig := range migs {
		if mig.Spec.Strategy != kaironv1.MigrationLive || mig.Spec.TargetNode != target {
			t.Errorf("migration %s has strategy %q to %q: auto must move live to %s, where both nodes can", mig.Name, mig.Spec.Strategy, mig.Spec.TargetNode, target)
		}
		checkStrategyChosen(t, &mig, kaironv1.StrategyReasonLive, "strategy auto chose live: machine "+mig.Spec.MachineName+" runs, node "+source+" sends it and node "+target+" receives it live")
		if mig.Status.DowntimeMillis <= 0 {
			t.Errorf("migration %s: downtime %d ms, want the source's measure", mig.Name, mig.Status.DowntimeMillis)
		}
		if mig.Status.Phase != kaironv1.MigrationSucceeded || mig.Status.SourceNode != source || mig.Status.TargetNode != target {
			t.Errorf("migration %s: %s", mig.Name, describeMigrations([]kaironv1.MachineMigration{mig}))
		}
		if seen[mig.Spec.MachineName] {
			t.Errorf("a second migration for %s", mig.Spec.MachineName)
		}
		seen[mig.Spec.MachineName] = true
	}
	var machines kaironv1.MachineList
	if err := env.Client.List(ctx, &machines, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, m := range machines.Items {
		at, err := time.Parse(time.RFC3339, m.Annotations[kaironv1.AnnotationCordonEvacuateAttemptedAt])
		if err != nil {
			t.Errorf("machine %s: annotation %s = %q: %v", m.Name, kaironv1.AnnotationCordonEvacuateAttemptedAt,
				m.Annotations[kaironv1.AnnotationCordonEvacuateAttemptedAt], err)
		} else if time.Since(at) > 5*time.Minute {
			t.Errorf("machine %s: attempt recorded at %s, before this test", m.Name, at)
		}
	}

	states := rec.replay(t, source)
	fewest, most := 3, 0
	for _, s := range states {
		fewest = min(fewest, s.healthy)
		most = max(most, s.inFlight)
	}
	t.Logf("%d states recorded; fewest healthy %d, most migrations in flight %d", len(states), fewest, most)
	if fewest < 2 {
		t.Errorf("only %d of 3 Machines were healthy at one point: the budget (minAvailable 2) was broken", fewest)
	}
	if most != 1 {
		t.Errorf("at most %d migrations were in flight, want exactly 1 (the budget allows one at a time)", most)
	}
	if got := strings.TrimSpace(env.Kubectl(t, "get", "node", source, "-o", "jsonpath={.spec.unschedulable}")); got != "true" {
		t.Errorf("source node unschedulable=%q after evacuation, want it still cordoned", got)
	}
}

// TestCordonEvacuationAutoFallsBackToCold: with strategy auto, a Machine
// whose only possible target cannot receive a live migration (its agent
// runs without --migration-listen, so its Node advertises no migration
// endpoint) moves cold, and the migration's StrategyChosen condition says
// so and why; the Machine runs on the target afterwards.
func TestCordonEvacuationAutoFallsBackToCold(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	source, target := ns+"-src", ns+"-dst"
	startControllerWith(t, env, "-interval", "1s", "-cordon-evacuate",
		"-cordon-evacuate-strategy", "auto", "-cordon-evacuate-min-retry-interval", "2s")
	startSimAgent(t, env, source, "10.88.67.0/24", 4, "4Gi")
	// The last --migration-listen wins: none.
	startSimAgent(t, env, target, "10.88.68.0/24", 4, "4Gi", "--migration-listen=")
	deleteMachinesAtEnd(t, env, ns)
	waitNodeReady(t, env, source)
	waitNodeReady(t, env, target)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("objects:\n%s", kubectlQuiet(env, "-n", ns, "get", "machines,machinemigrations", "-o", "yaml"))
		}
	})
	createMachinesOn(t, env, ns, source, nil, "worker")
	waitAllRunning(t, env, ns, source, 1)
	// The source advertises its endpoint, the target none: that is the
	// difference auto sees.
	endpoint := func(name string) string {
		var n corev1.Node
		if err := env.Client.Get(context.Background(), client.ObjectKey{Name: name}, &n); err != nil {
			return err.Error()
		}
		return n.Annotations[kaironv1.AnnotationNodeMigrationEndpoint]
	}
	testenv.Eventually(t, 30*time.Second, "the source's migration endpoint, and none on the target", func() (bool, string) {
		src, dst := endpoint(source), endpoint(target)
		return strings.Contains(src, ":") && dst == "", "source " + src + ", target " + dst
	})

	env.Kubectl(t, "cordon", source)
	waitAllRunning(t, env, ns, target, 1)

	// The Machine runs on the target a moment before its migration
	// records that it succeeded.
	var migs []kaironv1.MachineMigration
	testenv.Eventually(t, time.Minute, "the migration to end", func() (bool, string) {
		migs = migrationsIn(t, env, ns)
		return len(migs) == 1 && (migs[0].Status.Phase == kaironv1.MigrationSucceeded || migs[0].Status.Phase == kaironv1.MigrationFailed), describeMigrations(migs)
	})
	mig := migs[0]
	if mig.Spec.Strategy != kaironv1.MigrationCold || mig.Spec.TargetNode != "" ||
		mig.Status.Phase != kaironv1.MigrationSucceeded || mig.Status.TargetNode != target {
		t.Errorf("migration %s: strategy %q to %q; %s; want a cold move to %s", mig.Name, mig.Spec.Strategy, mig.Spec.TargetNode,
			describeMigrations(migs), target)
	}
	checkStrategyChosen(t, &mig, kaironv1.StrategyReasonTargetCannotReceiveLive,
		"strategy auto chose cold: no node that can take machine worker can receive it live from node "+source+": "+target+" has no migration endpoint")
	// kubectl shows the choice as a condition.
	out := env.Kubectl(t, "-n", ns, "get", "machinemigration", mig.Name, "-o",
		`jsonpath={.status.conditions[?(@.type=="StrategyChosen")].reason}`)
	if out != kaironv1.StrategyReasonTargetCannotReceiveLive {
		t.Errorf("kubectl: StrategyChosen reason %q", out)
	}
}

// checkStrategyChosen checks mig's StrategyChosen condition: True, with
// reason, and a message beginning with message.
func checkStrategyChosen(t *testing.T, mig *kaironv1.MachineMigration, reason, message string) {
	t.Helper()
	c := meta.FindStatusCondition(mig.Status.Conditions, kaironv1.ConditionStrategyChosen.String())
	if c == nil || c.Status != metav1.ConditionTrue || c.Reason != reason || !strings.HasPrefix(c.Message, message) {
		t.Errorf("migration %s: StrategyChosen condition %+v; want True, reason %s, message beginning %q", mig.Name, c, reason, message)
	}
}

// TestCordonEvacuationAutoMovesAQEMUGuestLive: on kairon-local with two
// QEMU nodes, cordon evacuation with strategy auto moves a running guest
// live. The guest keeps what it holds in memory (a token and a counter that
// never went back), and under KVM its downtime is well under that of a
// cold move of the same guest between the same nodes (under TCG the guest
// is stopped for the whole copy). kairon-local runs no cordon
// evacuation, so the test runs its reconciler beside kairon-local's
// controllers, which carry the migration out.
func TestCordonEvacuationAutoMovesAQEMUGuestLive(t *testing.T) {
	c := startKaironLocal(t, 2)
	c.kubectl("apiVersion: kairon.zyvor.dev/v1alpha1\nkind: Machine\nmetadata: {name: mover, namespace: default}\nspec: {}\n", "apply", "-f", "-")
	var node string
	testenv.Eventually(t, 3*time.Minute, "machine mover Running", func() (bool, string) {
		state := c.jsonpath("machine", "mover", "{.status.phase} {.spec.nodeName}")
		c.stopIfFailed("mover", state)
		fields := strings.Fields(state)
		if len(fields) != 2 {
			return false, state
		}
		node = fields[1]
		return fields[0] == "Running", state
	})
	state := startGuestState(t, c.console(node, "default", "mover"))

	// A cold move first, for the downtime to compare with.
	phase, reason, message := c.migrate("move-cold", "mover", "cold")
	if phase != "Succeeded" {
		t.Fatalf("cold migration %s/%s: %s", phase, reason, message)
	}
	cold, _ := strconv.ParseInt(c.jsonpath("machinemigration", "move-cold", "{.status.downtimeMillis}"), 10, 64)
	node = otherNode(node)
	state = checkGuestKeptState(t, c.console(node, "default", "mover"), state, "after the cold migration")

	startCordonEvacuation(t, c.kubeconfig)
	c.kubectl("", "cordon", node)
	t.Cleanup(func() { c.kubectl("", "uncordon", node) })
	var name string
	testenv.Eventually(t, 3*time.Minute, "the evacuation migration of mover to end", func() (bool, string) {
		out := c.listJSONPath("machinemigrations", kaironv1.LabelEvacuatedNode+"="+node,
			`{range .items[*]}{.metadata.name}|{.status.phase}|{.status.reason}|{.status.message}{"\n"}{end}`)
		fields := strings.Split(strings.TrimSpace(out), "|")
		if len(fields) < 2 {
			return false, out
		}
		name = fields[0]
		return fields[1] == "Succeeded" || fields[1] == "Failed", out
	})
	got := c.jsonpath("machinemigration", name, `{.spec.strategy} {.spec.targetNode} {.status.phase} {.status.conditions[?(@.type=="StrategyChosen")].reason} {.status.downtimeMillis}`)
	why := c.jsonpath("machinemigration", name, `{.status.conditions[?(@.type=="StrategyChosen")].message}`)
	t.Logf("cordon evacuation: %s (%s); the cold move's downtime %d ms", got, why, cold)
	fields := strings.Fields(got)
	if len(fields) != 5 || fields[0] != "live" || fields[1] != otherNode(node) || fields[2] != "Succeeded" || fields[3] != kaironv1.StrategyReasonLive {
		t.Fatalf("evacuation migration %s: %q (%s); want live to %s, Succeeded, StrategyChosen %s", name, got, why, otherNode(node), kaironv1.StrategyReasonLive)
	}
	live, _ := strconv.ParseInt(fields[4], 10, 64)
	switch accel := c.jsonpath("machine", "mover", "{.status.acceleration}"); {
	case live <= 0:
		t.Errorf("live downtime %d ms: want the source's measure", live)
	case accel == "tcg":
		// Under TCG the backend stops the guest for the whole copy (QEMU
		// loses guest stores made during the copy of a running guest), so
		// the downtime is the copy's, which under load can be the cold
		// move's or more; the guest's state below is what counts.
		t.Logf("acceleration tcg: the live move copied a stopped guest (downtime %d ms, the cold move's %d ms)", live, cold)
	case live*2 > cold:
		t.Errorf("live downtime %d ms, cold %d ms: want the live one well under (at most half)", live, cold)
	}
	if at := c.jsonpath("machine", "mover", "{.spec.nodeName} {.status.phase}"); at != otherNode(node)+" Running" {
		t.Fatalf("after the evacuation the machine is %q, want Running on %s", at, otherNode(node))
	}
	checkGuestKeptState(t, c.console(otherNode(node), "default", "mover"), state, "after the live evacuation")
	c.kubectl("", "delete", "machine", "mover", "--timeout=60s")
}

// startCordonEvacuation runs cordon evacuation with strategy auto against
// the cluster of kubeconfig until the test ends, and nothing else.
func startCordonEvacuation(t *testing.T, kubeconfig string) {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, kaironv1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	// controller-runtime's client logs through its global logger, and
	// complains with a stack trace when nobody set one.
	setLoggerOnce.Do(func() { ctrllog.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(zapcore.WarnLevel))) })
	logs := testenv.NewLogWriter(t) // before the manager: stops after it
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Logger:                 zap.New(zap.WriteTo(logs)),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := (&controller.CordonEvacuationReconciler{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorder("cordon-evacuation-test"),
		Strategy: rules.StrategyAuto, Interval: time.Second,
	}).SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("cordon evacuation manager: %v", err)
		}
	})
}
