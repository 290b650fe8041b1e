package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/rules"
	"github.com/zyvor/kairon/internal/testenv"
)

// Issue 16's node failure on kairon-local itself, real QEMU: node-2 is
// stopped (`kairon-local node stop`) while everything starts on node-1 and
// a SnapshotSchedule snapshots a guest that keeps a counter in memory; then
// node-2 starts again and node-1's agent is killed (`kairon-local node
// kill`) with its VMs but one, left running as a host that is down to the
// cluster may still run some. kairon-local runs on without it. The Node goes
// Unknown, the pool replaces its warm member on node-2 and a new claim binds
// there, never to the dead member. kaironctl fence brings the snapshotted
// Machine back on node-2 with its memory as of the snapshot, and the
// MachineSet's Machine is replaced. kaironctl recover and `kairon-local node
// start`: the VM left running is destroyed before node-1 reports Ready.
func TestFenceOnKaironLocal(t *testing.T) {
	const dead, alive, ns = "node-1", "node-2", "default"
	c := startKaironLocalWith(t, 2,
		"--node-cpu", "4", "--node-memory", "2Gi",
		// Short, so that the dead node shows within seconds.
		"--node-grace-period", "6s", "--lease-renew-interval", "1s")
	env := c.env()
	ctx := context.Background()
	t.Cleanup(func() {
		if t.Failed() {
			for _, node := range []string{dead, alive} {
				out, _ := os.ReadFile(filepath.Join(c.dataDir, "logs", "kairon-"+node+".log"))
				t.Logf("kairon-%s log:\n%s", node, tail(string(out), 30))
			}
			out, _ := os.ReadFile(filepath.Join(c.dataDir, "logs", "kairon-controller.log"))
			t.Logf("kairon-controller log:\n%s", tail(string(out), 30))
			t.Logf("objects:\n%s", kubectlQuiet(env, "-n", ns, "get", "machines,machineclaims,machinesnapshots,machinesets,machinepools", "-o", "wide"))
		}
	})

	// node-2 is down (stopped as Ctrl-C would stop it) while everything
	// starts, so everything starts on node-1.
	out := c.node("stop", alive)
	if !strings.Contains(out, "stopped kairon-"+alive) {
		t.Errorf("kairon-local node stop %s: %q", alive, out)
	}
	testenv.Eventually(t, time.Minute, "node "+alive+" not Ready", func() (bool, string) {
		s := nodeConditionStatus(t, env, alive, corev1.NodeReady)
		return s != corev1.ConditionTrue, string(s)
	})
	c.kubectl(`apiVersion: kairon.zyvor.dev/v1alpha1
kind: Machine
metadata: {name: keeper, namespace: default, labels: {app: keeper}}
spec: {cpu: 1, memory: 256Mi}
---
apiVersion: kairon.zyvor.dev/v1alpha1
kind: MachineSet
metadata: {name: web, namespace: default}
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec: {cpu: 1, memory: 256Mi}
---
apiVersion: kairon.zyvor.dev/v1alpha1
kind: MachinePool
metadata: {name: agents, namespace: default}
spec:
  replicas: 1
  template:
    metadata: {labels: {app: agents}}
    spec: {cpu: 1, memory: 256Mi}
`, "apply", "-f", "-")
	keeper := waitPhase(t, env, client.ObjectKey{Namespace: ns, Name: "keeper"}, kaironv1.MachineRunning)
	web := runningMachines(t, env, ns, client.MatchingLabels{kaironv1.LabelMachineSet: "web"}, 1)[0]
	warm := runningMachines(t, env, ns, client.MatchingLabels{kaironv1.LabelMachinePool: "agents"}, 1)[0]
	for _, m := range []kaironv1.Machine{*keeper, web, warm} {
		if m.Spec.NodeName != dead {
			t.Fatalf("machine %s on %q, want %s", m.Name, m.Spec.NodeName, dead)
		}
	}

	// The guest keeps a token and a counter in memory; a SnapshotSchedule
	// with a slot due snapshots it, and is suspended once it has.
	con := c.console(dead, ns, "keeper")
	before := startGuestState(t, con)
	c.applyDueSchedule("keep", "{app: keeper}", 2)
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
	c.kubectl("", "patch", "snapshotschedule", "keep", "--type", "merge", "-p", `{"spec":{"suspend":true}}`)
	testenv.Eventually(t, 2*time.Minute, "no snapshot of keeper pending", func() (bool, string) {
		_, pending := scheduled()
		return len(pending) == 0, fmt.Sprint(pending)
	})
	newest := rules.NewestReadySnapshot(listSnapshots(t, env, ns), ns, "keeper")
	atSnapshot := readGuestState(t, con)
	// After the snapshot: a mark the restored guest must not have, and the
	// counter well past its value at the snapshot.
	con.Expect(t, "echo after > /tmp/after; echo marked:$((1+1)).", regexp.MustCompile(`marked:2\.`), 30*time.Second)
	con.Expect(t, fmt.Sprintf("while [ \"$(cat /tmp/counter)\" -lt %d ]; do usleep 100000; done; echo past:$((1+1)).", atSnapshot.counter+50),
		regexp.MustCompile(`past:2\.`), time.Minute)
	beforeDeath := readGuestState(t, con)

	// node-2 comes back; node-1's agent is killed, and all its VMs but
	// web's. kairon-local runs on.
	if out := c.node("start", alive); !strings.Contains(out, "kairon-"+alive+" runs again") {
		t.Errorf("kairon-local node start %s: %q", alive, out)
	}
	out = c.node("kill", dead)
	t.Logf("kairon-local node kill %s: %s", dead, out)
	for _, want := range []string{"killed kairon-" + dead, ns + "/keeper", ns + "/" + web.Name} {
		if !strings.Contains(out, want) {
			t.Errorf("kairon-local node kill %s does not say %q", dead, want)
		}
	}
	if _, err := c.nodeCommand("kill", dead); err == nil {
		t.Errorf("a second kairon-local node kill %s succeeded; want it refused, the agent is not running", dead)
	}
	vms := vmProcesses(t, filepath.Join(c.dataDir, "nodes", dead))
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
	if c.hasExited() {
		t.Fatalf("kairon-local exited when an agent was killed:\n%s", tail(c.output(), 20))
	}

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
	c.kubectl("apiVersion: kairon.zyvor.dev/v1alpha1\nkind: MachineClaim\nmetadata: {name: late, namespace: default}\nspec: {poolName: agents}\n", "apply", "-f", "-")
	var bound string
	testenv.Eventually(t, 2*time.Minute, "claim late Bound", func() (bool, string) {
		s := jsonpathQuiet(env, testenv.Query{Namespace: ns, Resource: "machineclaim", Name: "late"}, "{.status.phase} {.status.machineName}")
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
	con = c.console(alive, ns, "keeper")
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
		t.Fatalf("the VM left running on %s (pid %d) is gone before the node came back", dead, stale)
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
	started := make(chan string, 1)
	go func() {
		out, err := c.nodeCommand("start", dead)
		if err != nil {
			out += err.Error()
		}
		started <- out
	}()
	timeout := time.After(3 * time.Minute)
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
			t.Fatalf("node %s not Ready within 3m of kairon-local node start", dead)
		}
	}
	if running(stale) {
		t.Errorf("node %s is Ready while the stale VM of %s (pid %d) still runs", dead, web.Name, stale)
	}
	w.Stop()
	if out := <-started; !strings.Contains(out, "kairon-"+dead+" runs again") {
		t.Errorf("kairon-local node start %s: %q", dead, out)
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
	if vms := vmProcesses(t, filepath.Join(c.dataDir, "nodes", dead)); len(vms) != 0 {
		t.Errorf("VMs on the recovered node: %v", vms)
	}
	// The guests restored and replaced elsewhere keep what they have; the
	// rejoined node gives none of their addresses to anyone (issue 42).
	checkAddressesUnique(t, env, "after the fenced node rejoined")

	// Everything stops as usual, the restarted agent included.
	c.stop()
	if vms := vmProcesses(t, c.dataDir); len(vms) != 0 {
		t.Errorf("QEMU processes left after SIGTERM: %v", vms)
	}
}

// startKaironLocalWith is startKaironLocal with more flags for `up`.
func startKaironLocalWith(t *testing.T, nodes int, flags ...string) *localCluster {
	t.Helper()
	dataDir, err := os.MkdirTemp("", "kfl-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dataDir) })
	c := &localCluster{t: t, binDir: testenv.BinDir(t), netNS: netns(t), dataDir: dataDir, nodes: nodes, port: stablePort(t), flags: flags}
	c.kubeconfig = filepath.Join(c.dataDir, "kubeconfig")
	t.Cleanup(func() { killVMs(t, c.dataDir) })
	c.up()
	return c
}

// env is the cluster as a testenv.Env, for the helpers that take one.
func (c *localCluster) env() *testenv.Env {
	c.t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", c.kubeconfig)
	if err != nil {
		c.t.Fatal(err)
	}
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, kaironv1.AddToScheme} {
		if err := add(scheme); err != nil {
			c.t.Fatal(err)
		}
	}
	setLoggerOnce.Do(func() { ctrllog.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(zapcore.WarnLevel))) })
	cl, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		c.t.Fatal(err)
	}
	return &testenv.Env{Config: cfg, Client: cl, Scheme: scheme, Kubeconfig: c.kubeconfig, BinDir: c.binDir, DataDir: c.dataDir}
}

// nodeCommand runs `kairon-local node ACTION NODE` on the cluster's data dir.
func (c *localCluster) nodeCommand(action, node string) (string, error) {
	cmd := exec.Command(filepath.Join(c.binDir, "kairon-local"), "node", action, node, "--data-dir", c.dataDir)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// node is nodeCommand that must succeed.
func (c *localCluster) node(action, node string) string {
	c.t.Helper()
	out, err := c.nodeCommand(action, node)
	if err != nil {
		c.t.Fatalf("kairon-local node %s %s: %v\n%s", action, node, err, out)
	}
	return out
}
