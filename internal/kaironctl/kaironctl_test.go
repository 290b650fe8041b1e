package kaironctl_test

// Integration tests: each runs the real kaironctl command tree against the
// real API server of internal/testenv.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/kaironctl"
	"github.com/zyvor/kairon/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

type result struct {
	stdout, stderr string
	code           int
}

// kctl runs kaironctl with args against env's API server.
func kctl(t *testing.T, env *testenv.Env, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return kctlContext(ctx, env.Kubeconfig, &bytes.Buffer{}, args...)
}

func kctlContext(ctx context.Context, kubeconfig string, stdout interface {
	Write([]byte) (int, error)
	String() string
}, args ...string) result {
	var stderr bytes.Buffer
	if kubeconfig != "" {
		args = append([]string{"--kubeconfig", kubeconfig}, args...)
	}
	code := kaironctl.Main(ctx, args, stdout, &stderr)
	return result{stdout: stdout.String(), stderr: stderr.String(), code: code}
}

// ok fails t unless r succeeded without printing to stderr.
func (r result) ok(t *testing.T, args ...string) result {
	t.Helper()
	if r.code != 0 || r.stderr != "" {
		t.Fatalf("kaironctl %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	return r
}

// failed fails t unless r exited 1 with one "error: " line on stderr
// containing every one of want.
func (r result) failed(t *testing.T, want ...string) {
	t.Helper()
	if r.code != 1 {
		t.Errorf("exit code %d, want 1 (stderr %q)", r.code, r.stderr)
	}
	if !strings.HasPrefix(r.stderr, "error: ") || strings.Count(r.stderr, "\n") != 1 || !strings.HasSuffix(r.stderr, "\n") {
		t.Errorf("stderr is not one error line: %q", r.stderr)
	}
	for _, w := range want {
		if !strings.Contains(r.stderr, w) {
			t.Errorf("stderr %q does not contain %q", r.stderr, w)
		}
	}
}

// watchEvents calls on with every change to list's kind in ns, starting
// with the objects there now (a watch without a resourceVersion sends them
// first, as ADDED), until on reports done, fails, or ctx ends. It is how a
// test standing in for a controller or a node agent reacts to what
// kaironctl does, without polling.
func watchEvents(ctx context.Context, env *testenv.Env, list client.ObjectList, ns string, on func(ev watch.Event) (done bool, err error)) error {
	c, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	if err != nil {
		return err
	}
	for {
		w, err := c.Watch(ctx, list.DeepCopyObject().(client.ObjectList), client.InNamespace(ns))
		if err != nil {
			return err
		}
		done, err := func() (bool, error) {
			defer w.Stop()
			for {
				select {
				case <-ctx.Done():
					return false, ctx.Err()
				case ev, ok := <-w.ResultChan():
					if !ok {
						return false, nil // closed by the server: watch again
					}
					if ev.Type == watch.Error {
						return false, apierrors.FromObject(ev.Object)
					}
					if done, err := on(ev); done || err != nil {
						return done, err
					}
				}
			}
		}()
		if done || err != nil {
			return err
		}
	}
}

func meta(ns, name string) metav1.ObjectMeta { return metav1.ObjectMeta{Namespace: ns, Name: name} }

// vmSpec is a small valid Machine spec. Typed objects always send
// spec.memory, and "0" is below the API's minimum.
func vmSpec() kaironv1.MachineSpec {
	return kaironv1.MachineSpec{CPU: 1, Memory: resource.MustParse("256Mi")}
}

func plainMachine(ns, name string) *kaironv1.Machine {
	return &kaironv1.Machine{ObjectMeta: meta(ns, name), Spec: vmSpec()}
}

func template(labels map[string]string) kaironv1.MachineTemplateSpec {
	return kaironv1.MachineTemplateSpec{Metadata: kaironv1.MachineTemplateMeta{Labels: labels}, Spec: vmSpec()}
}

// machine creates a Machine and then sets its status phase.
func machine(t *testing.T, env *testenv.Env, ns, name, node string, cpu int32, memory string, phase kaironv1.MachinePhase) *kaironv1.Machine {
	t.Helper()
	m := &kaironv1.Machine{ObjectMeta: meta(ns, name), Spec: kaironv1.MachineSpec{NodeName: node, CPU: cpu, Memory: resource.MustParse(memory)}}
	env.Create(t, m)
	if phase != "" {
		m.Status.Phase = phase
		env.SetStatus(t, m)
	}
	return m
}

// cellStarts is where each whitespace-separated cell of line begins.
func cellStarts(line string) []int {
	var starts []int
	for i := range line {
		if line[i] != ' ' && (i == 0 || line[i-1] == ' ') {
			starts = append(starts, i)
		}
	}
	return starts
}

// lineStarting returns the output line whose first field is name.
func lineStarting(out, name string) []string {
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] == name {
			return f
		}
	}
	return nil
}

// kindCase is one kind with one object of it in a namespace.
type kindCase struct {
	kind     string // what the user types
	singular string // as in "machine/NAME"
	goKind   string
	name     string
	headers  []string
	row      []string // the object's row, AGE left out
}

// objectsOfEveryKind creates one object of every namespaced kind in ns, with
// statuses set as a controller would.
func objectsOfEveryKind(t *testing.T, env *testenv.Env, ns string) []kindCase {
	m := &kaironv1.Machine{ObjectMeta: meta(ns, "web-1"), Spec: kaironv1.MachineSpec{NodeName: "node-1", CPU: 2, Memory: resource.MustParse("512Mi")}}
	m.Labels = map[string]string{kaironv1.LabelMachinePool: "agents", "tier": "web"}
	env.Create(t, m)
	m.Status = kaironv1.MachineStatus{Phase: kaironv1.MachineRunning, Addresses: []kaironv1.MachineAddress{{Type: "InternalIP", Address: "10.77.0.5"}}}
	env.SetStatus(t, m)

	ms := &kaironv1.MachineSet{ObjectMeta: meta(ns, "web"), Spec: kaironv1.MachineSetSpec{
		Replicas: ptr.To[int32](3),
		Selector: kaironv1.MachineSelector{MatchLabels: map[string]string{"app": "web"}},
		Template: template(map[string]string{"app": "web"}),
	}}
	env.Create(t, ms)
	ms.Status = kaironv1.MachineSetStatus{Replicas: 3, ReadyReplicas: 2}
	env.SetStatus(t, ms)

	mp := &kaironv1.MachinePool{ObjectMeta: meta(ns, "agents"), Spec: kaironv1.MachinePoolSpec{Replicas: ptr.To[int32](4), Template: template(nil)}}
	env.Create(t, mp)
	mp.Status = kaironv1.MachinePoolStatus{Replicas: 4, Warm: 4, ReadyWarm: 3, Claimed: 1}
	env.SetStatus(t, mp)

	mc := &kaironv1.MachineClaim{ObjectMeta: meta(ns, "job-42"), Spec: kaironv1.MachineClaimSpec{PoolName: "agents"}}
	env.Create(t, mc)
	mc.Status = kaironv1.MachineClaimStatus{Phase: kaironv1.ClaimBound, MachineName: "agents-8c21d0e4", BindMillis: 412}
	env.SetStatus(t, mc)

	mdb := &kaironv1.MachineDisruptionBudget{ObjectMeta: meta(ns, "web-tier"), Spec: kaironv1.MachineDisruptionBudgetSpec{
		Selector: map[string]string{"tier": "web"}, MinAvailable: ptr.To(intstr.FromString("2")),
	}}
	env.Create(t, mdb)
	mdb.Status = kaironv1.MachineDisruptionBudgetStatus{ExpectedMachines: 3, CurrentHealthy: 3, DesiredHealthy: 2, DisruptionsAllowed: 1}
	env.SetStatus(t, mdb)

	mmig := &kaironv1.MachineMigration{ObjectMeta: meta(ns, "move-web-1"), Spec: kaironv1.MachineMigrationSpec{MachineName: "web-1", Strategy: kaironv1.MigrationLive}}
	env.Create(t, mmig)
	mmig.Status = kaironv1.MachineMigrationStatus{Phase: kaironv1.MigrationRunning, SourceNode: "node-1", TargetNode: "node-2"}
	env.SetStatus(t, mmig)

	mnp := &kaironv1.MachineNetworkPolicy{ObjectMeta: meta(ns, "web-egress"), Spec: kaironv1.MachineNetworkPolicySpec{
		MachineName: "web-1", Egress: kaironv1.EgressRules{AllowPorts: []kaironv1.PortRange{"443"}},
	}}
	env.Create(t, mnp)
	mnp.Status = kaironv1.MachineNetworkPolicyStatus{Machines: 1}
	env.SetStatus(t, mnp)

	mq := &kaironv1.MachineQuota{ObjectMeta: meta(ns, "team"), Spec: kaironv1.MachineQuotaSpec{Hard: kaironv1.MachineResources{
		Machines: ptr.To[int32](10), CPU: ptr.To[int32](16), Memory: ptr.To(resource.MustParse("8Gi")),
	}}}
	env.Create(t, mq)
	mq.Status = kaironv1.MachineQuotaStatus{Used: kaironv1.MachineResources{Machines: ptr.To[int32](1), CPU: ptr.To[int32](2), Memory: ptr.To(resource.MustParse("512Mi"))}}
	env.SetStatus(t, mq)

	return []kindCase{
		{"machines", "machine", "Machine", "web-1",
			[]string{"NAME", "PHASE", "NODE", "CPU", "MEMORY", "ADDRESS", "POOL", "AGE"},
			[]string{"web-1", "Running", "node-1", "2", "512Mi", "10.77.0.5", "agents"}},
		{"ms", "machineset", "MachineSet", "web",
			[]string{"NAME", "DESIRED", "CURRENT", "READY", "AGE"},
			[]string{"web", "3", "3", "2"}},
		{"machinepools", "machinepool", "MachinePool", "agents",
			[]string{"NAME", "DESIRED", "WARM", "READY", "CLAIMED", "AGE"},
			[]string{"agents", "4", "4", "3", "1"}},
		{"mc", "machineclaim", "MachineClaim", "job-42",
			[]string{"NAME", "POOL", "PHASE", "MACHINE", "BIND-MS", "AGE"},
			[]string{"job-42", "agents", "Bound", "agents-8c21d0e4", "412"}},
		{"budgets", "budget", "MachineDisruptionBudget", "web-tier",
			[]string{"NAME", "MINAVAILABLE", "MAXUNAVAILABLE", "EXPECTED", "HEALTHY", "DESIRED", "ALLOWED"},
			[]string{"web-tier", "2", "-", "3", "3", "2", "1"}},
		{"mmig", "machinemigration", "MachineMigration", "move-web-1",
			[]string{"NAME", "MACHINE", "STRATEGY", "PHASE", "SOURCE", "TARGET", "AGE"},
			[]string{"move-web-1", "web-1", "live", "Running", "node-1", "node-2"}},
		{"mnp", "machinenetworkpolicy", "MachineNetworkPolicy", "web-egress",
			[]string{"NAME", "MACHINE", "MACHINES", "AGE"},
			[]string{"web-egress", "web-1", "1"}},
		{"quota", "machinequota", "MachineQuota", "team",
			[]string{"NAME", "MACHINES", "CPU", "MEMORY", "AGE"},
			[]string{"team", "1/10", "2/16", "512Mi/8Gi"}},
	}
}

func TestGetEveryKind(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	cases := objectsOfEveryKind(t, env, ns)

	for _, tc := range cases {
		t.Run(tc.kind, func(t *testing.T) {
			// Table: the headers, then the object's row.
			r := kctl(t, env, "get", tc.kind, "-n", ns).ok(t, "get", tc.kind)
			lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
			if len(lines) != 2 {
				t.Fatalf("want a header and one row, got:\n%s", r.stdout)
			}
			if got := strings.Fields(lines[0]); !reflect.DeepEqual(got, tc.headers) {
				t.Errorf("headers %q, want %q", got, tc.headers)
			}
			row := strings.Fields(lines[1])
			if len(row) != len(tc.headers) || !reflect.DeepEqual(row[:len(tc.row)], tc.row) {
				t.Errorf("row %q, want %q then AGE", row, tc.row)
			}
			// Columns are aligned: each cell starts where its header does.
			if hs, rs := cellStarts(lines[0]), cellStarts(lines[1]); !reflect.DeepEqual(hs, rs) {
				t.Errorf("columns are not aligned (%v vs %v):\n%s", hs, rs, r.stdout)
			}

			// The same by name, and -o wide keeps every column.
			// AGE may tick over between the two calls, so it is left out.
			byName := kctl(t, env, "get", tc.kind, tc.name, "-n", ns).ok(t)
			if withoutAge(byName.stdout) != withoutAge(r.stdout) {
				t.Errorf("get by name printed\n%s\nwant\n%s", byName.stdout, r.stdout)
			}
			// KIND/NAME, as -o name prints it, names the same object.
			slashed := kctl(t, env, "get", tc.singular+"/"+tc.name, "-n", ns).ok(t)
			if withoutAge(slashed.stdout) != withoutAge(r.stdout) {
				t.Errorf("get %s/%s printed\n%s\nwant\n%s", tc.singular, tc.name, slashed.stdout, r.stdout)
			}
			wide := kctl(t, env, "get", tc.kind, "-n", ns, "-o", "wide").ok(t)
			if hs := strings.Fields(strings.SplitN(wide.stdout, "\n", 2)[0]); len(hs) < len(tc.headers) {
				t.Errorf("-o wide headers %q lack some of %q", hs, tc.headers)
			}

			// -A adds a NAMESPACE column.
			all := kctl(t, env, "get", tc.kind, "-A").ok(t)
			if !strings.HasPrefix(all.stdout, "NAMESPACE ") {
				t.Errorf("-A output does not start with NAMESPACE:\n%s", all.stdout)
			}
			if f := lineStarting(all.stdout, ns); len(f) < 2 || f[1] != tc.name {
				t.Errorf("-A output lacks %s/%s:\n%s", ns, tc.name, all.stdout)
			}

			// JSON and YAML: one object by name, a List otherwise.
			for _, format := range []string{"json", "yaml"} {
				one := kctl(t, env, "get", tc.kind, tc.name, "-n", ns, "-o", format).ok(t)
				var obj map[string]any
				if err := yaml.Unmarshal([]byte(one.stdout), &obj); err != nil {
					t.Fatalf("-o %s: %v\n%s", format, err, one.stdout)
				}
				if obj["kind"] != tc.goKind || obj["apiVersion"] != "kairon.zyvor.dev/v1alpha1" || obj["metadata"].(map[string]any)["name"] != tc.name {
					t.Errorf("-o %s is not the %s %s:\n%s", format, tc.goKind, tc.name, one.stdout)
				}
				if _, ok := obj["metadata"].(map[string]any)["managedFields"]; ok {
					t.Errorf("-o %s shows managedFields", format)
				}
				if format == "json" && !json.Valid([]byte(one.stdout)) {
					t.Errorf("-o json is not JSON:\n%s", one.stdout)
				}
				list := kctl(t, env, "get", tc.kind, "-n", ns, "-o", format).ok(t)
				var l struct {
					Kind  string           `json:"kind"`
					Items []map[string]any `json:"items"`
				}
				if err := yaml.Unmarshal([]byte(list.stdout), &l); err != nil || l.Kind != "List" || len(l.Items) != 1 || l.Items[0]["kind"] != tc.goKind {
					t.Errorf("-o %s list: %v\n%s", format, err, list.stdout)
				}
			}

			name := kctl(t, env, "get", tc.kind, "-n", ns, "-o", "name").ok(t)
			if want := tc.singular + "/" + tc.name + "\n"; name.stdout != want {
				t.Errorf("-o name = %q, want %q", name.stdout, want)
			}
		})
	}

	t.Run("budget table is the user guide's", func(t *testing.T) {
		r := kctl(t, env, "get", "budgets", "-n", ns).ok(t)
		want := "" +
			"NAME       MINAVAILABLE  MAXUNAVAILABLE  EXPECTED  HEALTHY  DESIRED  ALLOWED\n" +
			"web-tier   2             -               3         3        2        1\n"
		if r.stdout != want {
			t.Errorf("got\n%s\nwant\n%s", r.stdout, want)
		}
	})

	t.Run("label selector", func(t *testing.T) {
		r := kctl(t, env, "get", "machines", "-n", ns, "-l", "tier=web", "-o", "name").ok(t)
		if r.stdout != "machine/web-1\n" {
			t.Errorf("-l tier=web: %q", r.stdout)
		}
		r = kctl(t, env, "get", "machines", "-n", ns, "-l", "tier=db")
		if r.code != 0 || r.stdout != "" || r.stderr != "No resources found in "+ns+" namespace.\n" {
			t.Errorf("-l tier=db: %+v", r)
		}
		kctl(t, env, "get", "machines", "-n", ns, "-l", "a b c").failed(t, "-l/--selector")
	})
}

// kubectl's other ways of naming objects: a list of kinds, and KIND/NAME
// arguments of several kinds.
func TestGetSeveralKinds(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	env.Create(t, plainMachine(ns, "web-1"))
	env.Create(t, &kaironv1.MachinePool{ObjectMeta: meta(ns, "agents"), Spec: kaironv1.MachinePoolSpec{Template: template(nil)}})

	// One table per kind, a blank line apart, each NAME with its kind.
	r := kctl(t, env, "get", "machines,mp", "-n", ns).ok(t)
	tables := strings.Split(r.stdout, "\n\n")
	if len(tables) != 2 {
		t.Fatalf("want two tables a blank line apart, got:\n%s", r.stdout)
	}
	for i, want := range []struct{ secondHeader, row string }{{"PHASE", "machine/web-1"}, {"DESIRED", "machinepool/agents"}} {
		if h := strings.Fields(tables[i]); len(h) < 2 || h[0] != "NAME" || h[1] != want.secondHeader {
			t.Errorf("table %d does not start with NAME %s:\n%s", i, want.secondHeader, tables[i])
		}
		if lineStarting(tables[i], want.row) == nil {
			t.Errorf("table %d has no row %s:\n%s", i, want.row, tables[i])
		}
	}
	all := kctl(t, env, "get", "mach,mp", "-A").ok(t)
	if f := lineStarting(all.stdout, ns); len(f) < 2 || f[1] != "machine/web-1" {
		t.Errorf("-A: want NAMESPACE then KIND/NAME:\n%s", all.stdout)
	}

	// KIND/NAME of two kinds: grouped by kind, in the order given.
	names := kctl(t, env, "get", "machinepool/agents", "machine/web-1", "-o", "name", "-n", ns).ok(t)
	if names.stdout != "machinepool/agents\nmachine/web-1\n" {
		t.Errorf("-o name: %q", names.stdout)
	}
	// What -o name printed can be given back.
	again := kctl(t, env, append(append([]string{"get"}, strings.Fields(names.stdout)...), "-o", "name", "-n", ns)...).ok(t)
	if again.stdout != names.stdout {
		t.Errorf("get of -o name's output: %q, want %q", again.stdout, names.stdout)
	}
	js := kctl(t, env, "get", "mp/agents", "mach/web-1", "-o", "json", "-n", ns).ok(t)
	var list struct {
		Kind  string `json:"kind"`
		Items []struct {
			Kind string `json:"kind"`
		} `json:"items"`
	}
	if err := json.Unmarshal([]byte(js.stdout), &list); err != nil || list.Kind != "List" || len(list.Items) != 2 ||
		list.Items[0].Kind != "MachinePool" || list.Items[1].Kind != "Machine" {
		t.Errorf("-o json of two kinds is not one List of both: %v\n%s", err, js.stdout)
	}

	// -o jsonpath: on the object for one name, on the List otherwise;
	// --no-headers: rows only.
	if r := kctl(t, env, "get", "machine/web-1", "-o", "jsonpath={.metadata.name}", "-n", ns).ok(t); r.stdout != "web-1" {
		t.Errorf("-o jsonpath of one object: %q", r.stdout)
	}
	if r := kctl(t, env, "get", "machines,mp", "-o", "jsonpath={range .items[*]}{.kind}:{.metadata.name} {end}", "-n", ns).ok(t); r.stdout != "Machine:web-1 MachinePool:agents " {
		t.Errorf("-o jsonpath of two kinds: %q", r.stdout)
	}
	if r := kctl(t, env, "get", "machines", "--no-headers", "-n", ns).ok(t); strings.Count(r.stdout, "\n") != 1 || lineStarting(r.stdout, "web-1") == nil {
		t.Errorf("--no-headers: %q", r.stdout)
	}
	kctl(t, env, "get", "machines", "-o", "jsonpath={.items[", "-n", ns).failed(t, "-o/--output jsonpath template")

	// A missing one does not hide the others, and exits 1 naming it.
	r = kctl(t, env, "get", "mp/agents", "mach/ghost", "-o", "name", "-n", ns)
	r.failed(t, `machine "ghost" not found in namespace "`+ns+`"`)
	if r.stdout != "machinepool/agents\n" {
		t.Errorf("stdout %q, want the pool", r.stdout)
	}

	// Nothing of any kind listed: one line, as for one kind.
	empty := env.Namespace(t)
	e := kctl(t, env, "get", "mc,mp", "-n", empty)
	if e.code != 0 || e.stdout != "" || e.stderr != "No resources found in "+empty+" namespace.\n" {
		t.Errorf("get mc,mp in an empty namespace: %+v", e)
	}
}

func TestGetWatch(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	bg := context.Background()
	env.Create(t, plainMachine(ns, "a"))

	// watching runs get -w with args until stop is called, which
	// interrupts it as Ctrl-C does and returns how it ended.
	watching := func(args ...string) (out *syncBuffer, stop func() result) {
		out = &syncBuffer{}
		ctx, cancel := context.WithCancel(bg)
		done := make(chan result, 1)
		go func() { done <- kctlContext(ctx, env.Kubeconfig, out, append(args, "-n", ns)...) }()
		return out, func() result {
			cancel()
			return <-done
		}
	}
	rowsOf := func(out, name string) (n int) {
		for _, line := range strings.Split(out, "\n") {
			if f := strings.Fields(line); len(f) > 0 && f[0] == name {
				n++
			}
		}
		return n
	}
	printed := func(out *syncBuffer, what string, ok func(s string) bool) {
		t.Helper()
		testenv.Eventually(t, time.Minute, what, func() (bool, string) {
			s := out.String()
			return ok(s), "stdout so far:\n" + s
		})
	}

	out, stop := watching("get", "machines", "-w")
	printed(out, "the table of what is there", func(s string) bool { return rowsOf(s, "a") == 1 })
	env.Create(t, plainMachine(ns, "b"))
	printed(out, "a row for the new machine b", func(s string) bool { return rowsOf(s, "b") == 1 })
	a := &kaironv1.Machine{}
	if err := env.Client.Get(bg, client.ObjectKey{Namespace: ns, Name: "a"}, a); err != nil {
		t.Fatal(err)
	}
	a.Status.Phase = kaironv1.MachineRunning
	env.SetStatus(t, a)
	printed(out, "a row for a Running", func(s string) bool {
		f := lineStarting(s[strings.LastIndex(s, "\na ")+1:], "a")
		return len(f) > 1 && f[1] == "Running"
	})
	if err := env.Client.Delete(bg, plainMachine(ns, "b")); err != nil {
		t.Fatal(err)
	}
	printed(out, "a last row for b, deleted", func(s string) bool { return rowsOf(s, "b") == 2 })
	r := stop()
	if r.code != 0 || r.stderr != "" {
		t.Errorf("interrupted get -w: exit %d, stderr %q", r.code, r.stderr)
	}
	if n := strings.Count(r.stdout, "NAME "); n != 1 {
		t.Errorf("%d headers, want 1:\n%s", n, r.stdout)
	}

	// --watch-only: changes only; -o name: one line each; -l: only what
	// matches.
	out, stop = watching("get", "machines", "--watch-only", "-o", "name", "-l", "tier=web")
	// c may be created before the watch has listed (and left it out as
	// already there), so it is touched until a change of it is printed;
	// d, touched as often, does not match.
	c := plainMachine(ns, "c")
	c.Labels = map[string]string{"tier": "web"}
	env.Create(t, c)
	env.Create(t, plainMachine(ns, "d"))
	touches := 0
	testenv.Eventually(t, time.Minute, "machine/c printed", func() (bool, string) {
		if strings.Contains(out.String(), "machine/c\n") {
			return true, ""
		}
		touches++
		patch := client.RawPatch(types.MergePatchType, fmt.Appendf(nil, `{"metadata":{"annotations":{"touch":"%d"}}}`, touches))
		for _, name := range []string{"d", "c"} {
			if err := env.Client.Patch(bg, plainMachine(ns, name), patch); err != nil {
				return false, err.Error()
			}
		}
		return false, "stdout so far: " + out.String()
	})
	if r := stop(); r.code != 0 || strings.Contains(r.stdout, "machine/a") || strings.Contains(r.stdout, "machine/d") {
		t.Errorf("--watch-only -l tier=web printed what was there or did not match: %+v", r)
	}

	// One object, -o json: the object as it is, then each version of it.
	out, stop = watching("get", "machine", "a", "-w", "-o", "json")
	printed(out, "machine a as JSON", func(s string) bool { return strings.HasSuffix(s, "}\n") })
	a.Status.Phase = kaironv1.MachineStopped
	env.SetStatus(t, a)
	printed(out, "machine a Stopped as JSON", func(s string) bool { return strings.Count(s, `"phase": "Stopped"`) == 1 })
	r = stop()
	dec := json.NewDecoder(strings.NewReader(r.stdout))
	var phases []string
	for dec.More() {
		var m kaironv1.Machine
		if err := dec.Decode(&m); err != nil {
			t.Fatalf("-w -o json is not a stream of objects: %v\n%s", err, r.stdout)
		}
		if m.Name != "a" || len(m.ManagedFields) > 0 {
			t.Errorf("-w -o json printed %s with managedFields %v", m.Name, m.ManagedFields)
		}
		phases = append(phases, string(m.Status.Phase))
	}
	if len(phases) != 2 || phases[0] != "Running" || phases[1] != "Stopped" {
		t.Errorf("-w -o json printed phases %v, want [Running Stopped]", phases)
	}

	kctl(t, env, "get", "mach,mp", "-w", "-n", ns).failed(t, "-w/--watch", "one kind at a time")
	kctl(t, env, "get", "machine", "a", "c", "-w", "-n", ns).failed(t, "-w/--watch", "one object")
	kctl(t, env, "get", "machines", "-w", "-l", "a b", "-n", ns).failed(t, "-l/--selector")
	kctl(t, env, "get", "machine", "ghost", "-w", "-n", ns).failed(t, `machine "ghost" not found`)
}

func TestGetEmpty(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	for _, k := range []string{"machines", "machinesets", "machinepools", "machineclaims", "budgets", "machinemigrations", "machinenetworkpolicies", "machinequotas", "machinesnapshots", "snapshotschedules"} {
		r := kctl(t, env, "get", k, "-n", ns)
		if r.code != 0 || r.stdout != "" || r.stderr != "No resources found in "+ns+" namespace.\n" {
			t.Errorf("get %s in an empty namespace: exit %d, stdout %q, stderr %q", k, r.code, r.stdout, r.stderr)
		}
	}
	r := kctl(t, env, "get", "machines", "-n", ns, "-o", "json").ok(t)
	var l struct {
		Kind  string `json:"kind"`
		Items []any  `json:"items"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &l); err != nil || l.Kind != "List" || len(l.Items) != 0 {
		t.Errorf("empty -o json: %v %q", err, r.stdout)
	}
	kctl(t, env, "get", "machine", "nope", "-n", ns).failed(t, `machine "nope" not found in namespace "`+ns+`"`)
}

func TestGetNodes(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	mkNode := func(name string, labels map[string]string, ready corev1.ConditionStatus, cordoned bool) {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
		n.Spec.Unschedulable = cordoned
		n.Status = corev1.NodeStatus{
			Allocatable: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("8"), corev1.ResourceMemory: resource.MustParse("16Gi")},
			Capacity:    corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("8"), corev1.ResourceMemory: resource.MustParse("16Gi")},
			Conditions:  []corev1.NodeCondition{{Type: corev1.NodeReady, Status: ready, LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}},
		}
		env.Create(t, n)
		t.Cleanup(func() { _ = env.Client.Delete(ctx, n) })
	}
	kairon := func(backend, accel string) map[string]string {
		return map[string]string{kaironv1.LabelNode: "", kaironv1.LabelNodeBackend: backend, kaironv1.LabelNodeAcceleration: accel}
	}
	a, b, c, plain := ns+"-a", ns+"-b", ns+"-c", ns+"-plain"
	mkNode(a, kairon("qemu", "kvm"), corev1.ConditionTrue, false)
	mkNode(b, kairon("qemu", "tcg"), corev1.ConditionTrue, true)
	mkNode(c, kairon("sim", "sim"), corev1.ConditionFalse, false)
	mkNode(plain, map[string]string{"kubernetes.io/hostname": plain}, corev1.ConditionTrue, false)
	machine(t, env, ns, "m1", a, 1, "256Mi", kaironv1.MachineRunning)
	machine(t, env, ns, "m2", a, 2, "512Mi", kaironv1.MachineBooting)
	machine(t, env, ns, "m3", b, 4, "1Gi", kaironv1.MachineRunning)
	machine(t, env, ns, "m4", "", 8, "1Gi", kaironv1.MachinePending)

	r := kctl(t, env, "get", "nodes").ok(t)
	if got, want := strings.Fields(strings.SplitN(r.stdout, "\n", 2)[0]), []string{"NAME", "STATUS", "BACKEND", "ACCELERATION", "MACHINES", "CPU", "MEMORY", "AGE"}; !reflect.DeepEqual(got, want) {
		t.Errorf("headers %q, want %q", got, want)
	}
	for name, want := range map[string][]string{
		a: {a, "Ready", "qemu", "kvm", "2", "3/8", "768Mi/16Gi"},
		b: {b, "Ready,SchedulingDisabled", "qemu", "tcg", "1", "4/8", "1Gi/16Gi"},
		c: {c, "NotReady", "sim", "sim", "0", "0/8", "0/16Gi"},
	} {
		got := lineStarting(r.stdout, name)
		if len(got) != len(want)+1 || !reflect.DeepEqual(got[:len(want)], want) {
			t.Errorf("node %s: row %q, want %q then AGE\n%s", name, got, want, r.stdout)
		}
	}
	if lineStarting(r.stdout, plain) != nil {
		t.Errorf("a Node without %s is listed:\n%s", kaironv1.LabelNode, r.stdout)
	}
	kctl(t, env, "get", "node", plain).failed(t, "not a Kairon node", kaironv1.LabelNode)

	one := kctl(t, env, "get", "no", a, "-o", "name").ok(t)
	if one.stdout != "node/"+a+"\n" {
		t.Errorf("-o name: %q", one.stdout)
	}
	wide := kctl(t, env, "get", "nodes", a, "-o", "wide").ok(t)
	if !strings.Contains(strings.SplitN(wide.stdout, "\n", 2)[0], "INTERNAL-IP") {
		t.Errorf("-o wide lacks INTERNAL-IP:\n%s", wide.stdout)
	}
	d := kctl(t, env, "describe", "node", a).ok(t)
	var n corev1.Node
	if err := json.Unmarshal([]byte(d.stdout), &n); err != nil || n.Name != a || n.Kind != "Node" {
		t.Errorf("describe node: %v\n%s", err, d.stdout)
	}
}

func TestDescribeIsRawJSON(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	for _, tc := range objectsOfEveryKind(t, env, ns) {
		if tc.kind == "quota" || tc.kind == "budgets" {
			continue // TestDescribeQuota, TestDescribeBudget
		}
		t.Run(tc.kind, func(t *testing.T) {
			r := kctl(t, env, "describe", tc.kind, tc.name, "-n", ns).ok(t)
			if slashed := kctl(t, env, "describe", tc.singular+"/"+tc.name, "-n", ns).ok(t); slashed.stdout != r.stdout {
				t.Errorf("describe %s/%s printed\n%s\nwant\n%s", tc.singular, tc.name, slashed.stdout, r.stdout)
			}
			out := r.stdout
			if tc.kind == "machinepools" {
				// Its image, after a blank line (TestPrintPoolImage).
				object, text, found := strings.Cut(out, "}\n\n")
				if !found || !strings.HasPrefix(text, "Image:") {
					t.Fatalf("describe machinepool has no image text after the JSON:\n%s", out)
				}
				out = object + "}\n"
			}
			// Nothing but one JSON object: Unmarshal refuses trailing text.
			var got map[string]any
			if err := json.Unmarshal([]byte(out), &got); err != nil {
				t.Fatalf("not one JSON object: %v\n%s", err, out)
			}
			if !strings.HasPrefix(out, "{\n  \"apiVersion\": \"kairon.zyvor.dev/v1alpha1\",\n  \"kind\": \""+tc.goKind+"\",\n") {
				t.Errorf("does not start with apiVersion and kind, two-space indented:\n%s", out)
			}
			// It is the object as the server has it, managedFields and all.
			obj, err := env.Scheme.New(kaironv1.GroupVersion.WithKind(tc.goKind))
			if err != nil {
				t.Fatal(err)
			}
			cobj := obj.(client.Object)
			if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: tc.name}, cobj); err != nil {
				t.Fatal(err)
			}
			raw, _ := json.Marshal(cobj)
			var want map[string]any
			_ = json.Unmarshal(raw, &want)
			want["apiVersion"], want["kind"] = "kairon.zyvor.dev/v1alpha1", tc.goKind
			if !reflect.DeepEqual(got, want) {
				t.Errorf("describe differs from the server's object:\n%s\nwant\n%s", out, raw)
			}
		})
	}
}

func TestDescribeQuota(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	q := &kaironv1.MachineQuota{ObjectMeta: meta(ns, "team"), Spec: kaironv1.MachineQuotaSpec{Hard: kaironv1.MachineResources{
		Machines: ptr.To[int32](10), CPU: ptr.To[int32](16), Memory: ptr.To(resource.MustParse("8Gi")),
	}}}
	env.Create(t, q)
	machine(t, env, ns, "web-1", "node-1", 1, "256Mi", kaironv1.MachineRunning)
	machine(t, env, ns, "web-2", "node-2", 2, "512Mi", kaironv1.MachineBooting)
	machine(t, env, ns, "queued", "", 4, "1Gi", kaironv1.MachinePending)
	machine(t, env, ns, "parked", "node-1", 8, "2Gi", kaironv1.MachineStopped)
	other := env.Namespace(t)
	machine(t, env, other, "elsewhere", "node-1", 1, "256Mi", kaironv1.MachineRunning)

	r := kctl(t, env, "describe", "quota", "team", "-n", ns).ok(t)
	jsonPart, text, found := strings.Cut(r.stdout, "}\n\n")
	if !found {
		t.Fatalf("no blank line after the JSON:\n%s", r.stdout)
	}
	var got kaironv1.MachineQuota
	if err := json.Unmarshal([]byte(jsonPart+"}"), &got); err != nil || got.Name != "team" || got.Kind != "MachineQuota" {
		t.Fatalf("JSON part: %v\n%s", err, jsonPart)
	}
	want := "" +
		"Usage (recomputed now from Machines): machines 2/10, cpu 3/16, memory 768Mi/8Gi\n" +
		"Machines (4):\n" +
		"  parked   not counted: Stopped\n" +
		"  queued   not counted: not yet scheduled\n" +
		"  web-1    counted: Running on node-1\n" +
		"  web-2    counted: Booting on node-2\n"
	if text != want {
		t.Errorf("usage text:\n%s\nwant\n%s", text, want)
	}

	// A quota in a namespace without Machines says so.
	env.Create(t, &kaironv1.MachineQuota{ObjectMeta: meta(other, "empty-ns-quota"), Spec: kaironv1.MachineQuotaSpec{Hard: kaironv1.MachineResources{Machines: ptr.To[int32](1)}}})
	empty := env.Namespace(t)
	env.Create(t, &kaironv1.MachineQuota{ObjectMeta: meta(empty, "q"), Spec: kaironv1.MachineQuotaSpec{Hard: kaironv1.MachineResources{Machines: ptr.To[int32](1)}}})
	r = kctl(t, env, "describe", "mq", "q", "-n", empty).ok(t)
	if _, text, _ := strings.Cut(r.stdout, "}\n\n"); text != "Usage (recomputed now from Machines): machines 0/1, cpu 0/unlimited, memory 0/unlimited\n"+
		"No Machines match quota q (every Machine, in namespace "+empty+"); check with: kaironctl get machines -n "+empty+"\n" {
		t.Errorf("empty namespace:\n%s", r.stdout)
	}
}

func TestScale(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	env.Create(t, &kaironv1.MachineSet{ObjectMeta: meta(ns, "web"), Spec: kaironv1.MachineSetSpec{
		Selector: kaironv1.MachineSelector{MatchLabels: map[string]string{"app": "web"}},
		Template: template(map[string]string{"app": "web"}),
	}})
	env.Create(t, &kaironv1.MachinePool{ObjectMeta: meta(ns, "agents"), Spec: kaironv1.MachinePoolSpec{Template: template(nil)}})

	for _, tc := range []struct {
		args []string
		obj  client.Object
		want string
		n    int32
	}{
		{[]string{"scale", "machineset", "web", "--replicas", "5"}, &kaironv1.MachineSet{}, "machineset/web scaled\n", 5},
		{[]string{"scale", "mp", "agents", "--replicas=10"}, &kaironv1.MachinePool{}, "machinepool/agents scaled\n", 10},
		{[]string{"scale", "machinepool", "agents", "--replicas", "0"}, &kaironv1.MachinePool{}, "machinepool/agents scaled\n", 0},
		{[]string{"scale", "machineset/web", "--replicas", "3"}, &kaironv1.MachineSet{}, "machineset/web scaled\n", 3},
	} {
		r := kctl(t, env, append(tc.args, "-n", ns)...).ok(t, tc.args...)
		if r.stdout != tc.want {
			t.Errorf("%v printed %q, want %q", tc.args, r.stdout, tc.want)
		}
		name := tc.args[2]
		if kind, n, found := strings.Cut(tc.args[1], "/"); found {
			name = n
			if kind != "machineset" {
				t.Fatalf("case %v: only machineset/NAME is checked", tc.args)
			}
		}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, tc.obj); err != nil {
			t.Fatal(err)
		}
		var replicas *int32
		switch o := tc.obj.(type) {
		case *kaironv1.MachineSet:
			replicas = o.Spec.Replicas
		case *kaironv1.MachinePool:
			replicas = o.Spec.Replicas
		}
		if replicas == nil || *replicas != tc.n {
			t.Errorf("%v: spec.replicas = %v, want %d", tc.args, replicas, tc.n)
		}
		// The write went through the scale subresource. (Not visible for 0:
		// autoscaling/v1 Scale omits replicas 0, so no manager owns it.)
		if tc.n == 0 {
			continue
		}
		viaScale := false
		for _, f := range tc.obj.GetManagedFields() {
			viaScale = viaScale || f.Subresource == "scale"
		}
		if !viaScale {
			t.Errorf("%v: no managedFields entry for the scale subresource: %+v", tc.args, tc.obj.GetManagedFields())
		}
	}

	kctl(t, env, "scale", "mp", "agents", "-n", ns).failed(t, "--replicas")
	kctl(t, env, "scale", "mp", "agents", "--replicas", "-3", "-n", ns).failed(t, "--replicas", "-3")
	kctl(t, env, "scale", "mp", "agents", "--replicas", "many", "-n", ns).failed(t, "--replicas")
	kctl(t, env, "scale", "machines", "x", "--replicas", "1", "-n", ns).failed(t, "machines cannot be scaled", "machinesets, machinepools")
	kctl(t, env, "scale", "mp", "missing", "--replicas", "1", "-n", ns).failed(t, `machinepool "missing" not found in namespace "`+ns+`"`)
	kctl(t, env, "scale", "mp", "--replicas", "1", "-n", ns).failed(t, "NAME")
	kctl(t, env, "scale", "mp/agents", "ms/web", "--replicas", "1", "-n", ns).failed(t, "one kind at a time")
	kctl(t, env, "scale", "mp/agents", "mp/other", "--replicas", "1", "-n", ns).failed(t, "exactly one NAME, got 2")
}

func TestDelete(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	const hold = "test.kairon.zyvor.dev/hold"
	held := func(t *testing.T, name string) *kaironv1.Machine {
		m := plainMachine(ns, name)
		m.Finalizers = []string{hold}
		env.Create(t, m)
		return m
	}
	release := func(name string) {
		m := &kaironv1.Machine{}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, m); err != nil {
			if !apierrors.IsNotFound(err) {
				t.Error(err)
			}
			return
		}
		patch := client.MergeFrom(m.DeepCopy())
		m.Finalizers = nil
		if err := env.Client.Patch(ctx, m, patch); err != nil && !apierrors.IsNotFound(err) {
			t.Error(err)
		}
	}
	gone := func(name string) bool {
		err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &kaironv1.Machine{})
		return apierrors.IsNotFound(err)
	}

	t.Run("plain", func(t *testing.T) {
		env.Create(t, plainMachine(ns, "a"))
		env.Create(t, plainMachine(ns, "b"))
		r := kctl(t, env, "delete", "machine", "a", "b", "-n", ns).ok(t)
		if r.stdout != "machine/a deleted\nmachine/b deleted\n" {
			t.Errorf("stdout %q", r.stdout)
		}
		if !gone("a") || !gone("b") {
			t.Error("machines still there")
		}
	})

	t.Run("waits for finalizers", func(t *testing.T) {
		held(t, "slow")
		defer release("slow")
		done := make(chan result, 1)
		go func() { done <- kctl(t, env, "delete", "mach", "slow", "-n", ns) }()
		testenv.Eventually(t, time.Minute, "the deletion to reach the server", func() (bool, string) {
			m := &kaironv1.Machine{}
			if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "slow"}, m); err != nil {
				return false, err.Error()
			}
			return m.DeletionTimestamp != nil, "no deletionTimestamp yet"
		})
		// A second is how long a delete that did not wait had to return.
		testenv.Consistently(t, time.Second, "delete waiting while the finalizer holds the machine", func() (bool, string) {
			return len(done) == 0, "delete returned while the machine was still there"
		})
		release("slow")
		r := (<-done).ok(t)
		if r.stdout != "machine/slow deleted\n" {
			t.Errorf("stdout %q", r.stdout)
		}
		if !gone("slow") {
			t.Error("still there after delete returned")
		}
	})

	t.Run("timeout names the finalizer", func(t *testing.T) {
		held(t, "stuck")
		defer release("stuck")
		r := kctl(t, env, "delete", "machine", "stuck", "-n", ns, "--timeout", "1s")
		r.failed(t, "machine/stuck", "1s", hold, "--timeout")
		if r.stdout != "" {
			t.Errorf("printed %q for a machine that is not gone", r.stdout)
		}
	})

	t.Run("no wait", func(t *testing.T) {
		held(t, "lazy")
		defer release("lazy")
		r := kctl(t, env, "delete", "machine", "lazy", "-n", ns, "--wait=false").ok(t)
		if r.stdout != "machine/lazy deleted\n" {
			t.Errorf("stdout %q", r.stdout)
		}
		m := &kaironv1.Machine{}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "lazy"}, m); err != nil || m.DeletionTimestamp == nil {
			t.Errorf("want the machine still there, being deleted: %v %v", err, m.DeletionTimestamp)
		}
	})

	t.Run("other kinds and errors", func(t *testing.T) {
		env.Create(t, &kaironv1.MachinePool{ObjectMeta: meta(ns, "pool"), Spec: kaironv1.MachinePoolSpec{Template: template(nil)}})
		r := kctl(t, env, "delete", "mp", "pool", "-n", ns).ok(t)
		if r.stdout != "machinepool/pool deleted\n" {
			t.Errorf("stdout %q", r.stdout)
		}
		env.Create(t, plainMachine(ns, "real"))
		r = kctl(t, env, "delete", "machine", "ghost", "real", "-n", ns)
		r.failed(t, `machine "ghost" not found in namespace "`+ns+`"`)
		if r.stdout != "machine/real deleted\n" || !gone("real") {
			t.Errorf("a missing name stopped the others: %q", r.stdout)
		}
		env.Create(t, &kaironv1.MachinePool{ObjectMeta: meta(ns, "pool2"), Spec: kaironv1.MachinePoolSpec{Template: template(nil)}})
		env.Create(t, plainMachine(ns, "m2"))
		r = kctl(t, env, "delete", "machinepool/pool2", "machine/m2", "-n", ns).ok(t)
		if r.stdout != "machinepool/pool2 deleted\nmachine/m2 deleted\n" || !gone("m2") {
			t.Errorf("delete of two kinds by KIND/NAME: %q", r.stdout)
		}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "pool2"}, &kaironv1.MachinePool{}); !apierrors.IsNotFound(err) {
			t.Errorf("machinepool/pool2 is still there: %v", err)
		}
		kctl(t, env, "delete", "machine", "-n", ns).failed(t, "NAME", "-l/--selector or --all")
		kctl(t, env, "delete", "machines,mp", "-n", ns).failed(t, "NAME")
		kctl(t, env, "delete", "machine", "x", "--all", "-n", ns).failed(t, "not both")
		kctl(t, env, "delete", "machine", "x", "-l", "a=b", "-n", ns).failed(t, "not both")
		kctl(t, env, "delete", "machines", "--all", "-l", "a=b", "-n", ns).failed(t, "--all", "-l/--selector")
		kctl(t, env, "delete", "machines", "-l", "a b", "-n", ns).failed(t, "-l/--selector")
	})

	t.Run("by selector and --all", func(t *testing.T) {
		ns := env.Namespace(t)
		for _, name := range []string{"tmp-1", "tmp-2", "keep"} {
			m := plainMachine(ns, name)
			if name != "keep" {
				m.Labels = map[string]string{"tier": "tmp"}
			}
			env.Create(t, m)
		}
		env.Create(t, &kaironv1.MachinePool{ObjectMeta: meta(ns, "pool"), Spec: kaironv1.MachinePoolSpec{Template: template(nil)}})
		exists := func(obj client.Object, name string) bool {
			return env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, obj) == nil
		}

		r := kctl(t, env, "delete", "machines", "-l", "tier=tmp", "-n", ns).ok(t)
		if r.stdout != "machine/tmp-1 deleted\nmachine/tmp-2 deleted\n" || exists(&kaironv1.Machine{}, "tmp-1") || !exists(&kaironv1.Machine{}, "keep") {
			t.Errorf("delete -l tier=tmp: %q", r.stdout)
		}
		r = kctl(t, env, "delete", "machines", "-l", "tier=tmp", "-n", ns)
		if r.code != 0 || r.stdout != "" || r.stderr != "No resources found in "+ns+" namespace.\n" {
			t.Errorf("delete -l matching nothing: %+v", r)
		}
		r = kctl(t, env, "delete", "machines,mp", "--all", "-n", ns).ok(t)
		if r.stdout != "machine/keep deleted\nmachinepool/pool deleted\n" || exists(&kaironv1.Machine{}, "keep") || exists(&kaironv1.MachinePool{}, "pool") {
			t.Errorf("delete machines,mp --all: %q", r.stdout)
		}
		kctl(t, env, "delete", "machine", "x", "--timeout", "soon", "-n", ns).failed(t, "--timeout")
	})
}

func TestVersion(t *testing.T) {
	env := testenv.Get(t)
	r := kctl(t, env, "version").ok(t)
	if !strings.HasPrefix(r.stdout, "Client Version: ") || !strings.Contains(r.stdout, "\nServer Version: v1.") {
		t.Errorf("version:\n%s", r.stdout)
	}
	r = kctlContext(context.Background(), "", &bytes.Buffer{}, "version", "--client").ok(t)
	if strings.Contains(r.stdout, "Server") {
		t.Errorf("--client contacted the server:\n%s", r.stdout)
	}
}

func TestKubeconfigLikeKubectl(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	env.Create(t, plainMachine(ns, "via-env"))

	// $KUBECONFIG is used without --kubeconfig; -n and --namespace pick the namespace.
	t.Setenv("KUBECONFIG", env.Kubeconfig)
	for _, nsFlag := range []string{"-n", "--namespace"} {
		r := kctlContext(context.Background(), "", &bytes.Buffer{}, "get", "machines", nsFlag, ns, "-o", "name").ok(t)
		if r.stdout != "machine/via-env\n" {
			t.Errorf("%s: %q", nsFlag, r.stdout)
		}
	}
	r := kctlContext(context.Background(), "", &bytes.Buffer{}, "get", "machines", "--context", "no-such-context", "-n", ns)
	r.failed(t, "no-such-context")
	t.Setenv("KUBECONFIG", "/nonexistent/kubeconfig")
	r = kctlContext(context.Background(), env.Kubeconfig, &bytes.Buffer{}, "get", "machines", "-n", ns, "-o", "name").ok(t)
	if r.stdout != "machine/via-env\n" {
		t.Errorf("--kubeconfig did not win over $KUBECONFIG: %q", r.stdout)
	}
}

func TestErrors(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"get"}, []string{"KIND", "machines", "budgets", "nodes"}},
		{[]string{"get", "pods"}, []string{`unknown kind "pods"`, "machines", "machinesets", "machinepools", "machineclaims", "budgets", "machinemigrations", "machinenetworkpolicies", "machinequotas", "nodes"}},
		{[]string{"describe", "nonsense", "x"}, []string{`unknown kind "nonsense"`, "machines"}},
		{[]string{"delete", "widgets", "x"}, []string{`unknown kind "widgets"`}},
		{[]string{"get", "machines", "-o", "xml"}, []string{`"xml"`, "-o/--output", "table", "wide", "json", "yaml", "name"}},
		{[]string{"get", "machines", "--frobnicate"}, []string{"--frobnicate"}},
		{[]string{"get", "machines", "x", "-A"}, []string{"-A/--all-namespaces", "NAME"}},
		{[]string{"describe"}, []string{"KIND", "NAME"}},
		{[]string{"describe", "machine"}, []string{"NAME"}},
		{[]string{"describe", "machine", "a", "b"}, []string{"one KIND and one NAME"}},
		{[]string{"describe", "machine", "missing"}, []string{`machine "missing" not found in namespace "` + ns + `"`}},
		{[]string{"delete"}, []string{"KIND", "NAME"}},
		{[]string{"logs"}, []string{"NAME"}},
		{[]string{"logs", "machine"}, []string{"NAME"}},
		{[]string{"logs", "mp", "agents"}, []string{"machines and claims", "not machinepools"}},
		{[]string{"logs", "mp/agents"}, []string{"machinepools are not Machines"}},
		{[]string{"logs", "mc/missing"}, []string{`machineclaim "missing" not found`}},
		{[]string{"get", "mc,,mp"}, []string{"empty KIND"}},
		{[]string{"get", "mc,mp", "x"}, []string{"NAMEs cannot follow a list of kinds"}},
		{[]string{"get", "mc", "mc/x"}, []string{"KIND NAME... or KIND/NAME..."}},
		{[]string{"get", "mc/x", "y"}, []string{`"y" is a bare NAME`}},
		{[]string{"get", "mc/x", "-A"}, []string{"-A/--all-namespaces"}},
		{[]string{"describe", "mc/a", "mp/b"}, []string{"one kind at a time"}},
		{[]string{"release", "mp/agents"}, []string{"release works on claims", "kaironctl delete mp/agents"}},
		{[]string{"logs", "missing"}, []string{`machine "missing" not found`}},
		{[]string{"logs", "x", "--tail", "-5"}, []string{"--tail"}},
		{[]string{"logs", "x", "--tail", "ten"}, []string{"--tail"}},
		{[]string{"frobnicate"}, []string{`unknown command "frobnicate"`, "get"}},
		{[]string{"version", "extra"}, []string{"extra"}},
	} {
		r := kctl(t, env, append(tc.args, "-n", ns)...)
		if r.code != 1 {
			t.Errorf("%v: exit %d, want 1", tc.args, r.code)
		}
		if !strings.HasPrefix(r.stderr, "error: ") || strings.Count(r.stderr, "\n") != 1 {
			t.Errorf("%v: stderr is not one error line: %q", tc.args, r.stderr)
		}
		for _, w := range tc.want {
			if !strings.Contains(r.stderr, w) {
				t.Errorf("%v: stderr %q does not contain %q", tc.args, r.stderr, w)
			}
		}
		if r.stdout != "" {
			t.Errorf("%v: printed %q to stdout", tc.args, r.stdout)
		}
	}

	// Without any kubeconfig the error says where one is looked for.
	t.Setenv("KUBECONFIG", "")
	t.Setenv("HOME", t.TempDir())
	r := kctlContext(context.Background(), "/nonexistent/kubeconfig", &bytes.Buffer{}, "get", "machines")
	r.failed(t, "--kubeconfig")
}

// syncBuffer is a bytes.Buffer safe for a writer and a reader goroutine,
// that signals when it first contains a string.
type syncBuffer struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	want string
	seen chan struct{}
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n, err := b.buf.Write(p)
	if b.want != "" && strings.Contains(b.buf.String(), b.want) {
		b.want = ""
		close(b.seen)
	}
	return n, err
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func TestErrorsAreOneLineForMultipleFailures(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	r := kctl(t, env, "get", "machines", "a", "b", "-n", ns)
	r.failed(t, `machine "a" not found`, `machine "b" not found`)
}

// withoutAge drops the last column (AGE) of every line of a table.
func withoutAge(table string) string {
	var out []string
	for _, line := range strings.Split(table, "\n") {
		fields := strings.Fields(line)
		if len(fields) > 0 {
			fields = fields[:len(fields)-1]
		}
		out = append(out, strings.Join(fields, " "))
	}
	return strings.Join(out, "\n")
}
