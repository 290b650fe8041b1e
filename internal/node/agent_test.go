package node_test

import (
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/backend/sim"
	"github.com/zyvor/kairon/internal/node"
	"github.com/zyvor/kairon/internal/testenv"
)

func TestMain(m *testing.M) {
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(zapcore.WarnLevel)))
	os.Exit(testenv.Run(m))
}

// runAgent starts a sim-backed agent for nodeName over stateDir and stops it
// when the test ends or stop is called.
func runAgent(t *testing.T, env *testenv.Env, nodeName, stateDir string) (stop func()) {
	stop, _ = runAgentWithAddress(t, env, nodeName, stateDir)
	return stop
}

func runAgentWithAddress(t *testing.T, env *testenv.Env, nodeName, stateDir string) (stop func(), address string) {
	t.Helper()
	backend, err := sim.New(sim.Options{StateDir: filepath.Join(stateDir, "instances"), BootDelay: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	agent, err := node.New(env.Config, node.Options{
		NodeName: nodeName, Register: true, Backend: backend, StateDir: stateDir,
		CPU: 4, Memory: resource.MustParse("4Gi"),
		Network:       &node.NetworkOptions{CIDR: netip.MustParsePrefix("10.88.7.0/24"), NoLinks: true},
		ListenAddress: "127.0.0.1:0", Interval: time.Second,
		ClientCAFile: filepath.Join(env.DataDir, "pki", "ca.crt"),
	})
	if err != nil {
		t.Fatal(err)
	}
	return testenv.RunInBackground(t, "agent "+nodeName, agent.Run), agent.Address()
}

// waitTimeout bounds every wait of these tests: an upper bound for a loaded
// machine, never a measurement (testenv.Eventually returns as soon as the
// condition holds).
const waitTimeout = 30 * time.Second

func waitPhase(t *testing.T, env *testenv.Env, key client.ObjectKey, want kaironv1.MachinePhase) *kaironv1.Machine {
	t.Helper()
	return env.WaitMachinePhase(t, key, want, waitTimeout)
}

func TestAgentRegistersItsNode(t *testing.T) {
	env := testenv.Get(t)
	runAgent(t, env, "sim-register", t.TempDir())
	t.Cleanup(func() {
		_ = env.Client.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "sim-register"}})
	})

	n := &corev1.Node{}
	testenv.Eventually(t, waitTimeout, "node registered Ready", func() (bool, string) {
		if err := env.Client.Get(context.Background(), client.ObjectKey{Name: "sim-register"}, n); err != nil {
			return false, err.Error()
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.Status == corev1.ConditionTrue, string(c.Status)
			}
		}
		return false, "no Ready condition"
	})
	for k, want := range map[string]string{
		kaironv1.LabelNode: "true", kaironv1.LabelNodeBackend: "sim",
		kaironv1.LabelNodeAcceleration: "sim", kaironv1.LabelHollowNode: "true",
	} {
		if got := n.Labels[k]; got != want {
			t.Errorf("node label %s = %q, want %q", k, got, want)
		}
	}
	if got := n.Status.Allocatable.Cpu().Value(); got != 4 {
		t.Errorf("allocatable cpu = %d, want 4", got)
	}
	if n.Status.DaemonEndpoints.KubeletEndpoint.Port == 0 {
		t.Error("node does not advertise the agent's console port")
	}
}

func TestAgentRunsAMachineThroughItsLife(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	state := t.TempDir()
	runAgent(t, env, "sim-life", state)
	t.Cleanup(func() { _ = env.Client.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "sim-life"}}) })

	m := &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vm"}, Spec: kaironv1.MachineSpec{NodeName: "sim-life"}}
	if err := env.Client.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	key := client.ObjectKeyFromObject(m)
	booting := waitPhase(t, env, key, kaironv1.MachineBooting)
	// No scheduler runs here: the agent records the placement itself, with
	// its first status.
	if c := meta.FindStatusCondition(booting.Status.Conditions, kaironv1.ConditionScheduled.String()); c == nil ||
		c.Status != metav1.ConditionTrue || c.Reason != kaironv1.MachineReasonScheduled || c.Message != "Bound to node sim-life" {
		t.Errorf("the Booting Machine's Scheduled condition is %+v, want True, bound to node sim-life", c)
	}
	m = waitPhase(t, env, key, kaironv1.MachineRunning)
	if m.Status.Acceleration != "sim" || len(m.Status.Addresses) != 1 || m.Status.StartedAt == nil {
		t.Errorf("running status incomplete: %+v", m.Status)
	}
	if m.Status.Addresses[0].Address != "10.88.7.2" {
		t.Errorf("address = %s, want the first guest address 10.88.7.2", m.Status.Addresses[0].Address)
	}
	if len(m.Finalizers) != 1 || m.Finalizers[0] != kaironv1.FinalizerMachineVM {
		t.Errorf("finalizers = %v", m.Finalizers)
	}

	// Stopping and starting again through spec.powerState.
	m.Spec.PowerState = kaironv1.PowerStateStopped
	if err := env.Client.Update(ctx, m); err != nil {
		t.Fatal(err)
	}
	m = waitPhase(t, env, key, kaironv1.MachineStopped)
	if len(m.Status.Addresses) != 0 {
		t.Errorf("a stopped Machine still has addresses: %v", m.Status.Addresses)
	}
	m.Spec.PowerState = kaironv1.PowerStateRunning
	if err := env.Client.Update(ctx, m); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, env, key, kaironv1.MachineRunning)

	if err := env.Client.Delete(ctx, m); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, waitTimeout, "machine gone", func() (bool, string) {
		err := env.Client.Get(ctx, key, m)
		return apierrors.IsNotFound(err), string(m.Status.Phase)
	})
	if entries, _ := os.ReadDir(filepath.Join(state, "instances")); len(entries) != 0 {
		t.Errorf("instance state left behind: %v", entries)
	}
}

func TestRestartedAgentAdoptsRunningVMsAndStopsOrphans(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	state := t.TempDir()
	stop := runAgent(t, env, "sim-restart", state)
	t.Cleanup(func() { _ = env.Client.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "sim-restart"}}) })

	var started []*kaironv1.Machine
	for _, name := range []string{"keep", "orphan"} {
		m := &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: kaironv1.MachineSpec{NodeName: "sim-restart"}}
		if err := env.Client.Create(ctx, m); err != nil {
			t.Fatal(err)
		}
		started = append(started, waitPhase(t, env, client.ObjectKeyFromObject(m), kaironv1.MachineRunning))
	}
	stop()

	// While the agent is down, "orphan" is deleted: only its finalizer keeps it.
	orphan := started[1]
	if err := env.Client.Delete(ctx, orphan); err != nil {
		t.Fatal(err)
	}
	runAgent(t, env, "sim-restart", state)

	testenv.Eventually(t, waitTimeout, "orphan removed by the new agent", func() (bool, string) {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(orphan), &kaironv1.Machine{})
		return apierrors.IsNotFound(err), "still there"
	})
	kept := &kaironv1.Machine{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(started[0]), kept); err != nil {
		t.Fatal(err)
	}
	if kept.Status.Phase != kaironv1.MachineRunning || !kept.Status.StartedAt.Equal(started[0].Status.StartedAt) {
		t.Errorf("kept VM was not adopted unchanged: phase %s, started %v, was %v", kept.Status.Phase, kept.Status.StartedAt, started[0].Status.StartedAt)
	}
	if records, _ := filepath.Glob(filepath.Join(state, "instances", "*.json")); len(records) != 1 {
		t.Errorf("want only the kept instance's state, got %v", records)
	}
}

func TestConsoleServerRequiresAClusterClientCertificate(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	_, address := runAgentWithAddress(t, env, "sim-console", t.TempDir())
	t.Cleanup(func() { _ = env.Client.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "sim-console"}}) })

	m := &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vm"}, Spec: kaironv1.MachineSpec{NodeName: "sim-console"}}
	if err := env.Client.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, env, client.ObjectKeyFromObject(m), kaironv1.MachineRunning)
	url := "https://" + address + "/v1/machines/" + ns + "/vm/console?tail=1"

	admin := rest.CopyConfig(env.Config)
	admin.Insecure, admin.CAData, admin.CAFile = true, nil, ""
	transport, err := rest.TransportFor(admin)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := (&http.Client{Transport: transport}).Get(url)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(body) != "KAIRON-READY\n" {
		t.Errorf("with the admin certificate: %s %q, want 200 and the last console line", resp.Status, body)
	}

	anonymous := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	if resp, err := anonymous.Get(url); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("without a client certificate the console answered %v %v, want 401", resp, err)
	} else {
		resp.Body.Close()
	}
}
