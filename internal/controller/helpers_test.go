package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/requeue"
	"github.com/zyvor/kairon/internal/rules/rulestest"
	"github.com/zyvor/kairon/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

// testInterval is far longer than any wait in these tests, so a test that
// passes shows the controllers reacted to watch events, not to their tick.
const testInterval = 10 * time.Minute

// waitTimeout bounds every wait for a controller. A wait ends as soon as
// its condition holds, so the bound costs nothing when the test passes; it
// is generous because a two-core machine at load 30 (other suites beside
// this one) took more than 30 s to replace a failed pool member. Still far
// under testInterval, so only watch events can make a test pass.
const waitTimeout = 2 * time.Minute

// gcWindow is how long a test watches for the garbage collector (in
// kube-controller-manager) to delete what it must not. It acts on an
// owner's deletion within moments, as the tests that wait for it to
// collect something show, so a wrong deletion would show within this.
const gcWindow = 2 * time.Second

// startControllers runs every Kairon controller, as kairon-controller
// does, in a manager whose cache sees only namespace ns (and the cluster's
// Nodes), until the test ends or it calls stop, whichever comes first.
func startControllers(t testing.TB, env *testenv.Env, ns string, opts Options, customize ...func(*ctrl.Options)) (stop func()) {
	t.Helper()
	if opts.Interval == 0 {
		opts.Interval = testInterval
	}
	mgrOpts := ctrl.Options{
		Cache: cache.Options{DefaultNamespaces: map[string]cache.Config{ns: {}}},
		// Every test starts its own manager in this process, with the
		// same controller names.
		Controller: testControllerConfig(),
	}
	for _, f := range customize {
		f(&mgrOpts)
	}
	return env.StartManager(t, env.Config, mgrOpts, func(mgr ctrl.Manager) error { return SetupWithManager(mgr, opts) })
}

// createNode creates a ready Kairon node, named after the test's namespace
// because Nodes are shared by every test, and deletes it when the test ends.
func createNode(t testing.TB, env *testenv.Env, ns, name string, cpu int64, memory string, mutate ...func(*corev1.Node)) *corev1.Node {
	t.Helper()
	ctx := context.Background()
	node := rulestest.Node(ns+"-"+name, cpu, memory, mutate...)
	status := node.Status
	if err := env.Client.Create(ctx, node); err != nil {
		t.Fatalf("creating node: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Client.Delete(context.Background(), node); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting node %s: %v", node.Name, err)
		}
	})
	status.Capacity = status.Allocatable
	node.Status = status
	if err := env.Client.Status().Update(ctx, node); err != nil {
		t.Fatalf("setting node status: %v", err)
	}
	return node
}

// deleteMachineAsItsAgentWould deletes m and then lets it go as the node
// agent does once the VM is stopped: these tests run no agent, and the
// scheduler places every Machine with the agent's VM finalizer.
func deleteMachineAsItsAgentWould(t *testing.T, env *testenv.Env, m *kaironv1.Machine) {
	t.Helper()
	ctx := context.Background()
	if err := env.Client.Delete(ctx, m); err != nil {
		t.Fatalf("deleting machine %s: %v", m.Name, err)
	}
	eventually(t, "machine "+m.Name+"'s VM finalizer removed as its agent would", func() (bool, string) {
		cur := &kaironv1.Machine{}
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(m), cur)
		if apierrors.IsNotFound(err) || (err == nil && cur.UID != m.UID) {
			return true, ""
		}
		if err != nil {
			return false, err.Error()
		}
		base := cur.DeepCopy()
		controllerutil.RemoveFinalizer(cur, kaironv1.FinalizerMachineVM)
		err = env.Client.Patch(ctx, cur, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}))
		return err == nil || apierrors.IsNotFound(err), fmt.Sprint(err)
	})
}

func createMachine(t *testing.T, env *testenv.Env, ns, name string, cpu int32, memory string, mutate ...func(*kaironv1.Machine)) *kaironv1.Machine {
	t.Helper()
	m := &kaironv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       kaironv1.MachineSpec{CPU: cpu, Memory: resource.MustParse(memory)},
	}
	for _, f := range mutate {
		f(m)
	}
	if err := env.Client.Create(context.Background(), m); err != nil {
		t.Fatalf("creating machine %s: %v", name, err)
	}
	return m
}

// setMachinePhase plays the node agent: it reports a phase.
func setMachinePhase(t *testing.T, env *testenv.Env, m *kaironv1.Machine, phase kaironv1.MachinePhase) {
	t.Helper()
	ctx := context.Background()
	var cur kaironv1.Machine
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(m), &cur); err != nil {
		t.Fatalf("getting machine %s: %v", m.Name, err)
	}
	orig := cur.DeepCopy()
	cur.Status.Phase = phase
	if err := env.Client.Status().Patch(ctx, &cur, client.MergeFrom(orig)); err != nil {
		t.Fatalf("setting machine %s to %s: %v", m.Name, phase, err)
	}
}

// eventually waits up to waitTimeout for check to report done; see
// testenv.Eventually.
func eventually(t *testing.T, what string, check func() (done bool, saw string)) {
	t.Helper()
	testenv.Eventually(t, waitTimeout, what, check)
}

func listMachines(t *testing.T, env *testenv.Env, ns string, opts ...client.ListOption) []kaironv1.Machine {
	t.Helper()
	var list kaironv1.MachineList
	if err := env.Client.List(context.Background(), &list, append(opts, client.InNamespace(ns))...); err != nil {
		t.Fatalf("listing machines: %v", err)
	}
	return list.Items
}

// getObject reads ns/name, an object of kind T, from the API server (not
// a cache), failing the test if it cannot.
func getObject[T any, PT interface {
	*T
	client.Object
}](t *testing.T, env *testenv.Env, ns, name string) PT {
	t.Helper()
	obj := PT(new(T))
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, obj); err != nil {
		t.Fatalf("getting %T %s: %v", obj, name, err)
	}
	return obj
}

func getMachine(t *testing.T, env *testenv.Env, ns, name string) *kaironv1.Machine {
	t.Helper()
	return getObject[kaironv1.Machine](t, env, ns, name)
}

// describeMachine is one line of what a test needs to see when it fails.
func describeMachine(m *kaironv1.Machine) string {
	s := fmt.Sprintf("%s phase=%q node=%q", m.Name, m.Status.Phase, m.Spec.NodeName)
	if c := meta.FindStatusCondition(m.Status.Conditions, kaironv1.ConditionScheduled.String()); c != nil {
		s += fmt.Sprintf(" Scheduled=%s/%s %q", c.Status, c.Reason, c.Message)
	}
	return s
}

// waitScheduled waits until the Machine is bound and its status says so.
func waitScheduled(t *testing.T, env *testenv.Env, ns, name string) *kaironv1.Machine {
	t.Helper()
	var m *kaironv1.Machine
	eventually(t, name+" to be scheduled", func() (bool, string) {
		m = getMachine(t, env, ns, name)
		c := meta.FindStatusCondition(m.Status.Conditions, kaironv1.ConditionScheduled.String())
		ok := m.Spec.NodeName != "" && m.Status.Phase == kaironv1.MachineScheduled &&
			c != nil && c.Status == metav1.ConditionTrue && c.Reason == kaironv1.MachineReasonScheduled
		return ok, describeMachine(m)
	})
	return m
}

// waitPending waits until the Machine is Pending with exactly this reason
// and message.
func waitPending(t *testing.T, env *testenv.Env, ns, name, reason, message string) {
	t.Helper()
	eventually(t, fmt.Sprintf("%s to be Pending (%s: %s)", name, reason, message), func() (bool, string) {
		m := getMachine(t, env, ns, name)
		c := meta.FindStatusCondition(m.Status.Conditions, kaironv1.ConditionScheduled.String())
		ok := m.Spec.NodeName == "" && m.Status.Phase == kaironv1.MachinePending && m.Status.Message == message &&
			c != nil && c.Status == metav1.ConditionFalse && c.Reason == reason && c.Message == message
		return ok, describeMachine(m)
	})
}

func fmtJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprintf("%+v", v)
	}
	return string(b)
}

// testControllerConfig is kairon-controller's controller configuration,
// with the names of controllers free to repeat in one process.
func testControllerConfig() config.Controller {
	c := requeue.ControllerConfig()
	c.SkipNameValidation = ptr.To(true)
	return c
}

// directClient is a client of the test's API server that an interceptor
// can wrap.
func directClient(t *testing.T, env *testenv.Env) client.WithWatch {
	t.Helper()
	c, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}
