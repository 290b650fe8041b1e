package e2e

// kaironctl evacuate with the real executor: bin/kairon-controller picks the
// targets and finishes the MachineMigrations, two bin/kairon-node agents with
// the sim backend (hollow VMs, no bridge, taps or network namespace) save,
// transfer and restore the VMs over loopback, and bin/kaironctl is run as a
// user runs it. Nothing here plays the node agents.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
)

// startSimAgent runs bin/kairon-node for nodeName with the sim backend.
// Its Machines get addresses from cidr but no bridge or tap (the sim
// backend's NoLinks), so nothing is created outside the agent's state dir,
// and its agent endpoint (consoles) and migration listener (live streams,
// saved states) listen on loopback. The Node is deleted after the agent is stopped; on failure the
// agent's log is printed.
func startSimAgent(t testing.TB, env *testenv.Env, nodeName, cidr string, cpu int, memory string, extraFlags ...string) *agent {
	t.Helper()
	// Registered first so it runs last, once the agent can no longer
	// recreate the Node with a heartbeat.
	deleteNodeAtEnd(t, env, nodeName)
	stateDir := t.TempDir()
	log := filepath.Join(stateDir, "agent.log")
	f, err := os.Create(log)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(env.BinDir, "kairon-node"), append([]string{
		"--kubeconfig", env.Kubeconfig, "--node-name", nodeName, "--register",
		"--backend", "sim", "--sim-boot-delay", "200ms",
		"--state-dir", stateDir, "--cpu", strconv.Itoa(cpu), "--memory", memory,
		"--network-cidr", cidr, "--listen", "127.0.0.1:0", "--interval", "2s",
		"--client-ca-file", filepath.Join(env.DataDir, "pki", "ca.crt"),
		// Saved states of cold migrations go over the migration listener.
		"--migration-listen", "127.0.0.1:0"}, extraFlags...)...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatal(err)
	}
	f.Close()
	a := &agent{cmd: cmd, stateDir: stateDir, log: log}
	t.Cleanup(func() {
		a.kill()
		if t.Failed() {
			out, _ := os.ReadFile(log)
			t.Logf("kairon-node %s log:\n%s", nodeName, tail(string(out), 30))
		}
	})
	return a
}

// simInstances lists the sim backend's instances on an agent, as
// namespace_name IDs.
func simInstances(a *agent) []string {
	files, _ := filepath.Glob(filepath.Join(a.stateDir, "instances", "*.json"))
	var ids []string
	for _, f := range files {
		ids = append(ids, strings.TrimSuffix(filepath.Base(f), ".json"))
	}
	sort.Strings(ids)
	return ids
}

// migrationFiles lists the saved or downloaded migration states an agent
// still holds.
func migrationFiles(a *agent) []string {
	files, _ := filepath.Glob(filepath.Join(a.stateDir, "migrations", "*"))
	return files
}

// waitNodeReady waits for the agent to have registered its Node as Ready.
func waitNodeReady(t testing.TB, env *testenv.Env, name string) {
	t.Helper()
	testenv.Eventually(t, time.Minute, "node "+name+" Ready", func() (bool, string) {
		n := &corev1.Node{}
		if err := env.Client.Get(context.Background(), client.ObjectKey{Name: name}, n); err != nil {
			return false, err.Error()
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.Status == corev1.ConditionTrue, string(c.Status) + " " + c.Message
			}
		}
		return false, "no Ready condition"
	})
}

// createMachinesOn creates Running-to-be Machines of 1 vCPU and 256Mi,
// bound to node, with labels.
func createMachinesOn(t testing.TB, env *testenv.Env, ns, node string, labels map[string]string, names ...string) {
	t.Helper()
	for _, name := range names {
		m := &kaironv1.Machine{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
			Spec:       kaironv1.MachineSpec{NodeName: node, CPU: 1, Memory: resource.MustParse("256Mi")},
		}
		if err := env.Client.Create(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
}

// waitAllRunning waits for every Machine in ns to be Running on node, as
// its agent reports it.
func waitAllRunning(t testing.TB, env *testenv.Env, ns, node string, want int) {
	t.Helper()
	testenv.Eventually(t, 2*time.Minute, fmt.Sprintf("%d Machines Running on %s", want, node), func() (bool, string) {
		var l kaironv1.MachineList
		if err := env.Client.List(context.Background(), &l, client.InNamespace(ns)); err != nil {
			return false, err.Error()
		}
		ok := 0
		var seen []string
		for _, m := range l.Items {
			if m.Spec.NodeName == node && m.Status.Phase == kaironv1.MachineRunning && m.Status.ObservedGeneration == m.Generation {
				ok++
			}
			seen = append(seen, fmt.Sprintf("%s=%s@%s", m.Name, m.Status.Phase, m.Spec.NodeName))
		}
		return ok == want && len(l.Items) == want, strings.Join(seen, " ")
	})
}

// deleteMachinesAtEnd deletes the namespace's Machines while the agents
// still run (register it after them, so it runs before they are stopped),
// so their finalizers are removed and the namespace can go.
func deleteMachinesAtEnd(t testing.TB, env *testenv.Env, ns string) {
	t.Cleanup(func() {
		ctx := context.Background()
		if err := env.Client.DeleteAllOf(ctx, &kaironv1.Machine{}, client.InNamespace(ns)); err != nil {
			t.Logf("deleting machines: %v", err)
			return
		}
		// Clean-up only: a Machine that lingers is logged, not a failure.
		testenv.Eventually(logOnly{t}, 30*time.Second, "the machines in "+ns+" deleted", func() (bool, string) {
			var l kaironv1.MachineList
			if err := env.Client.List(ctx, &l, client.InNamespace(ns)); err != nil {
				return false, err.Error()
			}
			return len(l.Items) == 0, fmt.Sprintf("%d left", len(l.Items))
		})
	})
}

// logOnly turns a wait's failure into a log line, for clean-ups.
type logOnly struct{ t testing.TB }

func (l logOnly) Helper()                           { l.t.Helper() }
func (l logOnly) Fatalf(format string, args ...any) { l.t.Logf(format, args...) }

// kaironctlRun is one finished run of bin/kaironctl.
type kaironctlRun struct {
	stdout, stderr string
	code           int
	took           time.Duration
}

// runKaironctl runs bin/kaironctl against the test API server and waits
// for it, killing it after limit.
func runKaironctl(t testing.TB, env *testenv.Env, limit time.Duration, args ...string) kaironctlRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(env.BinDir, "kaironctl"), append([]string{"--kubeconfig", env.Kubeconfig}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = 5 * time.Second
	start := time.Now()
	err := cmd.Run()
	run := kaironctlRun{stdout: stdout.String(), stderr: stderr.String(), took: time.Since(start)}
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit) && ctx.Err() == nil:
		run.code = exit.ExitCode()
	default:
		t.Fatalf("kaironctl %s: %v (after %s)\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), err, run.took, run.stdout, run.stderr)
	}
	return run
}

// evacSuffix is the random part of a generated migration name.
var evacSuffix = regexp.MustCompile(`-evac-[a-z0-9]{5}\b`)

// stableNames replaces the random part of generated migration names.
func stableNames(s string) string { return evacSuffix.ReplaceAllString(s, "-evac-XXXXX") }

// migrationsIn lists the namespace's MachineMigrations, oldest first.
func migrationsIn(t testing.TB, env *testenv.Env, ns string) []kaironv1.MachineMigration {
	t.Helper()
	var l kaironv1.MachineMigrationList
	if err := env.Client.List(context.Background(), &l, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	sort.SliceStable(l.Items, func(i, j int) bool {
		return l.Items[i].CreationTimestamp.Before(&l.Items[j].CreationTimestamp)
	})
	return l.Items
}

func describeMigrations(migs []kaironv1.MachineMigration) string {
	var parts []string
	for _, m := range migs {
		parts = append(parts, fmt.Sprintf("%s(machine %s, %s %s->%s, %s: %s)", m.Name, m.Spec.MachineName,
			m.Status.Phase, m.Status.SourceNode, m.Status.TargetNode, m.Status.Reason, m.Status.Message))
	}
	return strings.Join(parts, "; ")
}

// disruptionRecorder watches the Machines and MachineMigrations of one
// namespace and keeps every event, so that the state of the namespace after
// each one can be replayed afterwards: a peak lasting a single write is
// seen, which sparse polling would miss. The API server here runs on one
// etcd, so a resourceVersion is that etcd's revision, one order across both
// kinds; replaying the events of the two watches sorted by it gives the
// states the namespace really went through.
type disruptionRecorder struct {
	selector map[string]string
	cancel   context.CancelFunc
	wg       sync.WaitGroup

	mu       sync.Mutex
	machines []*kaironv1.Machine
	migs     []*kaironv1.MachineMigration
	events   []recordedEvent
	err      error
}

type recordedEvent struct {
	rv      uint64
	at      time.Time
	deleted bool
	machine *kaironv1.Machine
	mig     *kaironv1.MachineMigration
}

// disruptionState is the namespace after one event.
type disruptionState struct {
	at time.Time
	// matching counts the Machines the budget's selector matches, healthy
	// those of them Running and not the target of a non-terminal
	// MachineMigration (the budget's own definition).
	matching, healthy int
	// inFlight counts the non-terminal migrations.
	inFlight int
	// onNode counts the Machines with spec.nodeName the node replayed for.
	onNode int
}

func (s disruptionState) disrupted() int { return s.matching - s.healthy }

var setLoggerOnce sync.Once

// recordDisruptions starts recording; stop it with stop (also done when the
// test ends).
func recordDisruptions(t testing.TB, env *testenv.Env, ns string, selector map[string]string) *disruptionRecorder {
	t.Helper()
	// controller-runtime's client logs through its global logger, and
	// complains with a stack trace when nobody set one.
	setLoggerOnce.Do(func() { ctrllog.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(zapcore.WarnLevel))) })
	wc, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &disruptionRecorder{selector: selector, cancel: cancel}
	var machines kaironv1.MachineList
	if err := wc.List(ctx, &machines, client.InNamespace(ns)); err != nil {
		cancel()
		t.Fatal(err)
	}
	var migs kaironv1.MachineMigrationList
	if err := wc.List(ctx, &migs, client.InNamespace(ns)); err != nil {
		cancel()
		t.Fatal(err)
	}
	for i := range machines.Items {
		r.machines = append(r.machines, &machines.Items[i])
	}
	for i := range migs.Items {
		r.migs = append(r.migs, &migs.Items[i])
	}
	r.wg.Add(2)
	go r.follow(ctx, wc, &kaironv1.MachineList{}, ns, machines.ResourceVersion)
	go r.follow(ctx, wc, &kaironv1.MachineMigrationList{}, ns, migs.ResourceVersion)
	t.Cleanup(r.stop)
	return r
}

// follow records one kind's events from rv on, watching again from the
// last event seen when the API server ends a watch.
func (r *disruptionRecorder) follow(ctx context.Context, wc client.WithWatch, list client.ObjectList, ns, rv string) {
	defer r.wg.Done()
	for ctx.Err() == nil {
		w, err := wc.Watch(ctx, list, &client.ListOptions{Namespace: ns, Raw: &metav1.ListOptions{ResourceVersion: rv}})
		if err != nil {
			if ctx.Err() == nil {
				r.fail(fmt.Errorf("watching %T: %w", list, err))
			}
			return
		}
		for ev := range w.ResultChan() {
			switch ev.Type {
			case watch.Error:
				if ctx.Err() == nil { // not just stop cancelling it
					r.fail(fmt.Errorf("watching %T: %w", list, apierrors.FromObject(ev.Object)))
				}
				w.Stop()
				return
			case watch.Bookmark:
				continue
			}
			obj, ok := ev.Object.(client.Object)
			if !ok {
				r.fail(fmt.Errorf("watching %T: unexpected %T", list, ev.Object))
				w.Stop()
				return
			}
			rv = obj.GetResourceVersion()
			n, err := strconv.ParseUint(rv, 10, 64)
			if err != nil {
				r.fail(fmt.Errorf("resourceVersion %q: %w", rv, err))
				w.Stop()
				return
			}
			e := recordedEvent{rv: n, at: time.Now(), deleted: ev.Type == watch.Deleted}
			switch o := obj.(type) {
			case *kaironv1.Machine:
				e.machine = o
			case *kaironv1.MachineMigration:
				e.mig = o
			}
			r.mu.Lock()
			r.events = append(r.events, e)
			r.mu.Unlock()
		}
		w.Stop()
	}
}

func (r *disruptionRecorder) fail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err == nil {
		r.err = err
	}
}

// stop ends the watches.
func (r *disruptionRecorder) stop() {
	r.cancel()
	r.wg.Wait()
}

// replay stops the recording and returns the state before the first
// event and after each one, in resourceVersion order, counting Machines on
// node. It fails t if a watch broke, since states would then be missing.
func (r *disruptionRecorder) replay(t testing.TB, node string) []disruptionState {
	t.Helper()
	r.stop()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		t.Fatalf("recording disruptions: %v", r.err)
	}
	machines := map[string]*kaironv1.Machine{}
	for _, m := range r.machines {
		machines[m.Name] = m
	}
	migs := map[string]*kaironv1.MachineMigration{}
	for _, m := range r.migs {
		migs[m.Name] = m
	}
	events := append([]recordedEvent(nil), r.events...)
	sort.SliceStable(events, func(i, j int) bool { return events[i].rv < events[j].rv })

	state := func(at time.Time) disruptionState {
		targeted := map[string]bool{}
		s := disruptionState{at: at}
		for _, mig := range migs {
			if !mig.Status.Phase.IsTerminal() {
				s.inFlight++
				targeted[mig.Spec.MachineName] = true
			}
		}
		for _, m := range machines {
			if m.Spec.NodeName == node {
				s.onNode++
			}
			if !selects(r.selector, m.Labels) {
				continue
			}
			s.matching++
			if m.Status.Phase == kaironv1.MachineRunning && !targeted[m.Name] {
				s.healthy++
			}
		}
		return s
	}
	var start time.Time
	if len(events) > 0 {
		start = events[0].at
	}
	states := []disruptionState{state(start)}
	for _, e := range events {
		switch {
		case e.machine != nil && e.deleted:
			delete(machines, e.machine.Name)
		case e.machine != nil:
			machines[e.machine.Name] = e.machine
		case e.mig != nil && e.deleted:
			delete(migs, e.mig.Name)
		case e.mig != nil:
			migs[e.mig.Name] = e.mig
		}
		states = append(states, state(e.at))
	}
	return states
}

func selects(selector, labels map[string]string) bool {
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// lineIndex is the index of the first line of lines equal to want, or -1.
func lineIndex(lines []string, want string) int {
	for i, l := range lines {
		if l == want {
			return i
		}
	}
	return -1
}

// A node with three Machines under a MachineDisruptionBudget of
// minAvailable 2, evacuated with the real executor: one plain pass moves
// one Machine and skips the other two; --wait then empties the node one
// Machine at a time, and at no moment are fewer than 2 of the 3 healthy.
func TestEvacuateWithRealMigrations(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	source, target := ns+"-src", ns+"-dst"
	startController(t, env)
	src := startSimAgent(t, env, source, "10.88.61.0/24", 4, "4Gi")
	dst := startSimAgent(t, env, target, "10.88.62.0/24", 4, "4Gi")
	deleteMachinesAtEnd(t, env, ns)
	waitNodeReady(t, env, source)
	waitNodeReady(t, env, target)

	web := map[string]string{"app": ns} // budgets select across namespaces
	createMachinesOn(t, env, ns, source, web, "web-1", "web-2", "web-3")
	budget := &kaironv1.MachineDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web-tier"},
		Spec:       kaironv1.MachineDisruptionBudgetSpec{Selector: web, MinAvailable: ptrTo(intstr.FromInt32(2))},
	}
	if err := env.Client.Create(ctx, budget); err != nil {
		t.Fatal(err)
	}
	waitAllRunning(t, env, ns, source, 3)
	env.Kubectl(t, "cordon", source)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("objects:\n%s", kubectlQuiet(env, "-n", ns, "get", "machines,machinemigrations,machinedisruptionbudgets", "-o", "wide"))
		}
	})
	rec := recordDisruptions(t, env, ns, web)

	// (a) One pass: one migration, two Machines skipped, exit status 1.
	once := runKaironctl(t, env, time.Minute, "evacuate", source)
	t.Logf("kaironctl evacuate %s (exit %d, %s):\n%s%s", source, once.code, once.took, once.stdout, once.stderr)
	if once.code != 1 {
		t.Errorf("evacuate without --wait exited %d, want 1 (two Machines skipped)", once.code)
	}
	skippedFirst := fmt.Sprintf("budget %s/web-tier allows no more disruptions (3 healthy, 2 desired, 0 allowed; 1 already spent in this pass)", ns)
	wantOnce := []string{
		fmt.Sprintf("machine %s/web-1: migration %s/web-1-evac-XXXXX created", ns, ns),
		fmt.Sprintf("machine %s/web-2 skipped: %s", ns, skippedFirst),
		fmt.Sprintf("machine %s/web-3 skipped: %s", ns, skippedFirst),
		fmt.Sprintf("node %s: 3 Machines, 1 migration created, 2 skipped", source),
	}
	if got := strings.Split(strings.TrimSuffix(stableNames(once.stdout), "\n"), "\n"); strings.Join(got, "\n") != strings.Join(wantOnce, "\n") {
		t.Errorf("evacuate stdout:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(wantOnce, "\n"))
	}
	wantErr := fmt.Sprintf("error: 2 of 3 Machines on node %s skipped: %s/web-2, %s/web-3; run kaironctl evacuate %s again once migrations have finished, or add --wait\n",
		source, ns, ns, source)
	if once.stderr != wantErr {
		t.Errorf("evacuate stderr %q, want %q", once.stderr, wantErr)
	}
	migs := migrationsIn(t, env, ns)
	if len(migs) != 1 || migs[0].Spec.MachineName != "web-1" || migs[0].Labels[kaironv1.LabelEvacuatedNode] != source ||
		migs[0].Spec.Strategy != kaironv1.MigrationCold || migs[0].Spec.TargetNode != "" {
		t.Fatalf("after one pass, migrations: %s; want one cold migration of web-1 labeled %s=%s, no target", describeMigrations(migs), kaironv1.LabelEvacuatedNode, source)
	}

	// The executor carries it out: web-1 is now Running on the other node,
	// with an address from that node's range.
	first := client.ObjectKeyFromObject(&migs[0])
	testenv.Eventually(t, 2*time.Minute, "migration "+first.Name+" Succeeded", func() (bool, string) {
		mig := &kaironv1.MachineMigration{}
		if err := env.Client.Get(ctx, first, mig); err != nil {
			return false, err.Error()
		}
		if mig.Status.Phase == kaironv1.MigrationFailed {
			t.Fatalf("migration %s failed: %s: %s", mig.Name, mig.Status.Reason, mig.Status.Message)
		}
		return mig.Status.Phase == kaironv1.MigrationSucceeded, describeMigrations([]kaironv1.MachineMigration{*mig})
	})
	web1 := &kaironv1.Machine{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "web-1"}, web1); err != nil {
		t.Fatal(err)
	}
	if web1.Spec.NodeName != target || web1.Status.Phase != kaironv1.MachineRunning {
		t.Errorf("web-1 after its migration: %s on %q, want Running on %s", web1.Status.Phase, web1.Spec.NodeName, target)
	}
	if len(web1.Status.Addresses) != 1 || !netip.MustParsePrefix("10.88.62.0/24").Contains(netip.MustParseAddr(web1.Status.Addresses[0].Address)) {
		t.Errorf("web-1's addresses %v, want one from %s's 10.88.62.0/24", web1.Status.Addresses, target)
	}

	// (b) --wait empties the node, one Machine at a time.
	waited := runKaironctl(t, env, 4*time.Minute, "evacuate", source, "--wait", "--poll-interval", "1s", "--timeout", "3m")
	t.Logf("kaironctl evacuate %s --wait (exit %d, %s):\n%s%s", source, waited.code, waited.took, waited.stdout, waited.stderr)
	if waited.code != 0 || waited.stderr != "" {
		t.Errorf("evacuate --wait exited %d with stderr %q, want 0 and nothing", waited.code, waited.stderr)
	}
	lines := strings.Split(strings.TrimSuffix(stableNames(waited.stdout), "\n"), "\n")
	created2 := fmt.Sprintf("machine %s/web-2: migration %s/web-2-evac-XXXXX created", ns, ns)
	waiting3 := fmt.Sprintf("machine %s/web-3 skipped: %s; waiting", ns, skippedFirst)
	moved2 := fmt.Sprintf("machine %s/web-2 moved to %s", ns, target)
	created3 := fmt.Sprintf("machine %s/web-3: migration %s/web-3-evac-XXXXX created", ns, ns)
	moved3 := fmt.Sprintf("machine %s/web-3 moved to %s", ns, target)
	// web-1 left before this run, so it counts two Machines; the first pass
	// sees all three healthy, spends the one disruption on web-2 and holds
	// web-3 back.
	progress := regexp.MustCompile(`^\[\S+\] node ` + regexp.QuoteMeta(source) +
		`: 0 of 2 Machines moved off; still on it: 1 migrating, 1 waiting \(1 on budget ` + regexp.QuoteMeta(ns) + `/web-tier\); next pass in 1s$`)
	if len(lines) < 4 || lines[0] != created2 || lines[1] != waiting3 || !progress.MatchString(lines[2]) {
		t.Errorf("evacuate --wait began with\n%s\nwant\n%s\n%s\n%s", strings.Join(lines[:min(3, len(lines))], "\n"), created2, waiting3, progress)
	}
	// web-3 gets its migration only once web-2's has given the budget its
	// room back: web-2 is reported moved first.
	i2, i3, j3 := lineIndex(lines, moved2), lineIndex(lines, created3), lineIndex(lines, moved3)
	if i2 < 0 || i3 < 0 || j3 < 0 || !(i2 < i3 && i3 < j3) {
		t.Errorf("want %q, then %q, then %q in the output; at lines %d, %d, %d", moved2, created3, moved3, i2, i3, j3)
	}
	done := regexp.MustCompile(`^node ` + regexp.QuoteMeta(source) + ` is empty: 2 Machines moved off in \S+ \([0-9]+ passes\)$`)
	if last := lines[len(lines)-1]; !done.MatchString(last) {
		t.Errorf("last line %q, want it to match %s", last, done)
	}
	for _, l := range lines {
		if strings.Contains(l, "failed") || strings.Contains(l, "web-1") {
			t.Errorf("unexpected line %q", l)
		}
	}

	// Every Machine left the node through a real migration, each once.
	migs = migrationsIn(t, env, ns)
	if len(migs) != 3 {
		t.Errorf("%d migrations, want 3 (one per Machine): %s", len(migs), describeMigrations(migs))
	}
	moved := map[string]bool{}
	for _, mig := range migs {
		if mig.Status.Phase != kaironv1.MigrationSucceeded || mig.Status.SourceNode != source || mig.Status.TargetNode != target ||
			mig.Status.DowntimeMillis <= 0 || mig.Labels[kaironv1.LabelEvacuatedNode] != source {
			t.Errorf("migration not a Succeeded move %s -> %s with a downtime: %s", source, target, describeMigrations([]kaironv1.MachineMigration{mig}))
		}
		if moved[mig.Spec.MachineName] {
			t.Errorf("machine %s migrated twice: %s", mig.Spec.MachineName, describeMigrations(migs))
		}
		moved[mig.Spec.MachineName] = true
	}
	t.Logf("migrations: %s", describeMigrations(migs))
	waitAllRunning(t, env, ns, target, 3)
	testenv.Eventually(t, 30*time.Second, "the source agent to drop its copies and saved states", func() (bool, string) {
		left, files := simInstances(src), append(migrationFiles(src), migrationFiles(dst)...)
		return len(left) == 0 && len(files) == 0, fmt.Sprintf("instances on %s: %v; migration files: %v", source, left, files)
	})
	if got, want := strings.Join(simInstances(dst), " "), ns+"_web-1 "+ns+"_web-2 "+ns+"_web-3"; got != want {
		t.Errorf("instances on %s: %q, want %q", target, got, want)
	}

	// The budget held at every moment of both runs.
	states := rec.replay(t, source)
	minHealthy, maxInFlight := 3, 0
	for _, s := range states {
		if s.matching != 3 {
			t.Errorf("at %s the budget's selector matched %d Machines, want 3", s.at.Format(time.StampMilli), s.matching)
		}
		minHealthy = min(minHealthy, s.healthy)
		maxInFlight = max(maxInFlight, s.inFlight)
	}
	t.Logf("%d states recorded; fewest healthy %d, most migrations in flight %d", len(states), minHealthy, maxInFlight)
	if minHealthy < 2 {
		t.Errorf("only %d of 3 Machines were healthy at one point; the budget wants at least 2", minHealthy)
	}
	if minHealthy != 2 || maxInFlight != 1 {
		// Three migrations each made one Machine unhealthy for a while; a
		// recording that never saw it would have proved nothing.
		t.Errorf("recording saw fewest healthy %d and at most %d migrations in flight, want 2 and 1", minHealthy, maxInFlight)
	}
	if end := states[len(states)-1]; end.onNode != 0 || end.healthy != 3 || end.inFlight != 0 {
		t.Errorf("recording ended with %d Machines on %s, %d healthy, %d migrations in flight; want 0, 3, 0", end.onNode, source, end.healthy, end.inFlight)
	}
}

func ptrTo[T any](v T) *T { return &v }
