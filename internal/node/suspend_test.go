package node_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/backend"
	"github.com/zyvor/kairon/internal/backend/sim"
	"github.com/zyvor/kairon/internal/node"
	"github.com/zyvor/kairon/internal/testenv"
	"github.com/zyvor/kairon/internal/testenv/host"
)

// failingSave is a sim backend that cannot save a VM.
type failingSave struct{ *sim.Backend }

func (failingSave) Save(context.Context, string, string) error {
	return errors.New("injected save failure")
}

// runAgentOnShutdown runs a sim agent for nodeName with the given shutdown
// action; wrap may replace its backend. stop ends it as SIGTERM would.
func runAgentOnShutdown(t *testing.T, env *testenv.Env, nodeName, stateDir string, action node.ShutdownAction, wrap func(*sim.Backend) backend.Backend) (stop func()) {
	t.Helper()
	return runSimAgent(t, env, nodeName, stateDir, wrap, func(o *node.Options) {
		o.OnShutdown, o.SuspendTimeout = action, 20*time.Second
	})
}

// simInstance is what the sim backend over stateDir reports of a Machine's VM.
func simInstance(t *testing.T, stateDir, ns, name string) (backend.Instance, error) {
	t.Helper()
	b, err := sim.New(sim.Options{StateDir: filepath.Join(stateDir, "instances")})
	if err != nil {
		t.Fatal(err)
	}
	return b.Get(context.Background(), ns+"_"+name)
}

// suspendFiles lists what the agent keeps for suspended VMs.
func suspendFiles(stateDir string) []string {
	files, _ := filepath.Glob(filepath.Join(stateDir, "suspended", "*"))
	for i, f := range files {
		files[i] = filepath.Base(f)
	}
	return files
}

// machineEvents are the events on Machine ns/name with reason.
func machineEvents(t *testing.T, env *testenv.Env, ns, name, reason string) []eventsv1.Event {
	t.Helper()
	var l eventsv1.EventList
	if err := env.Client.List(context.Background(), &l, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var out []eventsv1.Event
	for _, e := range l.Items {
		if e.Regarding.Kind == "Machine" && e.Regarding.Name == name && e.Reason == reason {
			out = append(out, e)
		}
	}
	return out
}

// waitMachineEvent waits for an event with reason on Machine ns/name and
// returns it.
func waitMachineEvent(t *testing.T, env *testenv.Env, ns, name, reason string) eventsv1.Event {
	t.Helper()
	var found eventsv1.Event
	testenv.Eventually(t, waitTimeout, "a "+reason+" event on Machine "+name, func() (bool, string) {
		events := machineEvents(t, env, ns, name, reason)
		if len(events) == 0 {
			return false, "none"
		}
		found = events[0]
		return true, ""
	})
	return found
}

// startMachine creates Machine "vm" on nodeName and waits until it runs.
func startMachine(t *testing.T, env *testenv.Env, ns, nodeName string) *kaironv1.Machine {
	t.Helper()
	m := &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vm"}, Spec: kaironv1.MachineSpec{NodeName: nodeName}}
	if err := env.Client.Create(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	return waitPhase(t, env, client.ObjectKeyFromObject(m), kaironv1.MachineRunning)
}

func deleteNodeAtEnd(t *testing.T, env *testenv.Env, name string) {
	t.Cleanup(func() {
		_ = env.Client.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}})
	})
}

// A suspending agent saves and stops its VM when it stops, and the next
// agent restores it: the Machine gets a Suspended event, then a Resumed one
// naming the pause, and nothing of the suspension is left.
func TestSuspendedVMIsRestoredByTheNextAgent(t *testing.T) {
	suspendAndResume(t, "sus-a")
}

// The same on kairon-local's shared bridge, where the agent watches every
// guest address of the cluster: the next agent resumes the VM once it has
// looked at them, instead of failing it for the look still pending.
func TestSuspendedVMIsRestoredOnASharedBridge(t *testing.T) {
	host.SkipIfShort(t, "root, to make network namespaces, and the control plane")
	suspendAndResume(t, "sus-bridge", sharedBridge(testNetns(t, "kairon-sus-"), "10.88.3.0/24"))
}

// suspendAndResume runs a Machine on an agent of nodeName that suspends
// its VMs, stops the agent and starts another, which must resume the VM.
func suspendAndResume(t *testing.T, nodeName string, options ...func(*node.Options)) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	state := t.TempDir()
	deleteNodeAtEnd(t, env, nodeName)
	onShutdown := func(o *node.Options) { o.OnShutdown, o.SuspendTimeout = node.ShutdownSuspend, 20*time.Second }
	stop := runSimAgent(t, env, nodeName, state, nil, append(options, onShutdown)...)
	m := startMachine(t, env, ns, nodeName)
	stop()

	if inst, err := simInstance(t, state, ns, "vm"); !errors.Is(err, backend.ErrNotFound) {
		t.Errorf("after the agent stopped the VM is %s (%v), want it stopped", inst.Phase, err)
	}
	files := suspendFiles(state)
	if strings.Join(files, " ") != ns+"_vm.json "+ns+"_vm.state" {
		t.Errorf("suspended/ holds %v, want the record and the saved state", files)
	}
	// Written before the agent returned, not queued.
	suspended := machineEvents(t, env, ns, "vm", kaironv1.EventReasonSuspended)
	if len(suspended) != 1 || suspended[0].Type != corev1.EventTypeNormal || !strings.Contains(suspended[0].Note, "saved") {
		t.Errorf("Suspended events when the agent returned: %+v, want one Normal event", suspended)
	}

	runSimAgent(t, env, nodeName, state, nil, append(options, onShutdown)...)
	resumed := waitMachineEvent(t, env, ns, "vm", kaironv1.EventReasonResumed)
	if resumed.Type != corev1.EventTypeNormal || !strings.Contains(resumed.Note, "paused for ") {
		t.Errorf("Resumed event %s %q, want Normal and naming the pause", resumed.Type, resumed.Note)
	}
	t.Logf("Suspended: %s", suspended[0].Note)
	t.Logf("Resumed: %s", resumed.Note)
	inst, err := simInstance(t, state, ns, "vm")
	if err != nil || inst.Phase != backend.Running {
		t.Errorf("restored VM: %s %v, want Running", inst.Phase, err)
	}
	if inst.ReadyAfter > time.Second {
		t.Errorf("the restored VM was ready %s after start: it booted instead of resuming", inst.ReadyAfter)
	}
	if files := suspendFiles(state); len(files) != 0 {
		t.Errorf("suspended/ still holds %v after the resume", files)
	}
	after := waitPhase(t, env, client.ObjectKeyFromObject(m), kaironv1.MachineRunning)
	if len(after.Status.Addresses) != 1 || after.Status.Addresses[0] != m.Status.Addresses[0] {
		t.Errorf("addresses after the resume %v, want %v kept", after.Status.Addresses, m.Status.Addresses)
	}
}

// A save that fails leaves the VM running, as a keeping agent would, with a
// Warning event; the next agent adopts it unchanged.
func TestFailedSaveLeavesTheVMRunning(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	state := t.TempDir()
	deleteNodeAtEnd(t, env, "sus-save")
	stop := runAgentOnShutdown(t, env, "sus-save", state, node.ShutdownSuspend, func(b *sim.Backend) backend.Backend { return failingSave{b} })
	m := startMachine(t, env, ns, "sus-save")
	stop()

	if inst, err := simInstance(t, state, ns, "vm"); err != nil || inst.Phase != backend.Running {
		t.Errorf("after a failed save the VM is %s (%v), want it running", inst.Phase, err)
	}
	if files := suspendFiles(state); len(files) != 0 {
		t.Errorf("a failed save left %v", files)
	}
	failed := machineEvents(t, env, ns, "vm", kaironv1.EventReasonSuspendFailed)
	if len(failed) != 1 || failed[0].Type != corev1.EventTypeWarning || !strings.Contains(failed[0].Note, "injected save failure") {
		t.Errorf("SuspendFailed events: %+v, want one Warning naming the cause", failed)
	}

	runAgentOnShutdown(t, env, "sus-save", state, node.ShutdownKeep, nil)
	waitNodeReady(t, env, "sus-save")
	adopted := waitPhase(t, env, client.ObjectKeyFromObject(m), kaironv1.MachineRunning)
	if !adopted.Status.StartedAt.Equal(m.Status.StartedAt) {
		t.Errorf("VM started at %v, was %v: it was restarted, not adopted", adopted.Status.StartedAt, m.Status.StartedAt)
	}
}

// A restore that fails makes the Machine Failed with the reason, leaves
// nothing behind, and does not boot it afresh.
func TestFailedRestoreFailsTheMachine(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	state := t.TempDir()
	deleteNodeAtEnd(t, env, "sus-restore")
	stop := runAgentOnShutdown(t, env, "sus-restore", state, node.ShutdownSuspend, nil)
	m := startMachine(t, env, ns, "sus-restore")
	stop()

	runAgentOnShutdown(t, env, "sus-restore", state, node.ShutdownSuspend, func(b *sim.Backend) backend.Backend { return failingRestore{b} })
	failed := waitPhase(t, env, client.ObjectKeyFromObject(m), kaironv1.MachineFailed)
	ready := metaCondition(failed, string(kaironv1.ConditionReady))
	if ready == nil || ready.Reason != kaironv1.MachineReasonResumeFailed || !strings.Contains(failed.Status.Message, "injected restore failure") {
		t.Errorf("failed Machine: condition %+v, message %q; want reason %s naming the cause", ready, failed.Status.Message, kaironv1.MachineReasonResumeFailed)
	}
	if events := machineEvents(t, env, ns, "vm", kaironv1.MachineReasonResumeFailed); len(events) != 1 || events[0].Type != corev1.EventTypeWarning {
		t.Errorf("ResumeFailed events %+v, want one Warning", events)
	}
	// Not booted afresh behind the failure, for more than a reconcile tick
	// (Interval, 1s), and nothing of it kept.
	testenv.Consistently(t, 2500*time.Millisecond, "the failed Machine stays without a VM", func() (bool, string) {
		inst, err := simInstance(t, state, ns, "vm")
		if !errors.Is(err, backend.ErrNotFound) {
			return false, fmt.Sprintf("a VM runs: %s %v", inst.Phase, err)
		}
		if files := suspendFiles(state); len(files) != 0 {
			return false, fmt.Sprintf("suspended/ holds %v", files)
		}
		return true, ""
	})
}

// An agent killed while saving leaves a "saving" record. If the VM still
// runs (paused), the next agent resumes it in place; if it is gone, the
// guest is lost and the Machine Failed.
func TestInterruptedSuspend(t *testing.T) {
	for _, tt := range []struct {
		name      string
		vmRemains bool
		wantPhase kaironv1.MachinePhase
		wantEvent string
	}{
		{name: "VM still paused", vmRemains: true, wantPhase: kaironv1.MachineRunning, wantEvent: kaironv1.EventReasonResumed},
		{name: "VM gone", vmRemains: false, wantPhase: kaironv1.MachineFailed, wantEvent: kaironv1.MachineReasonSuspendIncomplete},
	} {
		t.Run(tt.name, func(t *testing.T) {
			env := testenv.Get(t)
			ns := env.Namespace(t)
			state := t.TempDir()
			nodeName := "sus-kill-" + map[bool]string{true: "paused", false: "gone"}[tt.vmRemains]
			deleteNodeAtEnd(t, env, nodeName)
			stop := runAgentOnShutdown(t, env, nodeName, state, node.ShutdownKeep, nil)
			m := startMachine(t, env, ns, nodeName)
			stop()

			// What a kill in the middle of Save leaves.
			b, err := sim.New(sim.Options{StateDir: filepath.Join(state, "instances")})
			if err != nil {
				t.Fatal(err)
			}
			id := ns + "_vm"
			if tt.vmRemains {
				if err := b.Pause(context.Background(), id); err != nil {
					t.Fatal(err)
				}
			} else if err := b.Stop(context.Background(), id); err != nil {
				t.Fatal(err)
			}
			record, _ := json.Marshal(map[string]any{"machine": ns + "/vm", "state": "saving", "pausedAt": time.Now().Add(-3 * time.Second)})
			if err := os.MkdirAll(filepath.Join(state, "suspended"), 0o700); err != nil {
				t.Fatal(err)
			}
			for name, data := range map[string][]byte{id + ".json": record, id + ".state.saving": []byte("half")} {
				if err := os.WriteFile(filepath.Join(state, "suspended", name), data, 0o600); err != nil {
					t.Fatal(err)
				}
			}

			runAgentOnShutdown(t, env, nodeName, state, node.ShutdownSuspend, nil)
			event := waitMachineEvent(t, env, ns, "vm", tt.wantEvent)
			t.Logf("%s: %s", event.Reason, event.Note)
			got := waitPhase(t, env, client.ObjectKeyFromObject(m), tt.wantPhase)
			inst, err := simInstance(t, state, ns, "vm")
			if tt.vmRemains {
				if err != nil || inst.Phase != backend.Running || !got.Status.StartedAt.Equal(m.Status.StartedAt) {
					t.Errorf("VM %s (%v), started %v (was %v); want the same VM running again", inst.Phase, err, got.Status.StartedAt, m.Status.StartedAt)
				}
			} else if !errors.Is(err, backend.ErrNotFound) {
				t.Errorf("a VM runs for the failed Machine: %s %v", inst.Phase, err)
			}
			testenv.Eventually(t, waitTimeout, "the suspension's files removed", func() (bool, string) {
				files := suspendFiles(state)
				return len(files) == 0, fmt.Sprint(files)
			})
		})
	}
}

// A Machine deleted while its VM is suspended goes, and its saved state
// with it.
func TestSuspendedVMOfADeletedMachineIsRemoved(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	state := t.TempDir()
	deleteNodeAtEnd(t, env, "sus-del")
	stop := runAgentOnShutdown(t, env, "sus-del", state, node.ShutdownSuspend, nil)
	m := startMachine(t, env, ns, "sus-del")
	stop()
	if len(suspendFiles(state)) == 0 {
		t.Fatal("nothing suspended")
	}
	if err := env.Client.Delete(context.Background(), m); err != nil {
		t.Fatal(err)
	}

	runAgentOnShutdown(t, env, "sus-del", state, node.ShutdownSuspend, nil)
	testenv.Eventually(t, waitTimeout, "the Machine gone with its saved state", func() (bool, string) {
		err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(m), &kaironv1.Machine{})
		files := suspendFiles(state)
		return apierrors.IsNotFound(err) && len(files) == 0, fmt.Sprintf("get: %v, files %v", err, files)
	})
	if events := machineEvents(t, env, ns, "vm", kaironv1.EventReasonResumed); len(events) != 0 {
		t.Errorf("a deleted Machine was resumed: %+v", events)
	}
}

func metaCondition(m *kaironv1.Machine, conditionType string) *metav1.Condition {
	for i := range m.Status.Conditions {
		if m.Status.Conditions[i].Type == conditionType {
			return &m.Status.Conditions[i]
		}
	}
	return nil
}

// waitNodeReady waits for a fresh Ready heartbeat of nodeName.
func waitNodeReady(t *testing.T, env *testenv.Env, nodeName string) {
	t.Helper()
	since := time.Now().Add(-time.Second)
	testenv.Eventually(t, waitTimeout, "node "+nodeName+" Ready", func() (bool, string) {
		n := &corev1.Node{}
		if err := env.Client.Get(context.Background(), client.ObjectKey{Name: nodeName}, n); err != nil {
			return false, err.Error()
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.Status == corev1.ConditionTrue && c.LastHeartbeatTime.After(since), string(c.Status) + " " + c.Message
			}
		}
		return false, "no Ready condition"
	})
}
