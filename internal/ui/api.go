package ui

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/rules"
)

// The JSON API's field names are camelCase, as Kubernetes' own; a field
// that may be unknown is null rather than left out, so every object of a
// kind has the same keys. docs/guides/ui.md documents them.

// List is the envelope of every list endpoint: one page of items (see
// paging.go).
type List[T any] struct {
	Items []T `json:"items"`
	// Continue is the ?continue= of the next page; "" on the last page.
	Continue string `json:"continue"`
	// Total is how many items the request selects, on all its pages.
	Total int `json:"total"`
}

// Condition is a metav1.Condition as the UI shows it.
type Condition struct {
	Type               string    `json:"type"`
	Status             string    `json:"status"`
	Reason             string    `json:"reason"`
	Message            string    `json:"message"`
	LastTransitionTime time.Time `json:"lastTransitionTime"`
}

// Address is one address of a Machine.
type Address struct {
	Type    string `json:"type"`
	Address string `json:"address"`
}

// Machine is one Machine.
type Machine struct {
	Namespace    string            `json:"namespace"`
	Name         string            `json:"name"`
	Phase        string            `json:"phase"`
	Message      string            `json:"message"`
	Node         string            `json:"node"`
	CPU          int32             `json:"cpu"`
	Memory       string            `json:"memory"`
	Image        string            `json:"image"`
	Pool         string            `json:"pool"`
	Claim        string            `json:"claim"`
	Acceleration string            `json:"acceleration"`
	BootMillis   int64             `json:"bootMillis"`
	Addresses    []Address         `json:"addresses"`
	Labels       map[string]string `json:"labels"`
	Conditions   []Condition       `json:"conditions"`
	ConsoleTail  string            `json:"consoleTail"`
	CreatedAt    time.Time         `json:"createdAt"`
}

// Node is one Kairon node (a Node carrying kairon.zyvor.dev/node).
type Node struct {
	Name              string    `json:"name"`
	Ready             bool      `json:"ready"`
	Cordoned          bool      `json:"cordoned"`
	Backend           string    `json:"backend"`
	Acceleration      string    `json:"acceleration"`
	InternalIP        string    `json:"internalIP"`
	Machines          int       `json:"machines"`
	CPUAllocated      int64     `json:"cpuAllocated"`
	CPUAllocatable    string    `json:"cpuAllocatable"`
	MemoryAllocated   string    `json:"memoryAllocated"`
	MemoryAllocatable string    `json:"memoryAllocatable"`
	CreatedAt         time.Time `json:"createdAt"`
}

// Pool is one MachinePool.
type Pool struct {
	Namespace string    `json:"namespace"`
	Name      string    `json:"name"`
	Desired   *int32    `json:"desired"`
	Replicas  int32     `json:"replicas"`
	Warm      int32     `json:"warm"`
	ReadyWarm int32     `json:"readyWarm"`
	Booting   int32     `json:"booting"`
	Claimed   int32     `json:"claimed"`
	CreatedAt time.Time `json:"createdAt"`
}

// Claim is one MachineClaim.
type Claim struct {
	Namespace    string     `json:"namespace"`
	Name         string     `json:"name"`
	Pool         string     `json:"pool"`
	Phase        string     `json:"phase"`
	Machine      string     `json:"machine"`
	BindMillis   int64      `json:"bindMillis"`
	BoundAt      *time.Time `json:"boundAt"`
	EgressPolicy string     `json:"egressPolicy"`
	Message      string     `json:"message"`
	CreatedAt    time.Time  `json:"createdAt"`
}

// Migration is one MachineMigration.
type Migration struct {
	Namespace      string     `json:"namespace"`
	Name           string     `json:"name"`
	Machine        string     `json:"machine"`
	Strategy       string     `json:"strategy"`
	Phase          string     `json:"phase"`
	Reason         string     `json:"reason"`
	Message        string     `json:"message"`
	SourceNode     string     `json:"sourceNode"`
	TargetNode     string     `json:"targetNode"`
	DowntimeMillis int64      `json:"downtimeMillis"`
	StartTime      *time.Time `json:"startTime"`
	CompletionTime *time.Time `json:"completionTime"`
	CreatedAt      time.Time  `json:"createdAt"`
}

// PolicyNode is how one node enforces a network policy.
type PolicyNode struct {
	Node               string   `json:"node"`
	Machines           []string `json:"machines"`
	ObservedGeneration int64    `json:"observedGeneration"`
	Enforced           bool     `json:"enforced"`
	Error              string   `json:"error"`
}

// NetworkPolicy is one MachineNetworkPolicy.
type NetworkPolicy struct {
	Namespace       string          `json:"namespace"`
	Name            string          `json:"name"`
	Machine         string          `json:"machine"`
	MachineSelector string          `json:"machineSelector"`
	Machines        int32           `json:"machines"`
	Egress          json.RawMessage `json:"egress"`
	Generation      int64           `json:"generation"`
	Nodes           []PolicyNode    `json:"nodes"`
	Conditions      []Condition     `json:"conditions"`
	CreatedAt       time.Time       `json:"createdAt"`
}

// Budget is one MachineDisruptionBudget with its numbers recomputed now by
// rules.ComputeBudgetStates (what `kaironctl describe budget` prints), and
// the status the controller last wrote (what `kaironctl get budgets` prints).
type Budget struct {
	Namespace          string            `json:"namespace"`
	Name               string            `json:"name"`
	Selector           map[string]string `json:"selector"`
	MinAvailable       *string           `json:"minAvailable"`
	MaxUnavailable     *string           `json:"maxUnavailable"`
	ExpectedMachines   int32             `json:"expectedMachines"`
	CurrentHealthy     int32             `json:"currentHealthy"`
	DesiredHealthy     int32             `json:"desiredHealthy"`
	DisruptionsAllowed int32             `json:"disruptionsAllowed"`
	Summary            string            `json:"summary"`
	Error              string            `json:"error"`
	Machines           []BudgetMachine   `json:"machines"`
	// HiddenMachines counts the matching Machines left out of machines
	// because the user may not list Machines in their namespace.
	HiddenMachines int            `json:"hiddenMachines"`
	ReportedStatus ReportedStatus `json:"reportedStatus"`
}

// BudgetMachine is one Machine a budget matches: the receipt for its count.
type BudgetMachine struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Phase     string `json:"phase"`
	Healthy   bool   `json:"healthy"`
	Migration string `json:"migration"`
	Reason    string `json:"reason"`
}

// ReportedStatus is a budget's status as the controller last wrote it.
type ReportedStatus struct {
	ExpectedMachines   int32 `json:"expectedMachines"`
	CurrentHealthy     int32 `json:"currentHealthy"`
	DesiredHealthy     int32 `json:"desiredHealthy"`
	DisruptionsAllowed int32 `json:"disruptionsAllowed"`
	ObservedGeneration int64 `json:"observedGeneration"`
	Generation         int64 `json:"generation"`
}

// Event is one Kubernetes event.
type Event struct {
	Namespace string    `json:"namespace"`
	Type      string    `json:"type"`
	Reason    string    `json:"reason"`
	Note      string    `json:"note"`
	Kind      string    `json:"kind"`
	Object    string    `json:"object"`
	Count     int32     `json:"count"`
	Time      time.Time `json:"time"`
}

// Errors are {"error": "..."} with the HTTP status.
func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, map[string]string{"error": msg})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// readError answers an error of a read: 401 and 403 for a user who is not
// signed in or may not read it, the API server's own status for its
// errors, 500 otherwise.
func readError(w http.ResponseWriter, err error) {
	var f forbidden
	var status apierrors.APIStatus
	switch {
	case errors.Is(err, errNotAuthenticate):
		writeError(w, http.StatusUnauthorized, err.Error())
	case errors.As(err, &f):
		writeError(w, http.StatusForbidden, f.reason)
	case errors.As(err, &status) && status.Status().Code != 0:
		writeError(w, int(status.Status().Code), status.Status().Message)
	default:
		writeError(w, http.StatusInternalServerError, err.Error())
	}
}

// serveRead answers a list endpoint, one page of it, once the user may
// make the reads of needs in the request's namespace.
func serveRead[T keyed](s *Server, w http.ResponseWriter, r *http.Request, list func(ctx context.Context, ns string) ([]T, error), needs ...access) {
	ns := r.URL.Query().Get("namespace")
	p, err := pageRequestOf(r, DefaultPageSize)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if err := s.mayRead(r.Context(), ns, needs...); err != nil {
		readError(w, err)
		return
	}
	items, err := list(r.Context(), ns)
	if err != nil {
		readError(w, err)
		return
	}
	slices.SortFunc(items, func(a, b T) int { return strings.Compare(a.key(), b.key()) })
	page, next, _ := pageOf(items, p)
	if page == nil {
		page = []T{}
	}
	writeJSON(w, http.StatusOK, List[T]{Items: page, Continue: next, Total: len(items)})
}

func (s *Server) apiBudgets(w http.ResponseWriter, r *http.Request) {
	serveRead(s, w, r, s.budgets, listBudgets)
}

func (s *Server) apiNodes(w http.ResponseWriter, r *http.Request) {
	serveRead(s, w, r, s.nodes, listNodes, listMachines)
}

func (s *Server) apiMachines(w http.ResponseWriter, r *http.Request) {
	f, err := machineFilterOf(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	serveRead(s, w, r, func(ctx context.Context, ns string) ([]Machine, error) { return s.machines(ctx, f) }, listMachines)
}

func (s *Server) apiPools(w http.ResponseWriter, r *http.Request) {
	serveRead(s, w, r, s.pools, listPools)
}

func (s *Server) apiClaims(w http.ResponseWriter, r *http.Request) {
	serveRead(s, w, r, s.claims, listClaims)
}

func (s *Server) apiMigrations(w http.ResponseWriter, r *http.Request) {
	serveRead(s, w, r, s.migrations, listMigrations)
}

func (s *Server) apiPolicies(w http.ResponseWriter, r *http.Request) {
	serveRead(s, w, r, s.policies, listPolicies)
}

// apiEvents is the server-sent event stream: one "change" event whose data
// is {"kinds": [...]} each time objects of those kinds change (changes that
// come close together are sent as one), and a comment every 20 s so
// proxies keep the connection open.
func (s *Server) apiEvents(w http.ResponseWriter, r *http.Request) {
	fl, ok := w.(http.Flusher)
	if !ok {
		writeError(w, http.StatusInternalServerError, "streaming is not supported by this connection")
		return
	}
	sub := s.hub.subscribe()
	defer s.hub.unsubscribe(sub)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	fmt.Fprint(w, ": connected\nretry: 2000\n\n")
	fl.Flush()
	beat := time.NewTicker(20 * time.Second)
	defer beat.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-beat.C:
			fmt.Fprint(w, ": keep-alive\n\n")
		case <-sub.wake:
			kinds := sub.take()
			if len(kinds) == 0 {
				continue
			}
			sort.Strings(kinds)
			data, _ := json.Marshal(map[string][]string{"kinds": kinds})
			fmt.Fprintf(w, "event: change\ndata: %s\n\n", data)
		}
		fl.Flush()
	}
}

func inNamespace(ns string) []client.ListOption {
	if ns == "" {
		return nil
	}
	return []client.ListOption{client.InNamespace(ns)}
}

func byNamespaceName[T interface {
	GetNamespace() string
	GetName() string
}](a, b T) int {
	return cmp.Or(cmp.Compare(a.GetNamespace(), b.GetNamespace()), cmp.Compare(a.GetName(), b.GetName()))
}

func conditions(cs []metav1.Condition) []Condition {
	out := make([]Condition, 0, len(cs))
	for _, c := range cs {
		out = append(out, Condition{Type: c.Type, Status: string(c.Status), Reason: c.Reason, Message: c.Message, LastTransitionTime: c.LastTransitionTime.Time})
	}
	return out
}

func timePtr(t *metav1.Time) *time.Time {
	if t == nil {
		return nil
	}
	v := t.Time
	return &v
}

func intOrString(v *intstr.IntOrString) *string {
	if v == nil {
		return nil
	}
	s := v.String()
	return &s
}

func quantity(q resource.Quantity) string {
	if q.IsZero() && q.Format == "" {
		return ""
	}
	return q.String()
}

// budgets evaluates every budget with rules.ComputeBudgetStates against
// every Machine and MachineMigration in the cache (a budget counts Machines
// of all namespaces), then keeps the budgets of namespace ns ("" is all).
func (s *Server) budgets(ctx context.Context, ns string) ([]Budget, error) {
	states, err := rules.LoadBudgetStates(ctx, s.cache)
	if err != nil {
		return nil, err
	}
	var out []Budget
	for i := range states {
		st := &states[i]
		if ns != "" && st.Namespace != ns {
			continue
		}
		b := Budget{
			Namespace: st.Namespace, Name: st.Name, Selector: st.Selector,
			MinAvailable: intOrString(st.Budget.Spec.MinAvailable), MaxUnavailable: intOrString(st.Budget.Spec.MaxUnavailable),
			ExpectedMachines: st.ExpectedMachines, CurrentHealthy: st.CurrentHealthy,
			DesiredHealthy: st.DesiredHealthy, DisruptionsAllowed: st.DisruptionsAllowed,
			Summary:  rules.BudgetSummary(st),
			Machines: make([]BudgetMachine, 0, len(st.Machines)),
			ReportedStatus: ReportedStatus{
				ExpectedMachines: st.Budget.Status.ExpectedMachines, CurrentHealthy: st.Budget.Status.CurrentHealthy,
				DesiredHealthy: st.Budget.Status.DesiredHealthy, DisruptionsAllowed: st.Budget.Status.DisruptionsAllowed,
				ObservedGeneration: st.Budget.Status.ObservedGeneration, Generation: st.Generation,
			},
		}
		if b.Selector == nil {
			b.Selector = map[string]string{}
		}
		if st.Err != nil {
			b.Error = st.Err.Error()
		}
		for _, m := range st.Machines {
			// The numbers are the budget's, which whoever reads the budget
			// reads in its status; a receipt names a Machine, which only
			// those who may list that namespace's Machines see.
			if err := s.mayRead(ctx, m.Namespace, listMachines); err != nil {
				var f forbidden
				if !errors.As(err, &f) {
					return nil, err
				}
				b.HiddenMachines++
				continue
			}
			b.Machines = append(b.Machines, BudgetMachine{Namespace: m.Namespace, Name: m.Name, Phase: string(m.Phase), Healthy: m.Healthy, Migration: m.Migration, Reason: m.Reason})
		}
		out = append(out, b)
	}
	return out, nil
}

// machineFilter selects Machines; the zero value selects all.
type machineFilter struct {
	Namespace, Phase, Node string
	// Label is a label selector as kubectl -l takes it.
	Label    string
	selector labels.Selector
}

func machineFilterOf(r *http.Request) (machineFilter, error) {
	q := r.URL.Query()
	f := machineFilter{Namespace: q.Get("namespace"), Phase: q.Get("phase"), Node: q.Get("node"), Label: q.Get("labelSelector")}
	if f.Label != "" {
		sel, err := labels.Parse(f.Label)
		if err != nil {
			return f, fmt.Errorf("invalid labelSelector %q: %v", f.Label, err)
		}
		f.selector = sel
	}
	return f, nil
}

func (s *Server) machines(ctx context.Context, f machineFilter) ([]Machine, error) {
	var list kaironv1.MachineList
	opts := inNamespace(f.Namespace)
	if f.selector != nil {
		opts = append(opts, client.MatchingLabelsSelector{Selector: f.selector})
	}
	if err := s.cache.List(ctx, &list, opts...); err != nil {
		return nil, err
	}
	var out []Machine
	for i := range list.Items {
		m := &list.Items[i]
		if f.Phase != "" && string(m.Status.Phase) != f.Phase || f.Node != "" && m.Spec.NodeName != f.Node {
			continue
		}
		out = append(out, machineView(m))
	}
	slices.SortFunc(out, func(a, b Machine) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	return out, nil
}

func machineView(m *kaironv1.Machine) Machine {
	v := Machine{
		Namespace: m.Namespace, Name: m.Name, Phase: string(m.Status.Phase), Message: m.Status.Message,
		Node: m.Spec.NodeName, CPU: m.Spec.CPU, Memory: quantity(m.Spec.Memory), Image: m.Spec.Image,
		Pool: m.Labels[kaironv1.LabelMachinePool], Claim: m.Labels[kaironv1.LabelMachineClaim],
		Acceleration: m.Status.Acceleration, BootMillis: m.Status.BootMillis,
		Addresses: make([]Address, 0, len(m.Status.Addresses)), Labels: m.Labels,
		Conditions: conditions(m.Status.Conditions), ConsoleTail: m.Status.ConsoleTail,
		CreatedAt: m.CreationTimestamp.Time,
	}
	if v.Labels == nil {
		v.Labels = map[string]string{}
	}
	for _, a := range m.Status.Addresses {
		v.Addresses = append(v.Addresses, Address{Type: a.Type, Address: a.Address})
	}
	return v
}

// nodes are the Kairon nodes, with what the Machines placed on each ask for
// (only the Machines of namespace ns when it is not "": nodes belong to no
// namespace).
func (s *Server) nodes(ctx context.Context, ns string) ([]Node, error) {
	var nodes corev1.NodeList
	if err := s.cache.List(ctx, &nodes, client.HasLabels{kaironv1.LabelNode}); err != nil {
		return nil, err
	}
	var machines kaironv1.MachineList
	if err := s.cache.List(ctx, &machines, inNamespace(ns)...); err != nil {
		return nil, err
	}
	type usage struct {
		machines int
		cpu      int64
		memory   resource.Quantity
	}
	used := map[string]*usage{}
	for i := range machines.Items {
		m := &machines.Items[i]
		if m.Spec.NodeName == "" {
			continue
		}
		u := used[m.Spec.NodeName]
		if u == nil {
			u = &usage{memory: *resource.NewQuantity(0, resource.BinarySI)}
			used[m.Spec.NodeName] = u
		}
		u.machines++
		u.cpu += int64(m.Spec.CPU)
		u.memory.Add(m.Spec.Memory)
	}
	out := make([]Node, 0, len(nodes.Items))
	for i := range nodes.Items {
		n := &nodes.Items[i]
		u := used[n.Name]
		if u == nil {
			u = &usage{memory: *resource.NewQuantity(0, resource.BinarySI)}
		}
		v := Node{
			Name: n.Name, Cordoned: n.Spec.Unschedulable,
			Backend: n.Labels[kaironv1.LabelNodeBackend], Acceleration: n.Labels[kaironv1.LabelNodeAcceleration],
			Machines: u.machines, CPUAllocated: u.cpu, MemoryAllocated: u.memory.String(),
			CreatedAt: n.CreationTimestamp.Time,
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				v.Ready = true
			}
		}
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP && v.InternalIP == "" {
				v.InternalIP = a.Address
			}
		}
		if q, ok := n.Status.Allocatable[corev1.ResourceCPU]; ok {
			v.CPUAllocatable = q.String()
		}
		if q, ok := n.Status.Allocatable[corev1.ResourceMemory]; ok {
			v.MemoryAllocatable = q.String()
		}
		out = append(out, v)
	}
	slices.SortFunc(out, func(a, b Node) int { return cmp.Compare(a.Name, b.Name) })
	return out, nil
}

func (s *Server) pools(ctx context.Context, ns string) ([]Pool, error) {
	var list kaironv1.MachinePoolList
	if err := s.cache.List(ctx, &list, inNamespace(ns)...); err != nil {
		return nil, err
	}
	slices.SortFunc(list.Items, func(a, b kaironv1.MachinePool) int { return byNamespaceName(&a, &b) })
	out := make([]Pool, 0, len(list.Items))
	for _, p := range list.Items {
		out = append(out, Pool{
			Namespace: p.Namespace, Name: p.Name, Desired: p.Spec.Replicas, Replicas: p.Status.Replicas,
			Warm: p.Status.Warm, ReadyWarm: p.Status.ReadyWarm, Booting: max(0, p.Status.Warm-p.Status.ReadyWarm),
			Claimed: p.Status.Claimed, CreatedAt: p.CreationTimestamp.Time,
		})
	}
	return out, nil
}

func (s *Server) claims(ctx context.Context, ns string) ([]Claim, error) {
	var list kaironv1.MachineClaimList
	if err := s.cache.List(ctx, &list, inNamespace(ns)...); err != nil {
		return nil, err
	}
	slices.SortFunc(list.Items, func(a, b kaironv1.MachineClaim) int { return byNamespaceName(&a, &b) })
	out := make([]Claim, 0, len(list.Items))
	for _, c := range list.Items {
		out = append(out, Claim{
			Namespace: c.Namespace, Name: c.Name, Pool: c.Spec.PoolName, Phase: string(c.Status.Phase),
			Machine: c.Status.MachineName, BindMillis: c.Status.BindMillis, BoundAt: timePtr(c.Status.BoundAt),
			EgressPolicy: c.Status.EgressPolicy, Message: c.Status.Message, CreatedAt: c.CreationTimestamp.Time,
		})
	}
	return out, nil
}

func (s *Server) migrations(ctx context.Context, ns string) ([]Migration, error) {
	var list kaironv1.MachineMigrationList
	if err := s.cache.List(ctx, &list, inNamespace(ns)...); err != nil {
		return nil, err
	}
	slices.SortFunc(list.Items, func(a, b kaironv1.MachineMigration) int { return byNamespaceName(&a, &b) })
	out := make([]Migration, 0, len(list.Items))
	for _, m := range list.Items {
		target := m.Status.TargetNode
		if target == "" {
			target = m.Spec.TargetNode
		}
		out = append(out, Migration{
			Namespace: m.Namespace, Name: m.Name, Machine: m.Spec.MachineName, Strategy: string(m.Spec.Strategy),
			Phase: string(m.Status.Phase), Reason: string(m.Status.Reason), Message: m.Status.Message,
			SourceNode: m.Status.SourceNode, TargetNode: target, DowntimeMillis: m.Status.DowntimeMillis,
			StartTime: timePtr(m.Status.StartTime), CompletionTime: timePtr(m.Status.CompletionTime),
			CreatedAt: m.CreationTimestamp.Time,
		})
	}
	return out, nil
}

func (s *Server) policies(ctx context.Context, ns string) ([]NetworkPolicy, error) {
	var list kaironv1.MachineNetworkPolicyList
	if err := s.cache.List(ctx, &list, inNamespace(ns)...); err != nil {
		return nil, err
	}
	slices.SortFunc(list.Items, func(a, b kaironv1.MachineNetworkPolicy) int { return byNamespaceName(&a, &b) })
	out := make([]NetworkPolicy, 0, len(list.Items))
	for _, p := range list.Items {
		egress, err := json.Marshal(p.Spec.Egress)
		if err != nil {
			return nil, err
		}
		v := NetworkPolicy{
			Namespace: p.Namespace, Name: p.Name, Machine: p.Spec.MachineName, Machines: p.Status.Machines,
			Egress: egress, Generation: p.Generation, Nodes: make([]PolicyNode, 0, len(p.Status.Nodes)),
			Conditions: conditions(p.Status.Conditions), CreatedAt: p.CreationTimestamp.Time,
		}
		if p.Spec.MachineSelector != nil {
			v.MachineSelector = metav1.FormatLabelSelector(p.Spec.MachineSelector)
		}
		for _, n := range p.Status.Nodes {
			machines := n.Machines
			if machines == nil {
				machines = []string{}
			}
			v.Nodes = append(v.Nodes, PolicyNode{
				Node: n.Node, Machines: machines, ObservedGeneration: n.ObservedGeneration, Error: n.Error,
				Enforced: n.Error == "" && n.ObservedGeneration == p.Generation,
			})
		}
		out = append(out, v)
	}
	return out, nil
}

// events are the Kubernetes events matching keep, newest first, at most
// limit of them.
func (s *Server) events(ctx context.Context, ns string, limit int, keep func(*eventsv1.Event) bool) ([]Event, error) {
	var list eventsv1.EventList
	if err := s.cache.List(ctx, &list, inNamespace(ns)...); err != nil {
		return nil, err
	}
	var out []Event
	for i := range list.Items {
		e := &list.Items[i]
		if keep != nil && !keep(e) {
			continue
		}
		v := Event{Namespace: e.Namespace, Type: e.Type, Reason: e.Reason, Note: e.Note, Kind: e.Regarding.Kind, Object: e.Regarding.Name, Count: 1, Time: eventTime(e)}
		if e.Series != nil {
			v.Count = e.Series.Count
		} else if e.DeprecatedCount > 0 {
			v.Count = e.DeprecatedCount
		}
		out = append(out, v)
	}
	slices.SortFunc(out, func(a, b Event) int { return b.Time.Compare(a.Time) })
	if len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// eventTime is when the event last happened, whichever API wrote it.
func eventTime(e *eventsv1.Event) time.Time {
	switch {
	case e.Series != nil && !e.Series.LastObservedTime.IsZero():
		return e.Series.LastObservedTime.Time
	case !e.DeprecatedLastTimestamp.IsZero():
		return e.DeprecatedLastTimestamp.Time
	case !e.EventTime.IsZero():
		return e.EventTime.Time
	}
	return e.CreationTimestamp.Time
}

// machineLink is the page of a Machine.
func machineLink(ns, name string) string {
	return "/machines/" + ns + "/" + name
}
