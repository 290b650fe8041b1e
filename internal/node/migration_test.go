package node_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/backend"
	"github.com/zyvor/kairon/internal/backend/sim"
	"github.com/zyvor/kairon/internal/controller"
	"github.com/zyvor/kairon/internal/node"
	"github.com/zyvor/kairon/internal/testenv"
)

// failingRestore is a sim backend whose Restore always fails, as a target
// whose restore breaks.
type failingRestore struct{ *sim.Backend }

func (failingRestore) Restore(context.Context, backend.Spec, string) (backend.Instance, error) {
	return backend.Instance{}, errors.New("injected restore failure")
}

// runSimAgent runs a sim agent for nodeName, serving consoles and live
// migrations on loopback; wrap may replace its backend and options change
// its options. stop ends it as SIGTERM would.
func runSimAgent(t *testing.T, env *testenv.Env, nodeName, stateDir string, wrap func(*sim.Backend) backend.Backend, options ...func(*node.Options)) (stop func()) {
	t.Helper()
	b, err := sim.New(sim.Options{StateDir: filepath.Join(stateDir, "instances"), BootDelay: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var be backend.Backend = b
	if wrap != nil {
		be = wrap(b)
	}
	opts := node.Options{
		NodeName: nodeName, Register: true, Backend: be, StateDir: stateDir,
		CPU: 4, Memory: resource.MustParse("4Gi"),
		Network:       &node.NetworkOptions{CIDR: netip.MustParsePrefix("10.88.7.0/24"), NoLinks: true},
		ListenAddress: "127.0.0.1:0", Interval: time.Second,
		ClientCAFile:           filepath.Join(env.DataDir, "pki", "ca.crt"),
		MigrationListenAddress: "127.0.0.1:0",
	}
	for _, o := range options {
		o(&opts)
	}
	agent, err := node.New(env.Config, opts)
	if err != nil {
		t.Fatal(err)
	}
	// Registered first, so it runs after the agent stopped and cannot
	// recreate the Node with a heartbeat.
	t.Cleanup(func() {
		_ = env.Client.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}})
	})
	return testenv.RunInBackground(t, "agent "+nodeName, agent.Run)
}

// runControllers runs every Kairon controller, as kairon-controller does.
func runControllers(t *testing.T, env *testenv.Env) {
	t.Helper()
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:                 env.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := controller.SetupWithManager(mgr, controller.Options{Interval: time.Second}); err != nil {
		t.Fatal(err)
	}
	testenv.RunInBackground(t, "controllers", mgr.Start)
}

func waitMigration(t *testing.T, env *testenv.Env, key client.ObjectKey, want kaironv1.MigrationPhase) *kaironv1.MachineMigration {
	t.Helper()
	mig := &kaironv1.MachineMigration{}
	testenv.Eventually(t, waitTimeout, "migration "+key.String()+" "+string(want), func() (bool, string) {
		if err := env.Client.Get(context.Background(), key, mig); err != nil {
			return false, err.Error()
		}
		return mig.Status.Phase == want, string(mig.Status.Phase) + " " + string(mig.Status.Reason) + ": " + mig.Status.Message
	})
	return mig
}

func instanceExists(stateDir, ns, name string) bool {
	_, err := os.Stat(filepath.Join(stateDir, "instances", ns+"_"+name+".json"))
	return err == nil
}

func optional(o func(*node.Options)) func(*node.Options) {
	if o == nil {
		return func(*node.Options) {}
	}
	return o
}

// startMigrationPair runs the controllers and agents on source and target,
// and a Running Machine "vm" on source.
// sourceOptions and targetOptions adjust each agent's options.
func startMigrationPair(t *testing.T, source, target string, wrapTarget func(*sim.Backend) backend.Backend, sourceOptions, targetOptions func(*node.Options)) (env *testenv.Env, ns, sourceState, targetState string, m *kaironv1.Machine) {
	t.Helper()
	env = testenv.Get(t)
	ns = env.Namespace(t)
	sourceState, targetState = t.TempDir(), t.TempDir()
	runControllers(t, env)
	runSimAgent(t, env, source, sourceState, nil, optional(sourceOptions))
	runSimAgent(t, env, target, targetState, wrapTarget, optional(targetOptions))
	m = &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vm"}, Spec: kaironv1.MachineSpec{NodeName: source}}
	if err := env.Client.Create(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	m = waitPhase(t, env, client.ObjectKeyFromObject(m), kaironv1.MachineRunning)
	// Both nodes Ready, so the controller can pick the target.
	testenv.Eventually(t, waitTimeout, "target node ready", func() (bool, string) {
		n := &corev1.Node{}
		if err := env.Client.Get(context.Background(), client.ObjectKey{Name: target}, n); err != nil {
			return false, err.Error()
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				return true, ""
			}
		}
		return false, "not ready"
	})
	return env, ns, sourceState, targetState, m
}

// countingSave is a sim backend that counts its saves: a source must save
// a guest once per migration, since a second save rewrites the file the
// target may be downloading.
type countingSave struct {
	*sim.Backend
	saves *atomic.Int32
}

func (c countingSave) Save(ctx context.Context, id, path string) error {
	c.saves.Add(1)
	return c.Backend.Save(ctx, id, path)
}

func TestColdMigrationMovesARunningMachine(t *testing.T) {
	var saves atomic.Int32
	countSaves := func(o *node.Options) { o.Backend = countingSave{o.Backend.(*sim.Backend), &saves} }
	env, ns, sourceState, targetState, m := startMigrationPair(t, "mig-a", "mig-b", nil, countSaves, nil)
	ctx := context.Background()
	mig := &kaironv1.MachineMigration{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "move"},
		// No target: the controller picks mig-b, the only other ready node with room.
		Spec: kaironv1.MachineMigrationSpec{MachineName: "vm", Strategy: kaironv1.MigrationCold},
	}
	if err := env.Client.Create(ctx, mig); err != nil {
		t.Fatal(err)
	}
	mig = waitMigration(t, env, client.ObjectKeyFromObject(mig), kaironv1.MigrationSucceeded)
	if mig.Status.SourceNode != "mig-a" || mig.Status.TargetNode != "mig-b" {
		t.Errorf("source/target = %s/%s, want mig-a/mig-b", mig.Status.SourceNode, mig.Status.TargetNode)
	}
	if mig.Status.StartTime == nil || mig.Status.CompletionTime == nil || mig.Status.DowntimeMillis <= 0 ||
		mig.Status.CompletionTime.Before(mig.Status.StartTime) {
		t.Errorf("timings incomplete: start %v completion %v downtime %dms", mig.Status.StartTime, mig.Status.CompletionTime, mig.Status.DowntimeMillis)
	}
	t.Logf("migration %s: %s, downtime %dms", mig.Name, mig.Status.Message, mig.Status.DowntimeMillis)
	if n := saves.Load(); n != 1 {
		t.Errorf("the source saved the guest %d times, want once", n)
	}

	moved := &kaironv1.Machine{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(m), moved); err != nil {
		t.Fatal(err)
	}
	if moved.Spec.NodeName != "mig-b" || moved.Status.Phase != kaironv1.MachineRunning {
		t.Errorf("machine on %s in phase %s, want Running on mig-b", moved.Spec.NodeName, moved.Status.Phase)
	}
	if !instanceExists(targetState, ns, "vm") {
		t.Error("no instance on the target")
	}
	testenv.Eventually(t, waitTimeout, "source instance and saved state gone", func() (bool, string) {
		states, _ := filepath.Glob(filepath.Join(sourceState, "migrations", "*"))
		incoming, _ := filepath.Glob(filepath.Join(targetState, "migrations", "*"))
		return !instanceExists(sourceState, ns, "vm") && len(states) == 0 && len(incoming) == 0,
			"source instance still there or state files left"
	})
	// It stays on the target: nothing tears it down afterwards, for longer
	// than a reconcile tick (Interval, 1s).
	testenv.Consistently(t, 1500*time.Millisecond, "the target instance stays after the migration", func() (bool, string) {
		return instanceExists(targetState, ns, "vm"), "the target instance was torn down"
	})
	waitPhase(t, env, client.ObjectKeyFromObject(m), kaironv1.MachineRunning)
}

func TestColdMigrationFailureLeavesTheMachineOnTheSource(t *testing.T) {
	env, ns, sourceState, targetState, m := startMigrationPair(t, "mig-fail-a", "mig-fail-b",
		func(b *sim.Backend) backend.Backend { return failingRestore{b} }, nil, nil)
	ctx := context.Background()
	mig := &kaironv1.MachineMigration{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "move"},
		Spec:       kaironv1.MachineMigrationSpec{MachineName: "vm", TargetNode: "mig-fail-b"},
	}
	if err := env.Client.Create(ctx, mig); err != nil {
		t.Fatal(err)
	}
	mig = waitMigration(t, env, client.ObjectKeyFromObject(mig), kaironv1.MigrationFailed)
	if mig.Status.Reason != "RestoreFailed" || mig.Status.CompletionTime == nil {
		t.Errorf("failed with %q (%s), completion %v; want RestoreFailed", mig.Status.Reason, mig.Status.Message, mig.Status.CompletionTime)
	}
	t.Logf("migration failed: %s: %s", mig.Status.Reason, mig.Status.Message)
	testenv.Eventually(t, waitTimeout, "VM resumed on the source", func() (bool, string) {
		b, _ := sim.New(sim.Options{StateDir: filepath.Join(sourceState, "instances")})
		inst, err := b.Get(ctx, ns+"_vm")
		if err != nil {
			return false, err.Error()
		}
		states, _ := filepath.Glob(filepath.Join(sourceState, "migrations", "*"))
		return inst.Phase == backend.Running && len(states) == 0, string(inst.Phase)
	})
	stayed := &kaironv1.Machine{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(m), stayed); err != nil {
		t.Fatal(err)
	}
	if stayed.Spec.NodeName != "mig-fail-a" || stayed.Status.Phase != kaironv1.MachineRunning {
		t.Errorf("machine on %s in phase %s, want Running on mig-fail-a", stayed.Spec.NodeName, stayed.Status.Phase)
	}
	if instanceExists(targetState, ns, "vm") {
		t.Error("a restored copy was left on the target")
	}
}

func TestColdMigrationToAFullTargetFails(t *testing.T) {
	env, ns, _, _, m := startMigrationPair(t, "mig-full-a", "mig-full-b", nil, nil, nil)
	ctx := context.Background()
	big := &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "big"},
		Spec: kaironv1.MachineSpec{NodeName: "mig-full-b", CPU: 4}}
	if err := env.Client.Create(ctx, big); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, env, client.ObjectKeyFromObject(big), kaironv1.MachineRunning)
	mig := &kaironv1.MachineMigration{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "move"},
		Spec:       kaironv1.MachineMigrationSpec{MachineName: "vm", TargetNode: "mig-full-b"},
	}
	if err := env.Client.Create(ctx, mig); err != nil {
		t.Fatal(err)
	}
	mig = waitMigration(t, env, client.ObjectKeyFromObject(mig), kaironv1.MigrationFailed)
	if mig.Status.Reason != kaironv1.MigrationReasonTargetUnavailable {
		t.Errorf("reason %q (%s), want TargetUnavailable", mig.Status.Reason, mig.Status.Message)
	}
	t.Logf("migration failed: %s: %s", mig.Status.Reason, mig.Status.Message)
	waitPhase(t, env, client.ObjectKeyFromObject(m), kaironv1.MachineRunning)
}

// stuckRestore is a sim backend whose Restore hangs until released, as a
// target that never finishes loading.
type stuckRestore struct {
	*sim.Backend
	release chan struct{}
}

func (s stuckRestore) Restore(ctx context.Context, _ backend.Spec, _ string) (backend.Instance, error) {
	select {
	case <-s.release:
	case <-ctx.Done():
	}
	return backend.Instance{}, errors.New("released")
}

// TestMigrationDeletedInFlightResumesTheSource: the source saved (paused)
// the guest, the target hangs, and someone deletes the migration. The
// source's finalizer holds the object until the guest runs again there.
func TestMigrationDeletedInFlightResumesTheSource(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	env, ns, sourceState, _, m := startMigrationPair(t, "mig-del-a", "mig-del-b",
		func(b *sim.Backend) backend.Backend { return stuckRestore{b, release} }, nil, nil)
	ctx := context.Background()
	mig := &kaironv1.MachineMigration{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "move"},
		Spec:       kaironv1.MachineMigrationSpec{MachineName: "vm", Strategy: kaironv1.MigrationCold},
	}
	if err := env.Client.Create(ctx, mig); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, waitTimeout, "the source saved and paused the guest", func() (bool, string) {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(mig), mig); err != nil {
			return false, err.Error()
		}
		return mig.Annotations[kaironv1.AnnotationMigrationStateSaved] == "true" && instancePaused(t, sourceState, ns, "vm"),
			fmt.Sprintf("annotations %v finalizers %v", mig.Annotations, mig.Finalizers)
	})
	if !slices.Contains(mig.Finalizers, kaironv1.FinalizerMigrationSource) {
		t.Errorf("finalizers %v, want the source's", mig.Finalizers)
	}
	if err := env.Client.Delete(ctx, mig); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, waitTimeout, "the migration gone and the guest running on the source", func() (bool, string) {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(mig), &kaironv1.MachineMigration{})
		return apierrors.IsNotFound(err) && !instancePaused(t, sourceState, ns, "vm") && instanceExists(sourceState, ns, "vm"),
			fmt.Sprintf("get: %v, paused: %v", err, instancePaused(t, sourceState, ns, "vm"))
	})
	stayed := waitPhase(t, env, client.ObjectKeyFromObject(m), kaironv1.MachineRunning)
	if stayed.Spec.NodeName != "mig-del-a" {
		t.Errorf("machine on %q, want mig-del-a", stayed.Spec.NodeName)
	}
}
