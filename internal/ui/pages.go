package ui

import (
	"bytes"
	"cmp"
	"context"
	"embed"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"slices"
	"sort"
	"strings"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/duration"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

//go:embed web
var webFS embed.FS

func staticFS() fs.FS {
	sub, err := fs.Sub(webFS, "web/static")
	if err != nil {
		panic(err)
	}
	return sub
}

// page is one server-rendered page: its template and the kinds whose
// changes make it refresh its live region.
type page struct {
	tmpl  *template.Template
	kinds []string
}

var funcs = template.FuncMap{
	"age": func(t time.Time) string {
		if t.IsZero() {
			return ""
		}
		return duration.HumanDuration(time.Since(t))
	},
	"machineLink": machineLink,
	"labels": func(m map[string]string) string {
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for i, k := range keys {
			keys[i] = k + "=" + m[k]
		}
		return strings.Join(keys, ",")
	},
	"deref": func(p *string) string {
		if p == nil {
			return "-"
		}
		return *p
	},
	"lower": strings.ToLower,
}

func mustPage(name string, kinds ...string) page {
	t := template.Must(template.New("layout.html").Funcs(funcs).ParseFS(webFS, "web/layout.html", "web/"+name))
	return page{tmpl: t, kinds: kinds}
}

// pageData is what every page template gets.
type pageData struct {
	Title string
	Nav   string
	Kinds string
	Query map[string]string
	Data  any
}

func (s *Server) pageRoutes() {
	type pageFunc func(ctx context.Context, r *http.Request) (title string, data any, err error)
	add := func(pattern, nav, file string, kinds []string, f pageFunc) {
		p := mustPage(file, kinds...)
		s.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			title, data, err := f(r.Context(), r)
			if err != nil {
				code := http.StatusInternalServerError
				if apierrors.IsNotFound(err) {
					code = http.StatusNotFound
				} else if _, bad := err.(badRequest); bad {
					code = http.StatusBadRequest
				}
				http.Error(w, err.Error(), code)
				return
			}
			q := map[string]string{}
			for k := range r.URL.Query() {
				q[k] = r.URL.Query().Get(k)
			}
			var buf bytes.Buffer
			if err := p.tmpl.Execute(&buf, pageData{Title: title, Nav: nav, Kinds: strings.Join(p.kinds, " "), Query: q, Data: data}); err != nil {
				http.Error(w, "rendering the page: "+err.Error(), http.StatusInternalServerError)
				return
			}
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			w.Header().Set("Cache-Control", "no-store")
			_, _ = w.Write(buf.Bytes())
		})
	}
	add("GET /{$}", "overview", "overview.html", []string{"nodes", "machines", "machine-pools", "machine-claims", "disruption-budgets", "migrations", "kubernetes-events"}, s.overviewPage)
	add("GET /budgets", "budgets", "budgets.html", []string{"disruption-budgets", "machines", "migrations"}, s.budgetsPage)
	add("GET /machines", "machines", "machines.html", []string{"machines"}, s.machinesPage)
	add("GET /machines/{namespace}/{name}", "machines", "machine.html", []string{"machines", "kubernetes-events"}, s.machinePage)
	add("GET /nodes", "nodes", "nodes.html", []string{"nodes", "machines"}, s.nodesPage)
	add("GET /pools", "pools", "pools.html", []string{"machine-pools", "machine-claims"}, s.poolsPage)
	add("GET /migrations", "migrations", "migrations.html", []string{"migrations"}, s.migrationsPage)
	add("GET /network-policies", "network-policies", "policies.html", []string{"network-policies"}, s.policiesPage)
}

type badRequest struct{ error }

// overview is the at-a-glance page.
type overview struct {
	Nodes, NodesReady, NodesCordoned int
	Machines                         int
	Phases                           []phaseCount
	Pools                            int
	Warm, ReadyWarm, Claimed         int32
	Claims                           []phaseCount
	Budgets                          []Budget
	Migrations                       []phaseCount
	Warnings                         []Event
}

type phaseCount struct {
	Phase string
	Count int
}

func countPhases[T any](items []T, phase func(T) string) []phaseCount {
	n := map[string]int{}
	for _, it := range items {
		p := phase(it)
		if p == "" {
			p = "(none yet)"
		}
		n[p]++
	}
	out := make([]phaseCount, 0, len(n))
	for p, c := range n {
		out = append(out, phaseCount{p, c})
	}
	slices.SortFunc(out, func(a, b phaseCount) int { return cmp.Compare(a.Phase, b.Phase) })
	return out
}

func (s *Server) overviewPage(ctx context.Context, r *http.Request) (string, any, error) {
	ns := r.URL.Query().Get("namespace")
	var o overview
	nodes, err := s.nodes(ctx, ns)
	if err != nil {
		return "", nil, err
	}
	o.Nodes = len(nodes)
	for _, n := range nodes {
		if n.Ready {
			o.NodesReady++
		}
		if n.Cordoned {
			o.NodesCordoned++
		}
	}
	machines, err := s.machines(ctx, machineFilter{Namespace: ns})
	if err != nil {
		return "", nil, err
	}
	o.Machines = len(machines)
	o.Phases = countPhases(machines, func(m Machine) string { return m.Phase })
	pools, err := s.pools(ctx, ns)
	if err != nil {
		return "", nil, err
	}
	o.Pools = len(pools)
	for _, p := range pools {
		o.Warm += p.Warm
		o.ReadyWarm += p.ReadyWarm
		o.Claimed += p.Claimed
	}
	claims, err := s.claims(ctx, ns)
	if err != nil {
		return "", nil, err
	}
	o.Claims = countPhases(claims, func(c Claim) string { return c.Phase })
	if o.Budgets, err = s.budgets(ctx, ns); err != nil {
		return "", nil, err
	}
	migs, err := s.migrations(ctx, ns)
	if err != nil {
		return "", nil, err
	}
	o.Migrations = countPhases(migs, func(m Migration) string { return m.Phase })
	o.Warnings, err = s.events(ctx, ns, 20, func(e *eventsv1.Event) bool { return e.Type == "Warning" })
	if err != nil {
		return "", nil, err
	}
	return "Overview", o, nil
}

// budgetRow is a budget with its receipts in `kaironctl describe budget`'s
// order: the budget's own namespace first, by name, then the others.
type budgetRow struct {
	Budget
	Receipts []receipt
}

type receipt struct {
	Shown, Verdict string
	Healthy        bool
	Link           string
}

func (s *Server) budgetsPage(ctx context.Context, r *http.Request) (string, any, error) {
	budgets, err := s.budgets(ctx, r.URL.Query().Get("namespace"))
	if err != nil {
		return "", nil, err
	}
	rows := make([]budgetRow, 0, len(budgets))
	for _, b := range budgets {
		row := budgetRow{Budget: b}
		ms := slices.Clone(b.Machines)
		slices.SortStableFunc(ms, func(x, y BudgetMachine) int {
			if ox, oy := x.Namespace == b.Namespace, y.Namespace == b.Namespace; ox != oy {
				if ox {
					return -1
				}
				return 1
			}
			return cmp.Or(cmp.Compare(x.Namespace, y.Namespace), cmp.Compare(x.Name, y.Name))
		})
		for _, m := range ms {
			rc := receipt{Shown: m.Name, Verdict: "healthy", Healthy: m.Healthy, Link: machineLink(m.Namespace, m.Name)}
			if m.Namespace != b.Namespace {
				rc.Shown = m.Namespace + "/" + m.Name
			}
			if !m.Healthy {
				rc.Verdict = "NOT healthy (" + m.Reason + ")"
			}
			row.Receipts = append(row.Receipts, rc)
		}
		rows = append(rows, row)
	}
	return "Disruption budgets", rows, nil
}

// machinesView is the Machines page: the Machines the filter selects and
// the choices of its menus.
type machinesView struct {
	Machines []Machine
	Phases   []string
	Nodes    []string
}

func (s *Server) machinesPage(ctx context.Context, r *http.Request) (string, any, error) {
	f, err := machineFilterOf(r)
	if err != nil {
		return "", nil, badRequest{err}
	}
	ms, err := s.machines(ctx, f)
	if err != nil {
		return "", nil, err
	}
	v := machinesView{Machines: ms}
	for _, p := range []kaironv1.MachinePhase{kaironv1.MachinePending, kaironv1.MachineScheduled, kaironv1.MachineBooting, kaironv1.MachineRunning, kaironv1.MachineStopping, kaironv1.MachineStopped, kaironv1.MachineFailed} {
		v.Phases = append(v.Phases, string(p))
	}
	nodes, err := s.nodes(ctx, "")
	if err != nil {
		return "", nil, err
	}
	for _, n := range nodes {
		v.Nodes = append(v.Nodes, n.Name)
	}
	return "Machines", v, nil
}

type machineDetail struct {
	Machine
	Events []Event
}

func (s *Server) machinePage(ctx context.Context, r *http.Request) (string, any, error) {
	key := types.NamespacedName{Namespace: r.PathValue("namespace"), Name: r.PathValue("name")}
	var m kaironv1.Machine
	if err := s.cache.Get(ctx, key, &m); err != nil {
		return "", nil, err
	}
	evs, err := s.events(ctx, key.Namespace, 50, func(e *eventsv1.Event) bool {
		return e.Regarding.Kind == "Machine" && e.Regarding.Name == key.Name ||
			e.Related != nil && e.Related.Kind == "Machine" && e.Related.Name == key.Name
	})
	if err != nil {
		return "", nil, err
	}
	return fmt.Sprintf("Machine %s/%s", key.Namespace, key.Name), machineDetail{Machine: machineView(&m), Events: evs}, nil
}

func (s *Server) nodesPage(ctx context.Context, r *http.Request) (string, any, error) {
	nodes, err := s.nodes(ctx, r.URL.Query().Get("namespace"))
	return "Nodes", nodes, err
}

type poolsView struct {
	Pools  []Pool
	Claims []Claim
	Bind   bindHistogram
}

// bindHistogram is how long the bound claims shown took to bind
// (status.bindMillis), in buckets, for a bar chart.
type bindHistogram struct {
	Buckets       []bindBucket
	Count         int
	P50, P95, Max int64
}

type bindBucket struct {
	Label string
	Count int
	// Percent is the bar's length, of the fullest bucket's.
	Percent int
}

// bindBounds are the upper bounds, in ms, of every bucket but the last.
var bindBounds = []int64{10, 25, 50, 100, 250, 500, 1000, 2500, 5000}

func bindHistogramOf(claims []Claim) bindHistogram {
	var ms []int64
	for _, c := range claims {
		if c.BindMillis > 0 {
			ms = append(ms, c.BindMillis)
		}
	}
	h := bindHistogram{Count: len(ms)}
	if len(ms) == 0 {
		return h
	}
	slices.Sort(ms)
	h.P50, h.P95, h.Max = ms[(len(ms)-1)*50/100], ms[(len(ms)-1)*95/100], ms[len(ms)-1]
	counts := make([]int, len(bindBounds)+1)
	for _, v := range ms {
		i, _ := slices.BinarySearch(bindBounds, v)
		// v equal to a bound belongs to that bound's bucket ("≤ bound").
		counts[i]++
	}
	top := slices.Max(counts)
	prev := int64(0)
	for i, n := range counts {
		label := fmt.Sprintf("> %d ms", bindBounds[len(bindBounds)-1])
		if i < len(bindBounds) {
			label = fmt.Sprintf("%d–%d ms", prev, bindBounds[i])
			prev = bindBounds[i]
		}
		h.Buckets = append(h.Buckets, bindBucket{Label: label, Count: n, Percent: n * 100 / top})
	}
	return h
}

func (s *Server) poolsPage(ctx context.Context, r *http.Request) (string, any, error) {
	ns := r.URL.Query().Get("namespace")
	pools, err := s.pools(ctx, ns)
	if err != nil {
		return "", nil, err
	}
	claims, err := s.claims(ctx, ns)
	return "Pools and claims", poolsView{Pools: pools, Claims: claims, Bind: bindHistogramOf(claims)}, err
}

func (s *Server) migrationsPage(ctx context.Context, r *http.Request) (string, any, error) {
	migs, err := s.migrations(ctx, r.URL.Query().Get("namespace"))
	return "Migrations", migs, err
}

func (s *Server) policiesPage(ctx context.Context, r *http.Request) (string, any, error) {
	ps, err := s.policies(ctx, r.URL.Query().Get("namespace"))
	return "Network policies", ps, err
}
