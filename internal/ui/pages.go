package ui

import (
	"bytes"
	"cmp"
	"context"
	"embed"
	"errors"
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
	// pageCount is the argument of the page-count template.
	"pageCount": func(p pager, what string) map[string]any { return map[string]any{"P": p, "What": what} },
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
	// User is who the page is shown to ("" when the kubeconfig's identity
	// is not known); Token: signed in with a token (so a sign-out button).
	User  string
	Token bool
	// Error is the message of an error page.
	Error string
}

func (s *Server) pageRoutes() {
	type pageFunc func(ctx context.Context, r *http.Request) (title string, data any, err error)
	add := func(pattern, nav, file string, kinds []string, f pageFunc) {
		p := mustPage(file, kinds...)
		s.authed.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			q := map[string]string{}
			for k := range r.URL.Query() {
				q[k] = r.URL.Query().Get(k)
			}
			pd := pageData{Nav: nav, Kinds: strings.Join(p.kinds, " "), Query: q}
			if u := userOf(r.Context()); u != nil {
				pd.User, pd.Token = u.name, !u.trusted
			}
			title, data, err := f(r.Context(), r)
			if err != nil {
				code := http.StatusInternalServerError
				var fb forbidden
				var status apierrors.APIStatus
				switch {
				case errors.As(err, &fb):
					code = http.StatusForbidden
				case apierrors.IsNotFound(err):
					code = http.StatusNotFound
				case errors.As(err, new(badRequest)):
					code = http.StatusBadRequest
				case errors.As(err, &status) && status.Status().Code != 0:
					code = int(status.Status().Code)
				}
				pd.Title, pd.Error, pd.Kinds = http.StatusText(code), err.Error(), ""
				s.renderPage(w, code, errorPage, pd)
				return
			}
			pd.Title, pd.Data = title, data
			s.renderPage(w, http.StatusOK, p, pd)
		})
	}
	add("GET /{$}", "overview", "overview.html", []string{"nodes", "machines", "machine-pools", "machine-claims", "disruption-budgets", "migrations", "kubernetes-events"}, s.overviewPage)
	add("GET /budgets", "budgets", "budgets.html", []string{"disruption-budgets", "machines", "migrations"}, s.budgetsPage)
	add("GET /machines", "machines", "machines.html", []string{"machines"}, s.machinesPage)
	add("GET /machines/{namespace}/{name}", "machines", "machine.html", []string{"machines", "kubernetes-events"}, s.machinePage)
	add("GET /nodes", "nodes", "nodes.html", []string{"nodes", "machines", "evacuations"}, s.nodesPage)
	add("GET /pools", "pools", "pools.html", []string{"machine-pools", "machine-claims"}, s.poolsPage)
	add("GET /migrations", "migrations", "migrations.html", []string{"migrations"}, s.migrationsPage)
	add("GET /network-policies", "network-policies", "policies.html", []string{"network-policies"}, s.policiesPage)
}

type badRequest struct{ error }

var (
	errorPage = mustPage("error.html")
	loginPage = mustPage("login.html")
)

// renderPage renders p with d, answering code.
func (s *Server) renderPage(w http.ResponseWriter, code int, p page, d pageData) {
	var buf bytes.Buffer
	if err := p.tmpl.Execute(&buf, d); err != nil {
		http.Error(w, "rendering the page: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write(buf.Bytes())
}

func (s *Server) renderLogin(w http.ResponseWriter, code int, d loginData) {
	s.renderPage(w, code, loginPage, pageData{Title: "Sign in", Nav: "login", Data: d, Query: map[string]string{}})
}

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
	// Show has the sections the user may read; Denied says why the
	// others are not shown.
	Show   map[string]bool
	Denied []string
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
	o := overview{Show: map[string]bool{}}
	// Each section shows what the user may read; the others say why not.
	section := func(name string, needs ...access) (bool, error) {
		err := s.mayRead(ctx, ns, needs...)
		var f forbidden
		if errors.As(err, &f) {
			o.Denied = append(o.Denied, f.reason)
			return false, nil
		}
		o.Show[name] = err == nil
		return err == nil, err
	}
	if ok, err := section("nodes", listNodes, listMachines); err != nil {
		return "", nil, err
	} else if ok {
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
	}
	if ok, err := section("machines", listMachines); err != nil {
		return "", nil, err
	} else if ok {
		machines, err := s.machines(ctx, machineFilter{Namespace: ns})
		if err != nil {
			return "", nil, err
		}
		o.Machines = len(machines)
		o.Phases = countPhases(machines, func(m Machine) string { return m.Phase })
	}
	if ok, err := section("pools", listPools); err != nil {
		return "", nil, err
	} else if ok {
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
	}
	if ok, err := section("claims", listClaims); err != nil {
		return "", nil, err
	} else if ok {
		claims, err := s.claims(ctx, ns)
		if err != nil {
			return "", nil, err
		}
		o.Claims = countPhases(claims, func(c Claim) string { return c.Phase })
	}
	if ok, err := section("budgets", listBudgets); err != nil {
		return "", nil, err
	} else if ok {
		if o.Budgets, err = s.budgets(ctx, ns); err != nil {
			return "", nil, err
		}
	}
	if ok, err := section("migrations", listMigrations); err != nil {
		return "", nil, err
	} else if ok {
		migs, err := s.migrations(ctx, ns)
		if err != nil {
			return "", nil, err
		}
		o.Migrations = countPhases(migs, func(m Migration) string { return m.Phase })
	}
	if ok, err := section("events", listEvents); err != nil {
		return "", nil, err
	} else if ok {
		if o.Warnings, err = s.events(ctx, ns, 20, func(e *eventsv1.Event) bool { return e.Type == "Warning" }); err != nil {
			return "", nil, err
		}
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
	ns := r.URL.Query().Get("namespace")
	if err := s.mayRead(ctx, ns, listBudgets); err != nil {
		return "", nil, err
	}
	budgets, err := s.budgets(ctx, ns)
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
	Pager    pager
}

// pager is where a paged list is: items From to To (from 1) of Total,
// and the links to the first and the next page ("" when there is none),
// which keep the filters and the page size.
type pager struct {
	From, To, Total int
	First, Next     string
}

func pagerOf(r *http.Request, shown, before, total int, next string) pager {
	p := pager{From: before + 1, To: before + shown, Total: total}
	if shown == 0 {
		p.From = before
	}
	if next != "" {
		p.Next = nextPageURL(r, next)
	}
	if before > 0 || r.URL.Query().Has("continue") {
		p.First = firstPageURL(r)
	}
	return p
}

func (s *Server) machinesPage(ctx context.Context, r *http.Request) (string, any, error) {
	f, err := machineFilterOf(r)
	if err != nil {
		return "", nil, badRequest{err}
	}
	pr, err := pageRequestOf(r, DefaultPageSize)
	if err != nil {
		return "", nil, badRequest{err}
	}
	if err := s.mayRead(ctx, f.Namespace, listMachines); err != nil {
		return "", nil, err
	}
	ms, err := s.machines(ctx, f)
	if err != nil {
		return "", nil, err
	}
	page, next, before := pageOf(ms, pr)
	v := machinesView{Machines: page, Pager: pagerOf(r, len(page), before, len(ms), next)}
	for _, p := range []kaironv1.MachinePhase{kaironv1.MachinePending, kaironv1.MachineScheduled, kaironv1.MachineBooting, kaironv1.MachineRunning, kaironv1.MachineStopping, kaironv1.MachineStopped, kaironv1.MachineFailed} {
		v.Phases = append(v.Phases, string(p))
	}
	// The node menu, for those who may list nodes.
	if s.mayRead(ctx, "", listNodes) == nil {
		nodes, err := s.nodes(ctx, f.Namespace)
		if err != nil {
			return "", nil, err
		}
		for _, n := range nodes {
			v.Nodes = append(v.Nodes, n.Name)
		}
	}
	return "Machines", v, nil
}

type machineDetail struct {
	Machine
	Events []Event
	// Migrate: show the migrate action (on, and the user may create
	// MachineMigrations here); Targets are the nodes to offer.
	Migrate bool
	Targets []string
}

func (s *Server) machinePage(ctx context.Context, r *http.Request) (string, any, error) {
	key := types.NamespacedName{Namespace: r.PathValue("namespace"), Name: r.PathValue("name")}
	if err := s.mayRead(ctx, key.Namespace, getMachines); err != nil {
		return "", nil, err
	}
	var m kaironv1.Machine
	if err := s.cache.Get(ctx, key, &m); err != nil {
		return "", nil, err
	}
	d := machineDetail{Machine: machineView(&m), Events: []Event{}}
	if s.mayRead(ctx, key.Namespace, listEvents) == nil {
		evs, err := s.events(ctx, key.Namespace, 50, func(e *eventsv1.Event) bool {
			return e.Regarding.Kind == "Machine" && e.Regarding.Name == key.Name ||
				e.Related != nil && e.Related.Kind == "Machine" && e.Related.Name == key.Name
		})
		if err != nil {
			return "", nil, err
		}
		d.Events = evs
	}
	d.Migrate = m.Spec.NodeName != "" && s.mayDo(ctx, createMigrations, key.Namespace)
	if d.Migrate && s.mayRead(ctx, "", listNodes) == nil {
		nodes, err := s.nodes(ctx, key.Namespace)
		if err != nil {
			return "", nil, err
		}
		for _, n := range nodes {
			if n.Name != m.Spec.NodeName {
				d.Targets = append(d.Targets, n.Name)
			}
		}
	}
	return fmt.Sprintf("Machine %s/%s", key.Namespace, key.Name), d, nil
}

// nodesView is the Nodes page; Evacuate: show the evacuate action (on, and
// the user may create MachineMigrations in every namespace, as evacuating
// a node does).
type nodesView struct {
	Nodes    []Node
	Evacuate bool
	// Evacuations are the user's evacuations until empty, newest first.
	Evacuations []EvacuationJob
}

func (s *Server) nodesPage(ctx context.Context, r *http.Request) (string, any, error) {
	ns := r.URL.Query().Get("namespace")
	if err := s.mayRead(ctx, ns, listNodes, listMachines); err != nil {
		return "", nil, err
	}
	nodes, err := s.nodes(ctx, ns)
	return "Nodes", nodesView{Nodes: nodes, Evacuate: s.mayDo(ctx, createMigrations, ""), Evacuations: s.evacuations.of(userOf(ctx))}, err
}

type poolsView struct {
	Pools  []Pool
	Claims []Claim
	Bind   bindHistogram
	// Scale has the namespaces whose pools the user may scale (when
	// actions are on); AnyScale: some.
	Scale    map[string]bool
	AnyScale bool
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
	if err := s.mayRead(ctx, ns, listPools, listClaims); err != nil {
		return "", nil, err
	}
	pools, err := s.pools(ctx, ns)
	if err != nil {
		return "", nil, err
	}
	claims, err := s.claims(ctx, ns)
	v := poolsView{Pools: pools, Claims: claims, Bind: bindHistogramOf(claims), Scale: map[string]bool{}}
	for _, p := range pools {
		if _, seen := v.Scale[p.Namespace]; !seen {
			v.Scale[p.Namespace] = s.mayDo(ctx, patchPoolScale, p.Namespace)
			v.AnyScale = v.AnyScale || v.Scale[p.Namespace]
		}
	}
	return "Pools and claims", v, err
}

// migrationsView is one page of the Migrations page.
type migrationsView struct {
	Migrations []Migration
	Pager      pager
}

func (s *Server) migrationsPage(ctx context.Context, r *http.Request) (string, any, error) {
	ns := r.URL.Query().Get("namespace")
	pr, err := pageRequestOf(r, DefaultPageSize)
	if err != nil {
		return "", nil, badRequest{err}
	}
	if err := s.mayRead(ctx, ns, listMigrations); err != nil {
		return "", nil, err
	}
	migs, err := s.migrations(ctx, ns)
	if err != nil {
		return "", nil, err
	}
	page, next, before := pageOf(migs, pr)
	return "Migrations", migrationsView{Migrations: page, Pager: pagerOf(r, len(page), before, len(migs), next)}, nil
}

func (s *Server) policiesPage(ctx context.Context, r *http.Request) (string, any, error) {
	ns := r.URL.Query().Get("namespace")
	if err := s.mayRead(ctx, ns, listPolicies); err != nil {
		return "", nil, err
	}
	ps, err := s.policies(ctx, ns)
	return "Network policies", ps, err
}
