package kaironctl

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/rules"
)

var testNow = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func toUnstructured(t *testing.T, obj runtime.Object) unstructured.Unstructured {
	t.Helper()
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		t.Fatal(err)
	}
	return unstructured.Unstructured{Object: m}
}

func mustKind(t *testing.T, name string) *Kind {
	t.Helper()
	k, err := lookupKind(name)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// renderTable prints objs of kind as a table the way `get` does.
func renderTable(t *testing.T, kind string, rc *RowContext, wide, allNamespaces bool, objs ...runtime.Object) string {
	t.Helper()
	k := mustKind(t, kind)
	if rc == nil {
		rc = &RowContext{}
	}
	rc.Now = testNow
	tbl := table{Columns: k.Columns}
	if allNamespaces {
		tbl.Columns = append([]Column{{Header: "NAMESPACE"}}, k.Columns...)
	}
	for _, obj := range objs {
		u := toUnstructured(t, obj)
		row, err := k.Row(&u, rc)
		if err != nil {
			t.Fatal(err)
		}
		if allNamespaces {
			row = append([]string{u.GetNamespace()}, row...)
		}
		tbl.Rows = append(tbl.Rows, row)
	}
	var buf bytes.Buffer
	if err := printTable(&buf, tbl, wide); err != nil {
		t.Fatal(err)
	}
	return buf.String()
}

func created(ago time.Duration) metav1.ObjectMeta {
	return metav1.ObjectMeta{CreationTimestamp: metav1.NewTime(testNow.Add(-ago))}
}

func TestBudgetTableMatchesUserGuide(t *testing.T) {
	b := &kaironv1.MachineDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "web-tier"},
		Spec:       kaironv1.MachineDisruptionBudgetSpec{MinAvailable: ptr.To(intstr.FromString("2"))},
		Status: kaironv1.MachineDisruptionBudgetStatus{
			ExpectedMachines: 3, CurrentHealthy: 3, DesiredHealthy: 2, DisruptionsAllowed: 1,
		},
	}
	// Verbatim from the user's guide to MachineDisruptionBudget.
	want := "" +
		"NAME       MINAVAILABLE  MAXUNAVAILABLE  EXPECTED  HEALTHY  DESIRED  ALLOWED\n" +
		"web-tier   2             -               3         3        2        1\n"
	for _, wide := range []bool{false, true} {
		if got := renderTable(t, "budgets", nil, wide, false, b); got != want {
			t.Errorf("wide=%v: got\n%s\nwant\n%s", wide, got, want)
		}
	}

	// An integer bound and a percentage print as written.
	b2 := b.DeepCopy()
	b2.Name = "db"
	b2.Spec = kaironv1.MachineDisruptionBudgetSpec{MaxUnavailable: ptr.To(intstr.FromString("50%"))}
	b3 := b.DeepCopy()
	b3.Name = "cache"
	b3.Spec = kaironv1.MachineDisruptionBudgetSpec{MinAvailable: ptr.To(intstr.FromInt32(1))}
	got := renderTable(t, "mdb", nil, false, false, b, b2, b3)
	want = "" +
		"NAME       MINAVAILABLE  MAXUNAVAILABLE  EXPECTED  HEALTHY  DESIRED  ALLOWED\n" +
		"web-tier   2             -               3         3        2        1\n" +
		"db         -             50%             3         3        2        1\n" +
		"cache      1             -               3         3        2        1\n"
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

func TestMachineTable(t *testing.T) {
	running := &kaironv1.Machine{
		ObjectMeta: created(90 * time.Second),
		Spec:       kaironv1.MachineSpec{NodeName: "node-1", CPU: 2, Memory: resource.MustParse("512Mi")},
		Status: kaironv1.MachineStatus{
			Phase: kaironv1.MachineRunning, Acceleration: "kvm",
			Addresses: []kaironv1.MachineAddress{{Type: "InternalIP", Address: "10.77.0.5"}},
		},
	}
	running.Name, running.Namespace = "agents-8c21d0e4", "team-a"
	running.Labels = map[string]string{kaironv1.LabelMachinePool: "agents", kaironv1.LabelMachineClaim: "job-42"}
	pending := &kaironv1.Machine{ObjectMeta: created(3 * time.Hour), Spec: kaironv1.MachineSpec{CPU: 1, Memory: resource.MustParse("256Mi")}}
	pending.Name, pending.Namespace = "web", "default"

	got := renderTable(t, "machines", nil, false, false, running, pending)
	want := "" +
		"NAME             PHASE    NODE    CPU  MEMORY  ADDRESS    POOL    AGE\n" +
		"agents-8c21d0e4  Running  node-1  2    512Mi   10.77.0.5  agents  90s\n" +
		"web              -        -       1    256Mi   -          -       3h\n"
	if got != want {
		t.Errorf("table: got\n%s\nwant\n%s", got, want)
	}

	got = renderTable(t, "mach", nil, true, true, running)
	want = "" +
		"NAMESPACE  NAME             PHASE    NODE    CPU  MEMORY  ADDRESS    POOL    CLAIM   ACCELERATION  AGE\n" +
		"team-a     agents-8c21d0e4  Running  node-1  2    512Mi   10.77.0.5  agents  job-42  kvm           90s\n"
	if got != want {
		t.Errorf("wide, all namespaces: got\n%s\nwant\n%s", got, want)
	}
}

func TestMachineTableNodeUnreachable(t *testing.T) {
	lost := &kaironv1.Machine{
		ObjectMeta: created(time.Minute),
		Spec:       kaironv1.MachineSpec{NodeName: "node-2", CPU: 1, Memory: resource.MustParse("256Mi")},
		Status: kaironv1.MachineStatus{Phase: kaironv1.MachineRunning, Conditions: []metav1.Condition{{
			Type: kaironv1.ConditionNodeReachable.String(), Status: metav1.ConditionFalse, Reason: kaironv1.NodeReachableReasonLeaseExpired,
		}}},
	}
	lost.Name, lost.Namespace = "agents-1", "team-a"
	back := lost.DeepCopy()
	back.Name = "agents-2"
	back.Status.Conditions[0].Status = metav1.ConditionTrue
	got := renderTable(t, "machines", nil, false, false, lost, back)
	want := "" +
		"NAME      PHASE                    NODE    CPU  MEMORY  ADDRESS  POOL  AGE\n" +
		"agents-1  Running,NodeUnreachable  node-2  1    256Mi   -        -     60s\n" +
		"agents-2  Running                  node-2  1    256Mi   -        -     60s\n"
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

func TestTablesOfOtherKinds(t *testing.T) {
	set := &kaironv1.MachineSet{ObjectMeta: created(time.Minute), Spec: kaironv1.MachineSetSpec{Replicas: ptr.To[int32](3)},
		Status: kaironv1.MachineSetStatus{Replicas: 3, ReadyReplicas: 2}}
	set.Name = "web"
	pool := &kaironv1.MachinePool{ObjectMeta: created(time.Minute), Spec: kaironv1.MachinePoolSpec{Replicas: ptr.To[int32](5)},
		Status: kaironv1.MachinePoolStatus{Warm: 5, ReadyWarm: 4, Claimed: 2}}
	pool.Name = "agents"
	bound := &kaironv1.MachineClaim{ObjectMeta: created(time.Minute), Spec: kaironv1.MachineClaimSpec{PoolName: "agents"},
		Status: kaironv1.MachineClaimStatus{Phase: kaironv1.ClaimBound, MachineName: "agents-1", BindMillis: 412}}
	bound.Name = "job-42"
	waiting := &kaironv1.MachineClaim{ObjectMeta: created(time.Minute), Spec: kaironv1.MachineClaimSpec{PoolName: "agents"},
		Status: kaironv1.MachineClaimStatus{Phase: kaironv1.ClaimPending}}
	waiting.Name = "job-43"
	mig := &kaironv1.MachineMigration{ObjectMeta: created(time.Minute),
		Spec:   kaironv1.MachineMigrationSpec{MachineName: "web-1", Strategy: kaironv1.MigrationLive, TargetNode: "node-2"},
		Status: kaironv1.MachineMigrationStatus{Phase: kaironv1.MigrationRunning, SourceNode: "node-1"}}
	mig.Name = "move-web-1"
	pol := &kaironv1.MachineNetworkPolicy{ObjectMeta: created(time.Minute), Spec: kaironv1.MachineNetworkPolicySpec{MachineName: "web-1"},
		Status: kaironv1.MachineNetworkPolicyStatus{Machines: 1}}
	pol.Name = "claim-egress-job-42"
	quota := &kaironv1.MachineQuota{ObjectMeta: created(time.Minute),
		Spec:   kaironv1.MachineQuotaSpec{Hard: kaironv1.MachineResources{Machines: ptr.To[int32](10), CPU: ptr.To[int32](16), Memory: ptr.To(resource.MustParse("8Gi"))}},
		Status: kaironv1.MachineQuotaStatus{Used: kaironv1.MachineResources{Machines: ptr.To[int32](3), CPU: ptr.To[int32](3), Memory: ptr.To(resource.MustParse("768Mi"))}}}
	quota.Name = "team-a"
	unlimited := &kaironv1.MachineQuota{ObjectMeta: created(time.Minute),
		Spec: kaironv1.MachineQuotaSpec{Hard: kaironv1.MachineResources{Machines: ptr.To[int32](2)}}}
	unlimited.Name = "fresh"

	for _, tc := range []struct {
		kind string
		objs []runtime.Object
		want string
	}{
		{"ms", []runtime.Object{set}, "" +
			"NAME  DESIRED  CURRENT  READY  AGE\n" +
			"web   3        3        2      60s\n"},
		{"mp", []runtime.Object{pool}, "" +
			"NAME    DESIRED  WARM  READY  CLAIMED  AGE\n" +
			"agents  5        5     4      2        60s\n"},
		{"mc", []runtime.Object{bound, waiting}, "" +
			"NAME    POOL    PHASE    MACHINE   BIND-MS  AGE\n" +
			"job-42  agents  Bound    agents-1  412      60s\n" +
			"job-43  agents  Pending  -         -        60s\n"},
		{"mmig", []runtime.Object{mig}, "" +
			"NAME        MACHINE  STRATEGY  PHASE    SOURCE  TARGET  AGE\n" +
			"move-web-1  web-1    live      Running  node-1  node-2  60s\n"},
		{"mnp", []runtime.Object{pol}, "" +
			"NAME                 MACHINE  MACHINES  AGE\n" +
			"claim-egress-job-42  web-1    1         60s\n"},
		{"quota", []runtime.Object{quota, unlimited}, "" +
			"NAME    MACHINES  CPU   MEMORY     AGE\n" +
			"team-a  3/10      3/16  768Mi/8Gi  60s\n" +
			"fresh   -/2       -/-   -/-        60s\n"},
	} {
		if got := renderTable(t, tc.kind, nil, false, false, tc.objs...); got != tc.want {
			t.Errorf("%s: got\n%s\nwant\n%s", tc.kind, got, tc.want)
		}
	}
}

func TestNodeTable(t *testing.T) {
	node := func(name string, ready corev1.ConditionStatus, cordoned bool, labels map[string]string) *corev1.Node {
		n := &corev1.Node{ObjectMeta: created(2 * time.Hour)}
		n.Name, n.Labels = name, labels
		n.Spec.Unschedulable = cordoned
		n.Status.Allocatable = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("8"), corev1.ResourceMemory: resource.MustParse("16Gi")}
		if ready != "" {
			n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: ready}}
		}
		return n
	}
	qemu := map[string]string{kaironv1.LabelNode: "", kaironv1.LabelNodeBackend: "qemu", kaironv1.LabelNodeAcceleration: "kvm"}
	sim := map[string]string{kaironv1.LabelNode: "", kaironv1.LabelNodeBackend: "sim", kaironv1.LabelNodeAcceleration: "sim"}
	rc := &RowContext{NodeUsage: map[string]*nodeUsage{
		"node-1": {Machines: 3, CPU: 4, Memory: resource.MustParse("768Mi")},
	}}
	got := renderTable(t, "nodes", rc, false, false,
		node("node-1", corev1.ConditionTrue, false, qemu),
		node("node-2", corev1.ConditionTrue, true, qemu),
		node("node-3", corev1.ConditionFalse, false, sim),
		node("node-4", "", true, sim),
	)
	want := "" +
		"NAME    STATUS                       BACKEND  ACCELERATION  MACHINES  CPU  MEMORY      AGE\n" +
		"node-1  Ready                        qemu     kvm           3         4/8  768Mi/16Gi  120m\n" +
		"node-2  Ready,SchedulingDisabled     qemu     kvm           0         0/8  0/16Gi      120m\n" +
		"node-3  NotReady                     sim      sim           0         0/8  0/16Gi      120m\n" +
		"node-4  NotReady,SchedulingDisabled  sim      sim           0         0/8  0/16Gi      120m\n"
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}

	// Under Helm the kubelet keeps Ready; Kairon's agent there is gone.
	lost := node("node-5", corev1.ConditionTrue, true, qemu)
	lost.Status.Conditions = append(lost.Status.Conditions, corev1.NodeCondition{
		Type: corev1.NodeConditionType(kaironv1.NodeConditionAgentReady), Status: corev1.ConditionUnknown})
	got = renderTable(t, "nodes", rc, false, false, lost)
	want = "" +
		"NAME    STATUS                                     BACKEND  ACCELERATION  MACHINES  CPU  MEMORY  AGE\n" +
		"node-5  Ready,AgentUnreachable,SchedulingDisabled  qemu     kvm           0         0/8  0/16Gi  120m\n"
	if got != want {
		t.Errorf("agent unreachable: got\n%s\nwant\n%s", got, want)
	}
}

func TestJSONYAMLAndNamePrinters(t *testing.T) {
	m := &kaironv1.Machine{TypeMeta: metav1.TypeMeta{APIVersion: "kairon.zyvor.dev/v1alpha1", Kind: "Machine"},
		Spec: kaironv1.MachineSpec{CPU: 2, KernelArgs: []string{"console=ttyS0 <x>"}}}
	m.Name, m.Namespace = "web-1", "default"
	u := toUnstructured(t, m)

	var buf bytes.Buffer
	if err := printJSON(&buf, u.Object); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	if !strings.HasPrefix(out, "{\n  \"apiVersion\": \"kairon.zyvor.dev/v1alpha1\",\n  \"kind\": \"Machine\",\n") || !strings.HasSuffix(out, "}\n") {
		t.Errorf("JSON is not two-space indented with apiVersion and kind first:\n%s", out)
	}
	if !strings.Contains(out, `"console=ttyS0 <x>"`) {
		t.Errorf("JSON escaped HTML characters:\n%s", out)
	}
	var back kaironv1.Machine
	if err := json.Unmarshal(buf.Bytes(), &back); err != nil || back.Name != "web-1" || back.Spec.CPU != 2 {
		t.Errorf("JSON does not round-trip: %v %+v", err, back)
	}

	buf.Reset()
	if err := printYAML(&buf, listObject([]unstructured.Unstructured{u})); err != nil {
		t.Fatal(err)
	}
	var list struct {
		APIVersion string           `json:"apiVersion"`
		Kind       string           `json:"kind"`
		Items      []map[string]any `json:"items"`
	}
	if err := yaml.Unmarshal(buf.Bytes(), &list); err != nil || list.Kind != "List" || list.APIVersion != "v1" || len(list.Items) != 1 || list.Items[0]["kind"] != "Machine" {
		t.Errorf("YAML list: %v %+v\n%s", err, list, buf.String())
	}

	buf.Reset()
	u2 := u.DeepCopy()
	u2.SetName("web-2")
	if err := printNames(&buf, mustKind(t, "machines"), []unstructured.Unstructured{u, *u2}); err != nil {
		t.Fatal(err)
	}
	if got, want := buf.String(), "machine/web-1\nmachine/web-2\n"; got != want {
		t.Errorf("names: got %q, want %q", got, want)
	}
}

func TestLookupKind(t *testing.T) {
	for name, want := range map[string]string{
		"machines": "machines", "machine": "machines", "mach": "machines", "Machine": "machines",
		"machines.kairon.zyvor.dev": "machines",
		"machinesets":               "machinesets", "ms": "machinesets",
		"machinepools": "machinepools", "mp": "machinepools",
		"machineclaims": "machineclaims", "mc": "machineclaims",
		"budgets": "budgets", "budget": "budgets", "machinedisruptionbudgets": "budgets", "mdb": "budgets",
		"machinemigrations": "machinemigrations", "mmig": "machinemigrations",
		"machinenetworkpolicies": "machinenetworkpolicies", "mnp": "machinenetworkpolicies",
		"machinequotas": "machinequotas", "quota": "machinequotas", "mq": "machinequotas",
		"migrationpolicies": "migrationpolicies", "migrationpolicy": "migrationpolicies", "mpol": "migrationpolicies",
		"nodes": "nodes", "node": "nodes",
	} {
		k, err := lookupKind(name)
		if err != nil || k.Resource != want {
			t.Errorf("lookupKind(%q) = %v, %v; want %s", name, k, err, want)
		}
	}
	_, err := lookupKind("pods")
	if err == nil || !strings.Contains(err.Error(), `unknown kind "pods"`) {
		t.Fatalf("lookupKind(pods) = %v", err)
	}
	for _, k := range kinds {
		if !strings.Contains(err.Error(), k.Resource) {
			t.Errorf("unknown-kind error does not list %s: %v", k.Resource, err)
		}
	}
}

func TestParseOutput(t *testing.T) {
	for _, f := range []string{"", "table", "wide", "json", "yaml", "name"} {
		if _, tmpl, err := parseOutput(f); err != nil || tmpl != nil {
			t.Errorf("parseOutput(%q): %v %v", f, tmpl, err)
		}
	}
	for f, want := range map[string]string{
		"xml":                 `unknown output format "xml" for -o/--output; valid formats: table, wide, json, yaml, name, jsonpath=TEMPLATE`,
		"jsonpath":            "-o/--output jsonpath needs a template",
		"jsonpath=":           "-o/--output jsonpath needs a template",
		"jsonpath={.items[}":  `-o/--output jsonpath template "{.items[}": unterminated array`,
		"jsonpath-as-json={}": "unknown output format",
	} {
		if _, _, err := parseOutput(f); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("parseOutput(%q) = %v, want an error containing %q", f, err, want)
		}
	}

	format, tmpl, err := parseOutput("jsonpath={.status.phase}{' '}{.missing}")
	if err != nil || format != outputJSONPath {
		t.Fatalf("jsonpath: %q %v", format, err)
	}
	var b strings.Builder
	if err := printJSONPath(&b, tmpl, map[string]any{"status": map[string]any{"phase": "Bound"}}); err != nil || b.String() != "Bound " {
		t.Errorf("jsonpath printed %q, %v; want %q (a missing key prints as nothing)", b.String(), err, "Bound ")
	}
}

func TestPrintQuotaUsage(t *testing.T) {
	q := &kaironv1.MachineQuota{Spec: kaironv1.MachineQuotaSpec{Hard: kaironv1.MachineResources{
		Machines: ptr.To[int32](10), CPU: ptr.To[int32](16), Memory: ptr.To(resource.MustParse("8Gi"))}}}
	q.Name, q.Namespace = "team-a", "team-a"
	used := kaironv1.MachineResources{Machines: ptr.To[int32](3), CPU: ptr.To[int32](3), Memory: ptr.To(resource.MustParse("768Mi"))}
	charges := []rules.QuotaCharge{
		{Machine: "web-2", Counted: true, Reason: "counted: Running on node-1"},
		{Machine: "batch-long-name", Counted: false, Reason: "not counted: Stopped"},
		{Machine: "web-1", Counted: true, Reason: "Running on node-2"},
	}
	var buf bytes.Buffer
	if err := printQuotaUsage(&buf, q, used, charges); err != nil {
		t.Fatal(err)
	}
	want := "" +
		"Usage (recomputed now from Machines): machines 3/10, cpu 3/16, memory 768Mi/8Gi\n" +
		"Machines (3):\n" +
		"  batch-long-name   not counted: Stopped\n" +
		"  web-1             counted: Running on node-2\n" +
		"  web-2             counted: Running on node-1\n"
	if got := buf.String(); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}

	buf.Reset()
	q.Spec.Hard = kaironv1.MachineResources{CPU: ptr.To[int32](4)}
	if err := printQuotaUsage(&buf, q, kaironv1.MachineResources{}, nil); err != nil {
		t.Fatal(err)
	}
	want = "" +
		"Usage (recomputed now from Machines): machines 0/unlimited, cpu 0/4, memory 0/unlimited\n" +
		"No Machines match quota team-a (every Machine, in namespace team-a); check with: kaironctl get machines -n team-a\n"
	if got := buf.String(); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

func TestOneLine(t *testing.T) {
	if got, want := oneLine("a  b\n\n  c\n"), "a b; c"; got != want {
		t.Errorf("oneLine = %q, want %q", got, want)
	}
}

func TestMigrationTableWide(t *testing.T) {
	done := &kaironv1.MachineMigration{ObjectMeta: created(time.Minute),
		Spec: kaironv1.MachineMigrationSpec{MachineName: "web-1", Strategy: kaironv1.MigrationLive},
		Status: kaironv1.MachineMigrationStatus{Phase: kaironv1.MigrationSucceeded, Reason: "Succeeded",
			SourceNode: "node-1", TargetNode: "node-2", DowntimeMillis: 68,
			MigrationPolicy: &kaironv1.AppliedMigrationPolicy{Name: "slow-links"}}}
	done.Name = "move-web-1"
	failed := &kaironv1.MachineMigration{ObjectMeta: created(time.Minute),
		Spec:   kaironv1.MachineMigrationSpec{MachineName: "web-2", Strategy: kaironv1.MigrationCold},
		Status: kaironv1.MachineMigrationStatus{Phase: kaironv1.MigrationFailed, Reason: "TargetUnavailable", SourceNode: "node-1"}}
	failed.Name = "move-web-2"
	want := "" +
		"NAME        MACHINE  STRATEGY  PHASE      SOURCE  TARGET  REASON             DOWNTIME  POLICY      AGE\n" +
		"move-web-1  web-1    live      Succeeded  node-1  node-2  Succeeded          68ms      slow-links  60s\n" +
		"move-web-2  web-2    cold      Failed     node-1  -       TargetUnavailable  -         -           60s\n"
	if got := renderTable(t, "mmig", nil, true, false, done, failed); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

// A table written a few rows at a time (get -w) has its header once, and a
// column never narrower than before; written whole, it is aligned as
// text/tabwriter aligns it.
func TestRowStream(t *testing.T) {
	cols := []Column{{Header: "NAME"}, {Header: "PHASE"}, {Header: "NOTE", Wide: true}, {Header: "AGE"}}
	var b strings.Builder
	s := &rowStream{w: &b}
	if err := s.write(table{Columns: cols, Rows: [][]string{{"a", "Running", "x", "1s"}}}); err != nil {
		t.Fatal(err)
	}
	if err := s.write(table{Columns: cols, Rows: [][]string{{"longer-name", "", "x", "2s"}}}); err != nil {
		t.Fatal(err)
	}
	if err := s.write(table{Columns: cols, Rows: [][]string{{"b", "Pending", "x", "3s"}}}); err != nil {
		t.Fatal(err)
	}
	want := "" +
		"NAME  PHASE    AGE\n" +
		"a     Running  1s\n" +
		"longer-name  -        2s\n" +
		"b            Pending  3s\n"
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}

	b.Reset()
	rows := [][]string{{"a", "Running", "x", "1s"}, {"longer-name", "", "a note", "2s"}}
	if err := printTable(&b, table{Columns: cols, Rows: rows}, true); err != nil {
		t.Fatal(err)
	}
	var tw strings.Builder
	w := tabwriter.NewWriter(&tw, 0, 8, 2, ' ', 0)
	fmt.Fprint(w, "NAME\tPHASE\tNOTE\tAGE\na\tRunning\tx\t1s\nlonger-name\t-\ta note\t2s\n")
	_ = w.Flush()
	if b.String() != tw.String() {
		t.Errorf("whole table\n%s\nwant, as tabwriter aligns it,\n%s", b.String(), tw.String())
	}
}

// printTable writes t in one piece, as get does.
func printTable(w io.Writer, t table, wide bool) error {
	return (&rowStream{w: w, wide: wide}).write(t)
}
