package kaironctl

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/apimachinery/pkg/util/intstr"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/rules"
)

// Kind is one kind of object kaironctl works on: how the user may name it,
// where it lives in the API, and how `get` prints it as a table. Every verb
// looks kinds up here, so a new kind is one more entry in kinds.
type Kind struct {
	// Resource is the plural resource name, also the canonical name in help.
	Resource string
	// Singular names one object in output such as "machine/web-1 deleted".
	Singular string
	// Aliases are the other names accepted on the command line. The
	// resource, the singular and "<resource>.<group>" are always accepted.
	Aliases []string
	// GVR is where the objects are served.
	GVR schema.GroupVersionResource
	// GoKind is the object's kind, e.g. "Machine".
	GoKind string
	// Namespaced is false for cluster-scoped kinds (nodes).
	Namespaced bool
	// Scalable kinds have the scale subresource.
	Scalable bool
	// RequiredLabel, when set, restricts the kind to objects carrying this
	// label: nodes are only the Nodes a Kairon node agent serves.
	RequiredLabel string

	// Columns are the table headers, in order; Row fills them. NAME is
	// always the first column; a NAMESPACE column is added in front of it
	// by the printer when listing all namespaces.
	Columns []Column
	// Row turns one object into its cells, one per column (wide ones too).
	Row RowFunc
	// Prepare, when set, loads what Row needs besides the object itself
	// (nodes count the Machines placed on them).
	Prepare func(ctx context.Context, o *Options, rc *RowContext) error

	// Describe, when set, is printed by `describe` after the object's JSON
	// and a blank line. Most kinds deliberately have none.
	Describe func(ctx context.Context, o *Options, obj *unstructured.Unstructured, w io.Writer) error
}

// Column is one table column.
type Column struct {
	Header string
	// Wide columns are shown only with -o wide.
	Wide bool
	// Pad is extra spaces after every cell of the column, on top of the
	// table's two-space gap. Only the budget table uses it, to keep the
	// layout the user guide shows (three spaces after NAME).
	Pad int
}

// RowContext is what a RowFunc may use besides the object.
type RowContext struct {
	// Now is the reference time for AGE.
	Now time.Time
	// NodeUsage is what the Machines placed on each node ask for, by node
	// name; only filled for nodes.
	NodeUsage map[string]*nodeUsage
}

type nodeUsage struct {
	Machines int
	CPU      int64
	Memory   resource.Quantity
}

// RowFunc turns one object into table cells.
type RowFunc func(obj *unstructured.Unstructured, rc *RowContext) ([]string, error)

// rowOf adapts a function of the typed object to a RowFunc.
func rowOf[T any](f func(obj *T, rc *RowContext) []string) RowFunc {
	return func(u *unstructured.Unstructured, rc *RowContext) ([]string, error) {
		obj := new(T)
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, obj); err != nil {
			return nil, fmt.Errorf("reading %s %q: %w", u.GetKind(), u.GetName(), err)
		}
		return f(obj, rc), nil
	}
}

func kaironGVR(resource string) schema.GroupVersionResource {
	return kaironv1.GroupVersion.WithResource(resource)
}

// kinds is every kind kaironctl knows, in the order help lists them.
var kinds = []*Kind{
	{
		Resource: "machines", Singular: "machine", Aliases: []string{"mach"},
		GVR: kaironGVR("machines"), GoKind: "Machine", Namespaced: true,
		Columns: cols("NAME", "PHASE", "NODE", "CPU", "MEMORY", "ADDRESS", "POOL", "CLAIM*", "ACCELERATION*", "AGE"),
		Row: rowOf(func(m *kaironv1.Machine, rc *RowContext) []string {
			addr := ""
			if len(m.Status.Addresses) > 0 {
				addr = m.Status.Addresses[0].Address
			}
			// As kubectl says Ready,SchedulingDisabled: the phase is the
			// agent's last word, and its node may be gone since.
			phase := string(m.Status.Phase)
			if !rules.MachineNodeReachable(m) {
				phase += ",NodeUnreachable"
			}
			return []string{
				m.Name, phase, m.Spec.NodeName, itoa(int64(m.Spec.CPU)), quantity(&m.Spec.Memory),
				addr, m.Labels[kaironv1.LabelMachinePool],
				m.Labels[kaironv1.LabelMachineClaim], m.Status.Acceleration,
				age(m.CreationTimestamp, rc.Now),
			}
		}),
	},
	{
		Resource: "machinesets", Singular: "machineset", Aliases: []string{"ms"},
		GVR: kaironGVR("machinesets"), GoKind: "MachineSet", Namespaced: true, Scalable: true,
		Columns: cols("NAME", "DESIRED", "CURRENT", "READY", "SELECTOR*", "AGE"),
		Row: rowOf(func(s *kaironv1.MachineSet, rc *RowContext) []string {
			return []string{
				s.Name, ptrInt32(s.Spec.Replicas), itoa(int64(s.Status.Replicas)), itoa(int64(s.Status.ReadyReplicas)),
				metav1.FormatLabelSelector(s.Spec.Selector.LabelSelector()), age(s.CreationTimestamp, rc.Now),
			}
		}),
	},
	{
		Resource: "machinepools", Singular: "machinepool", Aliases: []string{"mp", "pools", "pool"},
		GVR: kaironGVR("machinepools"), GoKind: "MachinePool", Namespaced: true, Scalable: true,
		Columns: cols("NAME", "DESIRED", "WARM", "READY", "CLAIMED", "AGE"),
		Row: rowOf(func(p *kaironv1.MachinePool, rc *RowContext) []string {
			return []string{
				p.Name, ptrInt32(p.Spec.Replicas), itoa(int64(p.Status.Warm)), itoa(int64(p.Status.ReadyWarm)),
				itoa(int64(p.Status.Claimed)), age(p.CreationTimestamp, rc.Now),
			}
		}),
		Describe: describeMachinePool,
	},
	{
		Resource: "machineclaims", Singular: "machineclaim", Aliases: []string{"mc", "claims", "claim"},
		GVR: kaironGVR("machineclaims"), GoKind: "MachineClaim", Namespaced: true,
		Columns: cols("NAME", "POOL", "PHASE", "MACHINE", "BIND-MS", "EGRESS*", "AGE"),
		Row: rowOf(func(c *kaironv1.MachineClaim, rc *RowContext) []string {
			bind := ""
			if c.Status.Phase == kaironv1.ClaimBound || c.Status.BindMillis > 0 {
				bind = itoa(c.Status.BindMillis)
			}
			return []string{
				c.Name, c.Spec.PoolName, string(c.Status.Phase), c.Status.MachineName, bind,
				c.Status.EgressPolicy, age(c.CreationTimestamp, rc.Now),
			}
		}),
	},
	{
		// The user guide calls these budgets, and so does every message
		// kaironctl prints about one ("budget/web-tier created").
		Resource: "budgets", Singular: "budget",
		Aliases: []string{"machinedisruptionbudgets", "machinedisruptionbudget", "mdb"},
		GVR:     kaironGVR("machinedisruptionbudgets"), GoKind: "MachineDisruptionBudget", Namespaced: true,
		// Exactly the layout of the user guide: no AGE, "-" for the unset bound.
		Columns: []Column{{Header: "NAME", Pad: 1}, {Header: "MINAVAILABLE"}, {Header: "MAXUNAVAILABLE"},
			{Header: "EXPECTED"}, {Header: "HEALTHY"}, {Header: "DESIRED"}, {Header: "ALLOWED"}},
		Row: rowOf(func(b *kaironv1.MachineDisruptionBudget, rc *RowContext) []string {
			return []string{
				b.Name, intOrString(b.Spec.MinAvailable), intOrString(b.Spec.MaxUnavailable),
				itoa(int64(b.Status.ExpectedMachines)), itoa(int64(b.Status.CurrentHealthy)),
				itoa(int64(b.Status.DesiredHealthy)), itoa(int64(b.Status.DisruptionsAllowed)),
			}
		}),
		Describe: describeBudget,
	},
	{
		Resource: "machinemigrations", Singular: "machinemigration", Aliases: []string{"mmig", "migrations", "migration"},
		GVR: kaironGVR("machinemigrations"), GoKind: "MachineMigration", Namespaced: true,
		Columns: cols("NAME", "MACHINE", "STRATEGY", "PHASE", "SOURCE", "TARGET", "REASON*", "DOWNTIME*", "POLICY*", "AGE"),
		Row: rowOf(func(m *kaironv1.MachineMigration, rc *RowContext) []string {
			target := m.Status.TargetNode
			if target == "" {
				target = m.Spec.TargetNode
			}
			downtime := ""
			if m.Status.DowntimeMillis > 0 {
				downtime = itoa(m.Status.DowntimeMillis) + "ms"
			}
			policy := ""
			if m.Status.MigrationPolicy != nil {
				policy = m.Status.MigrationPolicy.Name
			}
			return []string{
				m.Name, m.Spec.MachineName, string(m.Spec.Strategy), string(m.Status.Phase), m.Status.SourceNode,
				target, string(m.Status.Reason), downtime, policy, age(m.CreationTimestamp, rc.Now),
			}
		}),
	},
	{
		Resource: "migrationpolicies", Singular: "migrationpolicy", Aliases: []string{"mpol"},
		GVR: kaironGVR("migrationpolicies"), GoKind: "MigrationPolicy",
		Columns: cols("NAME", "BANDWIDTH", "COMPLETION-S-PER-GIB", "PROGRESS-S", "AUTO-CONVERGE", "MAX-PARALLEL", "MAX-PER-NODE", "SELECTORS*", "AGE"),
		Row: rowOf(func(p *kaironv1.MigrationPolicy, rc *RowContext) []string {
			return []string{
				p.Name, quantity(p.Spec.BandwidthPerMigration), ptrInt64(p.Spec.CompletionTimeoutPerGiB), ptrInt64(p.Spec.ProgressTimeout),
				ptrBool(p.Spec.AllowAutoConverge), ptrInt32(p.Spec.MaxParallelMigrations), ptrInt32(p.Spec.MaxParallelOutboundPerNode),
				policySelectors(p), age(p.CreationTimestamp, rc.Now),
			}
		}),
		Describe: describeMigrationPolicy,
	},
	{
		Resource: "machinenetworkpolicies", Singular: "machinenetworkpolicy", Aliases: []string{"mnp"},
		GVR: kaironGVR("machinenetworkpolicies"), GoKind: "MachineNetworkPolicy", Namespaced: true,
		Columns: cols("NAME", "MACHINE", "MACHINES", "SELECTOR*", "AGE"),
		Row: rowOf(func(p *kaironv1.MachineNetworkPolicy, rc *RowContext) []string {
			sel := ""
			if p.Spec.MachineSelector != nil {
				sel = metav1.FormatLabelSelector(p.Spec.MachineSelector)
			}
			return []string{
				p.Name, p.Spec.MachineName, itoa(int64(p.Status.Machines)), sel, age(p.CreationTimestamp, rc.Now),
			}
		}),
	},
	{
		Resource: "machinequotas", Singular: "machinequota", Aliases: []string{"quota", "quotas", "mq"},
		GVR: kaironGVR("machinequotas"), GoKind: "MachineQuota", Namespaced: true,
		Columns: cols("NAME", "MACHINES", "CPU", "MEMORY", "AGE"),
		Row: rowOf(func(q *kaironv1.MachineQuota, rc *RowContext) []string {
			used, hard := q.Status.Used, q.Spec.Hard
			return []string{
				q.Name,
				ptrInt32(used.Machines) + "/" + ptrInt32(hard.Machines),
				ptrInt32(used.CPU) + "/" + ptrInt32(hard.CPU),
				quantity(used.Memory) + "/" + quantity(hard.Memory),
				age(q.CreationTimestamp, rc.Now),
			}
		}),
		Describe: describeQuota,
	},
	{
		Resource: "nodes", Singular: "node", Aliases: []string{"no"},
		GVR: corev1.SchemeGroupVersion.WithResource("nodes"), GoKind: "Node",
		RequiredLabel: kaironv1.LabelNode,
		Columns:       cols("NAME", "STATUS", "BACKEND", "ACCELERATION", "MACHINES", "CPU", "MEMORY", "INTERNAL-IP*", "AGE"),
		Prepare:       loadNodeUsage,
		Row: rowOf(func(n *corev1.Node, rc *RowContext) []string {
			u := rc.NodeUsage[n.Name]
			if u == nil {
				u = &nodeUsage{}
			}
			alloc := n.Status.Allocatable
			return []string{
				n.Name, nodeStatus(n), n.Labels[kaironv1.LabelNodeBackend], n.Labels[kaironv1.LabelNodeAcceleration],
				strconv.Itoa(u.Machines),
				itoa(u.CPU) + "/" + allocatable(alloc, corev1.ResourceCPU),
				u.Memory.String() + "/" + allocatable(alloc, corev1.ResourceMemory),
				nodeAddress(n, corev1.NodeInternalIP), age(n.CreationTimestamp, rc.Now),
			}
		}),
	},
}

// cols builds columns from headers; a trailing "*" marks a wide column.
func cols(headers ...string) []Column {
	out := make([]Column, len(headers))
	for i, h := range headers {
		if name, ok := strings.CutSuffix(h, "*"); ok {
			out[i] = Column{Header: name, Wide: true}
		} else {
			out[i] = Column{Header: h}
		}
	}
	return out
}

// lookupKind resolves what the user typed to a kind, case-insensitively.
func lookupKind(name string) (*Kind, error) {
	n := strings.ToLower(name)
	for _, k := range kinds {
		if n == k.Resource || n == k.Singular || n == k.Resource+"."+k.GVR.Group || n == k.Singular+"."+k.GVR.Group {
			return k, nil
		}
		for _, a := range k.Aliases {
			if n == a {
				return k, nil
			}
		}
	}
	return nil, fmt.Errorf("unknown kind %q; valid kinds: %s", name, kindList())
}

// kindList is every kind with its aliases, for help and errors.
func kindList() string {
	parts := make([]string, len(kinds))
	for i, k := range kinds {
		parts[i] = k.Resource + " (" + strings.Join(append([]string{k.Singular}, k.Aliases...), ", ") + ")"
	}
	return strings.Join(parts, ", ")
}

// kindHelp lists the kinds one per line, for command help.
func kindHelp() string {
	var b strings.Builder
	for _, k := range kinds {
		fmt.Fprintf(&b, "  %-24s %s\n", k.Resource, strings.Join(append([]string{k.Singular}, k.Aliases...), ", "))
	}
	return b.String()
}

// gvk is the kind's group, version and kind.
func (k *Kind) gvk() schema.GroupVersionKind { return k.GVR.GroupVersion().WithKind(k.GoKind) }

// object is an empty unstructured object of kind k named ns/name (the
// namespace dropped for cluster-scoped kinds), for the generic verbs that
// read or delete any kind by name through Options.Client.
func (k *Kind) object(ns, name string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(k.gvk())
	if k.Namespaced {
		u.SetNamespace(ns)
	}
	u.SetName(name)
	return u
}

// list is an empty unstructured list of kind k.
func (k *Kind) list() *unstructured.UnstructuredList {
	l := &unstructured.UnstructuredList{}
	l.SetGroupVersionKind(k.GVR.GroupVersion().WithKind(k.GoKind + "List"))
	return l
}

// ref is "singular/name", the way kaironctl names one object in output.
func (k *Kind) ref(name string) string { return k.Singular + "/" + name }

// where describes a namespace for messages: ` in namespace "ns"`, or
// nothing for cluster-scoped kinds.
func (k *Kind) where(ns string) string {
	if !k.Namespaced {
		return ""
	}
	return fmt.Sprintf(" in namespace %q", ns)
}

// Cell formatting. An empty cell prints as "-", so every column of a table
// always has a value and the output splits cleanly on whitespace.

func itoa(v int64) string { return strconv.FormatInt(v, 10) }

func ptrInt32(v *int32) string {
	if v == nil {
		return "-"
	}
	return itoa(int64(*v))
}

func ptrInt64(v *int64) string {
	if v == nil {
		return "-"
	}
	return itoa(*v)
}

func ptrBool(v *bool) string {
	if v == nil {
		return "-"
	}
	return strconv.FormatBool(*v)
}

func quantity(q *resource.Quantity) string {
	if q == nil || q.IsZero() && q.Format == "" {
		return "-"
	}
	return q.String()
}

func intOrString(v *intstr.IntOrString) string {
	if v == nil {
		return "-"
	}
	return v.String()
}

func age(t metav1.Time, now time.Time) string {
	if t.IsZero() {
		return "<unknown>"
	}
	return duration.HumanDuration(now.Sub(t.Time))
}

func allocatable(list corev1.ResourceList, name corev1.ResourceName) string {
	q, ok := list[name]
	if !ok {
		return "-"
	}
	return q.String()
}

func nodeAddress(n *corev1.Node, t corev1.NodeAddressType) string {
	for _, a := range n.Status.Addresses {
		if a.Type == t {
			return a.Address
		}
	}
	return ""
}

// nodeStatus is Ready or NotReady, with ",SchedulingDisabled" when the node
// is cordoned, as kubectl prints it.
func nodeStatus(n *corev1.Node) string {
	s := "NotReady"
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
			s = "Ready"
		}
	}
	if !rules.NodeAgentReachable(n) {
		// The kubelet may say Ready while Kairon's agent there is gone.
		s += ",AgentUnreachable"
	}
	if rules.NodeFenced(n) {
		s += ",Fenced"
	}
	if n.Spec.Unschedulable {
		s += ",SchedulingDisabled"
	}
	return s
}

// loadNodeUsage counts, for every node, the Machines whose spec.nodeName
// is that node and the vCPUs and memory they ask for.
func loadNodeUsage(ctx context.Context, o *Options, rc *RowContext) error {
	machines, err := o.listMachines(ctx, metav1.NamespaceAll)
	if err != nil {
		return err
	}
	rc.NodeUsage = map[string]*nodeUsage{}
	for i := range machines {
		m := &machines[i]
		if m.Spec.NodeName == "" {
			continue
		}
		u := rc.NodeUsage[m.Spec.NodeName]
		if u == nil {
			u = &nodeUsage{Memory: *resource.NewQuantity(0, resource.BinarySI)}
			rc.NodeUsage[m.Spec.NodeName] = u
		}
		u.Machines++
		u.CPU += int64(m.Spec.CPU)
		u.Memory.Add(m.Spec.Memory)
	}
	return nil
}
