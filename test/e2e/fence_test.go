package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/rules"
	"github.com/zyvor/kairon/internal/testenv"
)

// A node dies for real, with real QEMU: a SnapshotSchedule snapshots a
// guest that keeps a counter in memory; the node's agent is killed and so
// are its VMs but one, left running as a host that is down to the cluster
// may still run some. The Node goes Unknown, the pool replaces its warm member
// on the other node and a new claim binds there, never to the dead member.
// kaironctl fence brings the Machine that has a MachineSnapshot back on the
// other node, the guest's memory as of the snapshot (its token, its counter
// from before the snapshot, not what it wrote after), and the MachineSet's
// Machine is replaced. kaironctl recover and a restarted agent: the VM left
// running is destroyed before the node reports Ready.
func TestFenceBringsSnapshottedMachineBack(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	netNS := netns(t)
	// Short: the VMs' sockets are created below it.
	state, err := os.MkdirTemp("", "kfen-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(state) })
	t.Cleanup(func() { killVMs(t, state) })
	deleteMachinesAtEnd(t, env, ns)
	dead, alive := ns+"-a", ns+"-b"
	startControllerWith(t, env, "-node-grace-period", "6s")
	agentFlags := func(i int) []string {
		return []string{"--network-cidr", "10.88.0.0/16", "--address-pool", fmt.Sprintf("10.88.%d.0/24", 91+i),
			"--lease-renew-interval", "1s", "--migration-listen", "127.0.0.1:0",
			// One store both nodes reach, as kairon-local's data dir.
			"--snapshot-dir", filepath.Join(state, "snapshots"), "--snapshot-store", "fence-e2e"}
	}
	startDead := func() *agent {
		return startAgentWith(t, env, dead, filepath.Join(state, "a"), netNS, 4, "3Gi", agentFlags(0)...)
	}
	agents := map[string]*agent{dead: startDead()}
	deleteNodeAtEnd(t, env, dead)
	waitNodeReady(t, env, dead)
	t.Cleanup(func() {
		if t.Failed() {
			for name, a := range agents {
				out, _ := os.ReadFile(a.log)
				t.Logf("kairon-node %s log:\n%s", name, tail(string(out), 30))
			}
			t.Logf("objects:\n%s", kubectlQuiet(env, "-n", ns, "get", "machines,machineclaims,machinesnapshots,machinesets,machinepools", "-o", "wide"))
		}
	})

	// Everything starts on the node that will die.
	kubectl(t, env, `apiVersion: kairon.zyvor.dev/v1alpha1
kind: Machine
metadata: {name: keeper, labels: {app: keeper}}
spec: {cpu: 1, memory: 256Mi}
---
apiVersion: kairon.zyvor.dev/v1alpha1
kind: MachineSet
metadata: {name: web}
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec: {cpu: 1, memory: 256Mi}
---
apiVersion: kairon.zyvor.dev/v1alpha1
kind: MachinePool
metadata: {name: agents}
spec:
  replicas: 1
  template:
    metadata: {labels: {app: agents}}
    spec: {cpu: 1, memory: 256Mi}
`, "-n", ns, "apply", "-f", "-")
	keeper := waitPhase(t, env, client.ObjectKey{Namespace: ns, Name: "keeper"}, kaironv1.MachineRunning)
	web := runningMachines(t, env, ns, client.MatchingLabels{kaironv1.LabelMachineSet: "web"}, 1)[0]
	warm := runningMachines(t, env, ns, client.MatchingLabels{kaironv1.LabelMachinePool: "agents"}, 1)[0]
	for _, m := range []kaironv1.Machine{*keeper, web, warm} {
		if m.Spec.NodeName != dead {
			t.Fatalf("machine %s on %q, want %s", m.Name, m.Spec.NodeName, dead)
		}
	}

	// The guest keeps a token and a counter in memory; a SnapshotSchedule
	// (every minute) snapshots it, and is suspended once it has.
	con := testenv.DialConsole(t, filepath.Join(state, "a", "instances", ns+"_keeper", "console.sock"))
	before := startGuestState(t, con)
	kubectl(t, env, "apiVersion: kairon.zyvor.dev/v1alpha1\nkind: SnapshotSchedule\nmetadata: {name: keep}\nspec: {selector: {app: keeper}, schedule: \"* * * * *\", retention: 2}\n", "-n", ns, "apply", "-f", "-")
	scheduled := func() (ready, pending []string) {
		var l kaironv1.MachineSnapshotList
		if err := env.Client.List(ctx, &l, client.InNamespace(ns), client.MatchingLabels{kaironv1.LabelSnapshotSchedule: "keep"}); err != nil {
			t.Fatal(err)
		}
		for _, s := range l.Items {
			switch s.Status.Phase {
			case kaironv1.SnapshotReady:
				ready = append(ready, s.Name)
			case kaironv1.SnapshotFailed:
				t.Fatalf("snapshot %s failed: %s", s.Name, s.Status.Message)
			default:
				pending = append(pending, s.Name)
			}
		}
		return ready, pending
	}
	testenv.Eventually(t, 3*time.Minute, "schedule keep to snapshot keeper", func() (bool, string) {
		ready, pending := scheduled()
		return len(ready) > 0, fmt.Sprint("ready ", ready, " pending ", pending)
	})
	kubectl(t, env, "", "-n", ns, "patch", "snapshotschedule", "keep", "--type", "merge", "-p", `{"spec":{"suspend":true}}`)
	var snapshots []string
	testenv.Eventually(t, 2*time.Minute, "no snapshot of keeper pending", func() (bool, string) {
		var pending []string
		snapshots, pending = scheduled()
		return len(pending) == 0, fmt.Sprint(pending)
	})
	newest := rules.NewestReadySnapshot(listSnapshots(t, env, ns), ns, "keeper")
	t.Logf("snapshots of keeper: %v; the newest: %s", snapshots, newest.Name)
	atSnapshot := readGuestState(t, con)
	// After the snapshot: a mark the restored guest must not have, and the
	// counter well past its value at the snapshot.
	con.Expect(t, "echo after > /tmp/after; echo marked:$((1+1)).", regexp.MustCompile(`marked:2\.`), 30*time.Second)
	con.Expect(t, fmt.Sprintf("while [ \"$(cat /tmp/counter)\" -lt %d ]; do usleep 100000; done; echo past:$((1+1)).", atSnapshot.counter+150),
		regexp.MustCompile(`past:2\.`), time.Minute)
	beforeDeath := readGuestState(t, con)

	// The other node comes up; then the first dies, all but web's VM.
	agents[alive] = startAgentWith(t, env, alive, filepath.Join(state, "b"), netNS, 4, "3Gi", agentFlags(1)...)
	deleteNodeAtEnd(t, env, alive)
	waitNodeReady(t, env, alive)
	agents[dead].kill()
	vms := vmProcesses(t, filepath.Join(state, "a"))
	stale := vms[ns+"/"+web.Name]
	if stale == 0 || vms[ns+"/keeper"] == 0 || vms[ns+"/"+warm.Name] == 0 {
		t.Fatalf("VMs on %s: %v, want keeper, %s and %s", dead, vms, web.Name, warm.Name)
	}
	for name, pid := range vms {
		if pid != stale {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Logf("killed the VM of %s (pid %d)", name, pid)
		}
	}
	testenv.Eventually(t, time.Minute, "node "+dead+" Unknown", func() (bool, string) {
		s := nodeConditionStatus(t, env, dead, corev1.NodeConditionType(kaironv1.NodeConditionAgentReady))
		return s == corev1.ConditionUnknown, string(s)
	})

	// The pool replaces its warm member; a claim binds there, not to the dead one.
	testenv.Eventually(t, 3*time.Minute, "a warm member Running on "+alive, func() (bool, string) {
		var l kaironv1.MachineList
		_ = env.Client.List(ctx, &l, client.InNamespace(ns), client.MatchingLabels{kaironv1.LabelMachinePool: "agents", kaironv1.LabelPoolState: kaironv1.PoolStateWarm})
		for _, m := range l.Items {
			if m.Spec.NodeName == alive && m.Status.Phase == kaironv1.MachineRunning {
				return true, ""
			}
		}
		return false, fmt.Sprint(len(l.Items), " warm")
	})
	kubectl(t, env, "apiVersion: kairon.zyvor.dev/v1alpha1\nkind: MachineClaim\nmetadata: {name: late}\nspec: {poolName: agents}\n", "-n", ns, "apply", "-f", "-")
	var bound string
	testenv.Eventually(t, 2*time.Minute, "claim late Bound", func() (bool, string) {
		s := kubectlQuiet(env, "-n", ns, "get", "machineclaim", "late", "-o", "jsonpath={.status.phase} {.status.machineName}")
		f := strings.Fields(s)
		if len(f) == 2 && f[0] == "Bound" {
			bound = f[1]
			return true, s
		}
		return false, s
	})
	if bound == warm.Name {
		t.Errorf("claim late bound the dead member %s", bound)
	}

	// The operator attests the node is down.
	fence := runKaironctl(t, env, 5*time.Minute, "fence", dead, "--wait", "--timeout", "4m")
	t.Logf("kaironctl fence %s (exit %d, %s):\n%s%s", dead, fence.code, fence.took, fence.stdout, fence.stderr)
	if fence.code != 0 {
		t.Fatalf("kaironctl fence exited %d: %s", fence.code, fence.stderr)
	}
	for _, want := range []string{
		fmt.Sprintf("machine %s/keeper: restored on another node from snapshot %s", ns, newest.Name),
		fmt.Sprintf("machine %s/%s (MachineSet web): deleted and replaced on another node", ns, web.Name),
		fmt.Sprintf("machine %s/%s (MachinePool agents): deleted and replaced on another node", ns, warm.Name),
		fmt.Sprintf("machine %s/keeper: recreated on node %s", ns, alive),
		"node " + dead + ": done",
	} {
		if !strings.Contains(fence.stdout, want) {
			t.Errorf("kaironctl fence output lacks %q", want)
		}
	}
	restored := waitPhase(t, env, client.ObjectKey{Namespace: ns, Name: "keeper"}, kaironv1.MachineRunning)
	if restored.Spec.NodeName != alive || restored.UID == keeper.UID || restored.Spec.RestoreFrom == nil || restored.Spec.RestoreFrom.SnapshotName != newest.Name {
		t.Fatalf("keeper after the fence: node %q, restoreFrom %v; want a new Machine on %s from %s", restored.Spec.NodeName, restored.Spec.RestoreFrom, alive, newest.Name)
	}
	con = testenv.DialConsole(t, filepath.Join(state, "b", "instances", ns+"_keeper", "console.sock"))
	after := checkGuestKeptState(t, con, before, "after the fence")
	if after.counter >= beforeDeath.counter {
		t.Errorf("restored counter %d, want it back at the snapshot's (%d just after it, %d before the node died)", after.counter, atSnapshot.counter, beforeDeath.counter)
	}
	con.ExpectText(t, "test -e /tmp/after && echo mark:yes. || echo mark:$((0)).", "mark:0.", 30*time.Second)
	t.Logf("guest counter: %d just after the snapshot, %d when the node died, %d restored", atSnapshot.counter, beforeDeath.counter, after.counter)
	testenv.Eventually(t, 3*time.Minute, "machine set web with one Running Machine on "+alive, func() (bool, string) {
		var l kaironv1.MachineList
		_ = env.Client.List(ctx, &l, client.InNamespace(ns), client.MatchingLabels{kaironv1.LabelMachineSet: "web"})
		return len(l.Items) == 1 && l.Items[0].Spec.NodeName == alive && l.Items[0].Status.Phase == kaironv1.MachineRunning, fmt.Sprint(len(l.Items))
	})
	if !running(stale) {
		console, _ := os.ReadFile(filepath.Join(state, "a", "instances", ns+"_"+web.Name, "console.log"))
		t.Fatalf("the VM left running on %s (pid %d) is gone before the node came back; its console ends:\n%s", dead, stale, tail(string(console), 15))
	}

	// Recovered, the node's agent starts again: the stale VM goes before
	// the Node is Ready.
	if rec := runKaironctl(t, env, time.Minute, "recover", dead); rec.code != 0 || !strings.Contains(rec.stdout, "node "+dead+" recovered") {
		t.Fatalf("kaironctl recover: exit %d\n%s%s", rec.code, rec.stdout, rec.stderr)
	}
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	w, err := cs.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + dead})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	agents[dead] = startDead()
	timeout := time.After(2 * time.Minute)
	for ready := false; !ready; {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatal("the node watch ended")
			}
			if n, isNode := ev.Object.(*corev1.Node); isNode {
				for _, c := range n.Status.Conditions {
					ready = ready || (c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue)
				}
			}
		case <-timeout:
			t.Fatalf("node %s not Ready within 2m of its agent's restart", dead)
		}
	}
	if running(stale) {
		t.Errorf("node %s is Ready while the stale VM of %s (pid %d) still runs", dead, web.Name, stale)
	}
	testenv.Eventually(t, time.Minute, "a StaleVMDestroyed event on node "+dead+" naming "+web.Name, func() (bool, string) {
		var events eventsv1.EventList
		if err := env.Client.List(ctx, &events); err != nil {
			return false, err.Error()
		}
		var saw []string
		for _, e := range events.Items {
			if e.Regarding.Name == dead {
				saw = append(saw, e.Reason)
				if e.Reason == kaironv1.EventReasonStaleVMDestroyed && strings.Contains(e.Note, web.Name) {
					return true, ""
				}
			}
		}
		return false, strings.Join(saw, ",")
	})
	if vms := vmProcesses(t, filepath.Join(state, "a")); len(vms) != 0 {
		t.Errorf("VMs on the recovered node: %v", vms)
	}
}

func listSnapshots(t *testing.T, env *testenv.Env, ns string) []kaironv1.MachineSnapshot {
	t.Helper()
	var l kaironv1.MachineSnapshotList
	if err := env.Client.List(context.Background(), &l, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	return l.Items
}

// runningMachines waits until the Machines matching opts are want, all
// Running, and returns them.
func runningMachines(t *testing.T, env *testenv.Env, ns string, match client.MatchingLabels, want int) []kaironv1.Machine {
	t.Helper()
	var l kaironv1.MachineList
	testenv.Eventually(t, 3*time.Minute, fmt.Sprintf("%d Running machines %v", want, match), func() (bool, string) {
		if err := env.Client.List(context.Background(), &l, client.InNamespace(ns), match); err != nil {
			return false, err.Error()
		}
		n := 0
		for _, m := range l.Items {
			if m.Status.Phase == kaironv1.MachineRunning {
				n++
			}
		}
		return n == want && len(l.Items) == want, fmt.Sprintf("%d of %d Running", n, len(l.Items))
	})
	return l.Items
}

func nodeConditionStatus(t *testing.T, env *testenv.Env, name string, typ corev1.NodeConditionType) corev1.ConditionStatus {
	t.Helper()
	var n corev1.Node
	if err := env.Client.Get(context.Background(), client.ObjectKey{Name: name}, &n); err != nil {
		return ""
	}
	for _, c := range n.Status.Conditions {
		if c.Type == typ {
			return c.Status
		}
	}
	return ""
}

// running: pid is a live process (not gone, not a zombie).
func running(pid int) bool {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	if i := strings.LastIndexByte(string(raw), ')'); i > 0 && i+2 < len(raw) {
		return raw[i+2] != 'Z'
	}
	return true
}
