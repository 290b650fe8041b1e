package ui_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/rules"
	"github.com/zyvor/kairon/internal/testenv"
	"github.com/zyvor/kairon/internal/ui"
)

// Environment variables of the browser tests.
const (
	// skipBrowserEnv=1 skips the browser tests when Chromium is missing;
	// without it a missing Chromium fails them.
	skipBrowserEnv = "KAIRON_SKIP_BROWSER_TESTS"
	// screenshotsEnv names a directory to save a screenshot of each page
	// in; without it they go to the test's temporary directory.
	screenshotsEnv = "KAIRON_UI_SCREENSHOTS"
)

// browser is one headless Chromium tab, and the console errors its pages
// logged.
type browser struct {
	ctx  context.Context
	mu   sync.Mutex
	errs []string
}

// newBrowser starts Debian's chromium headless, or fails (or skips, with
// KAIRON_SKIP_BROWSER_TESTS=1) when it is not installed.
func newBrowser(t *testing.T) *browser {
	t.Helper()
	path := ""
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			path = p
			break
		}
	}
	if path == "" {
		if os.Getenv(skipBrowserEnv) == "1" {
			t.Skip(skipBrowserEnv + "=1: chromium is not installed")
		}
		t.Fatal("chromium is not installed: run `make deps` (hack/install-deps.sh installs Debian's chromium), or set " + skipBrowserEnv + "=1 to skip the browser tests")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.UserDataDir(t.TempDir()),
		// Chromium makes its singleton socket's directory in TMPDIR and
		// leaves it there when it is killed: in the test's own, it goes
		// with the test.
		chromedp.Env("TMPDIR="+t.TempDir()),
		chromedp.WindowSize(1400, 1000),
		chromedp.DisableGPU,
	)
	if os.Geteuid() == 0 {
		// Chromium refuses to run as root with its sandbox.
		opts = append(opts, chromedp.NoSandbox)
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(allocCtx)
	b := &browser{ctx: ctx}
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
	})
	if err := chromedp.Listen(ctx, b.record); err != nil {
		t.Fatalf("starting chromium (%s): %v", path, err)
	}
	return b
}

// record keeps what a page logs as an error: console.error, uncaught
// exceptions, and browser log errors (failed requests).
func (b *browser) record(ev any) {
	var msg string
	switch ev := ev.(type) {
	case *runtime.EventConsoleAPICalled:
		if ev.Type == runtime.ConsoleAPICalledTypeError {
			var parts []string
			for _, a := range ev.Args {
				parts = append(parts, string(a.Value)+a.Description)
			}
			msg = "console.error: " + strings.Join(parts, " ")
		}
	case *runtime.EventExceptionThrown:
		msg = "exception: " + ev.ExceptionDetails.Text
		if ev.ExceptionDetails.Exception != nil {
			msg += " " + ev.ExceptionDetails.Exception.Description
		}
	case *log.EventEntryAdded:
		if ev.Entry.Level == log.EntryLevelError {
			msg = "log: " + ev.Entry.Text + " " + ev.Entry.URL
		}
	}
	if msg != "" {
		b.mu.Lock()
		b.errs = append(b.errs, msg)
		b.mu.Unlock()
	}
}

// consoleErrors returns and clears the errors logged so far.
func (b *browser) consoleErrors() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	errs := b.errs
	b.errs = nil
	return errs
}

// do runs actions with a deadline, failing t on error.
func (b *browser) do(t *testing.T, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// text waits for sel and returns its text. It is read in one JavaScript
// evaluation: a live update may replace the element between a query and a
// separate read, which then reads a detached node's nothing.
func (b *browser) text(t *testing.T, sel string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	type found struct {
		Text string `json:"text"`
	}
	f, err := chromedp.Run(ctx, chromedp.Poll[found](fmt.Sprintf(`(() => { const e = document.querySelector(%q); return e ? {text: e.innerText} : null; })()`, sel)))
	if err != nil {
		t.Fatalf("reading %s: %v", sel, err)
	}
	return strings.TrimSpace(f.Text)
}

func (b *browser) eval(t *testing.T, expr string) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[bool](expr))
	if err != nil {
		t.Fatalf("evaluating %s: %v", expr, err)
	}
	return v
}

// waitFor waits until the page's JavaScript expression is true.
func (b *browser) waitFor(t *testing.T, what, expr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](expr, chromedp.WithPollingTimeout(30*time.Second))); err != nil {
		t.Fatalf("waiting for %s (%s): %v", what, expr, err)
	}
}

// actionStarted is true once an action's form was submitted: its handler
// shows #action-result before it posts.
const actionStarted = `document.getElementById("action-result")?.hidden === false`

// press clicks sel with the mouse until done (a JavaScript expression) is
// true, running before ahead of each click. A live update replaces the
// whole #live region, so the node a click found may be gone by the time
// the mouse reaches it ("Could not find node with given id"), or the press
// and the release may land on two different nodes and click nothing:
// either way the click is tried again on the fresh node. done must turn
// true as soon as the click is handled (an action's form sets
// #action-result at once), so a click that worked is never repeated.
func (b *browser) press(t *testing.T, what, sel, done string, before ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	var lastErr error
	for {
		if ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](done)); err == nil && ok {
			return
		} else if err != nil {
			lastErr = err
		}
		if ctx.Err() != nil {
			t.Fatalf("%s: %s never became true; last error: %v", what, done, lastErr)
		}
		actions := append(append([]chromedp.Action[chromedp.Void]{}, before...), chromedp.Click(chromedp.CSS(sel), chromedp.NodeVisible))
		if err := chromedp.Do(ctx, actions...); err != nil {
			lastErr = err
			continue
		}
		// The click was delivered: give the page a moment to handle it
		// before looking again, so a slow handler is not clicked twice.
		pollCtx, cancelPoll := context.WithTimeout(ctx, 2*time.Second)
		_, err := chromedp.Run(pollCtx, chromedp.Poll[bool](done))
		cancelPoll()
		if err == nil {
			return
		}
		lastErr = err
	}
}

// follow clicks the link sel and waits until done is true on the page it
// leads to. Unlike press, it clicks only while the browser is still on the
// page it started from, checked in the same script that clicks: once it
// has left, the next page has a link of the same selector (the next
// page's "Next page"), and a click there would go one page too far. On a
// loaded machine the navigation alone can outlast press's pause between
// clicks. The link is clicked again if the page stays (a live update
// replaced the link under the click).
func (b *browser) follow(t *testing.T, what, sel, done string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	from, err := chromedp.Run(ctx, chromedp.Evaluate[string](`location.href`))
	if err != nil {
		t.Fatalf("%s: reading the page's address: %v", what, err)
	}
	clickIfStill := fmt.Sprintf(`(() => {
		if (location.href !== %q) return "left";
		const a = document.querySelector(%q);
		if (!a) return "no link";
		a.click();
		return "clicked";
	})()`, from, sel)
	left := fmt.Sprintf(`location.href !== %q`, from)
	for {
		state, err := chromedp.Run(ctx, chromedp.Evaluate[string](clickIfStill))
		if err == nil && state == "left" {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("%s: still on %s after clicking %s (%s, %v)", what, from, sel, state, err)
		}
		// Clicked, between two documents, or the link not there yet:
		// give the navigation a moment before looking again.
		pollCtx, cancelPoll := context.WithTimeout(ctx, 2*time.Second)
		_, _ = chromedp.Run(pollCtx, chromedp.Poll[bool](left))
		cancelPoll()
	}
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](done)); err != nil {
		at, _ := chromedp.Run(b.ctx, chromedp.Evaluate[string](`location.href`))
		t.Fatalf("%s: %s never became true on %s, reached from %s: %v", what, done, at, from, err)
	}
}

// openPanel opens the action panel details (a <details> element) by
// clicking its summary, again if a live update swallowed the click.
func (b *browser) openPanel(t *testing.T, details string) {
	t.Helper()
	b.press(t, "opening "+details, details+" summary", fmt.Sprintf(`document.querySelector(%q)?.open === true`, details))
}

// open loads a page, waits for its live updates to connect, and saves a
// screenshot of it.
func (b *browser) open(t *testing.T, url, shot string) {
	t.Helper()
	b.do(t, "loading "+url, chromedp.Navigate(url), chromedp.WaitVisible(chromedp.CSS("#live")))
	b.waitFor(t, url+" to connect its event stream", `document.body.dataset.live === "connected"`)
	b.screenshot(t, shot)
}

// screenshot saves the page as it is now in $KAIRON_UI_SCREENSHOTS (or the
// test's temporary directory) as shot.png.
func (b *browser) screenshot(t *testing.T, shot string) {
	t.Helper()
	dir := os.Getenv(screenshotsEnv)
	if dir == "" {
		dir = t.TempDir()
	}
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", shot, err)
	}
	if err := os.WriteFile(filepath.Join(dir, shot+".png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestBrowser drives every page in headless Chromium: no page logs a
// console error, the budgets page shows the shared budget code's numbers
// and receipts, and objects created after a page loaded appear on it
// without a reload.
func TestBrowser(t *testing.T) {
	env := testenv.Get(t)
	b := newBrowser(t)
	url := startUI(t, env)
	ns := env.Namespace(t)
	sel := map[string]string{"ui-browser": ns}
	machine(t, env, ns, "web-1", "", kaironv1.MachineRunning, sel)
	machine(t, env, ns, "web-2", "", kaironv1.MachineBooting, sel)
	machine(t, env, ns, "web-3", "", kaironv1.MachineRunning, sel)
	budget(t, env, ns, "web", sel, ptr.To(intstr.FromInt32(2)), nil)

	// The budgets page, once the UI's cache has the three Machines.
	row := "#budget-" + ns + "-web"
	b.open(t, url+"/budgets?namespace="+ns, "budgets")
	// Each Machine is created, then its phase set: wait for both to reach
	// the UI's cache (3 matching, 2 of them healthy), not only the count.
	b.waitFor(t, "the budget to count 3 Machines, 2 healthy", fmt.Sprintf(`document.querySelector(%q)?.querySelector("td.expected")?.textContent === "3" && document.querySelector(%q)?.querySelector("td.healthy")?.textContent === "2"`, row, row))
	checkBudgetRow := func() {
		t.Helper()
		s := rules.FindBudgetState(budgetsNow(t, env), ns, "web")
		for cell, want := range map[string]int32{"expected": s.ExpectedMachines, "healthy": s.CurrentHealthy, "desired": s.DesiredHealthy, "allowed": s.DisruptionsAllowed} {
			if got := b.text(t, row+" td."+cell); got != fmt.Sprint(want) {
				t.Errorf("budget web %s: page shows %s, shared code %d", cell, got, want)
			}
		}
		if got := b.text(t, "#receipts-"+ns+"-web .summary"); got != rules.BudgetSummary(s) {
			t.Errorf("budget web summary: page %q, shared code %q", got, rules.BudgetSummary(s))
		}
		receipts := b.text(t, "#receipts-"+ns+"-web ul")
		for _, m := range s.Machines {
			want := m.Name + " healthy"
			if !m.Healthy {
				want = m.Name + " NOT healthy (" + m.Reason + ")"
			}
			if !strings.Contains(receipts, want) {
				t.Errorf("budget web receipts %q lack %q", receipts, want)
			}
		}
	}
	checkBudgetRow()
	if got := b.text(t, row+" td.allowed"); got != "0" {
		t.Errorf("3 matching, 2 healthy, 2 desired: allowed %s, want 0", got)
	}

	// A fourth Machine, created after the page loaded, changes the numbers
	// in place: the page is not reloaded (the marker set on window stays).
	b.eval(t, `window.kaironNoReload = true`)
	machine(t, env, ns, "web-4", "", kaironv1.MachineRunning, sel)
	b.waitFor(t, "the budget page to count web-4, Running", fmt.Sprintf(`document.querySelector(%q)?.querySelector("td.expected")?.textContent === "4" && document.querySelector(%q)?.querySelector("td.healthy")?.textContent === "3"`, row, row))
	if !b.eval(t, `window.kaironNoReload === true`) {
		t.Fatal("the budgets page was reloaded")
	}
	checkBudgetRow()
	if got := b.text(t, row+" td.allowed"); got != "1" {
		t.Errorf("4 matching, 3 healthy, 2 desired: allowed %s, want 1", got)
	}

	// The Machines page: a Machine created after it loaded appears.
	b.open(t, url+"/machines?namespace="+ns, "machines")
	b.eval(t, `window.kaironNoReload = true`)
	machine(t, env, ns, "late-1", "", "", nil)
	b.do(t, "waiting for late-1 on the Machines page", chromedp.WaitVisible(chromedp.CSS(`tr[data-name="late-1"]`)))
	if !b.eval(t, `window.kaironNoReload === true`) {
		t.Fatal("the Machines page was reloaded")
	}
	b.press(t, "opening late-1's page", `tr[data-name="late-1"] a`, `document.getElementById("phase") !== null`)

	// Every page renders without a console error; first prove an error
	// would be seen.
	b.eval(t, `console.error("kairon-ui self-check"), true`)
	testenv.Eventually(t, 10*time.Second, "the test to see a console.error", func() (bool, string) {
		b.mu.Lock()
		defer b.mu.Unlock()
		return strings.Contains(strings.Join(b.errs, "\n"), "kairon-ui self-check"), strings.Join(b.errs, "; ")
	})
	b.consoleErrors()
	for _, p := range []struct{ path, shot string }{
		{"/", "overview"}, {"/nodes", "nodes"}, {"/machines", "machines-all"}, {"/machines/" + ns + "/web-1", "machine"},
		{"/pools", "pools"}, {"/budgets", "budgets-all"}, {"/migrations", "migrations"}, {"/network-policies", "network-policies"},
	} {
		b.open(t, url+p.path, p.shot)
	}
	if errs := b.consoleErrors(); len(errs) > 0 {
		t.Errorf("the pages logged errors:\n%s", strings.Join(errs, "\n"))
	}
}

// signIn loads page, which sends a browser without a token to the login
// page, signs in there with token and waits for page's ready element.
func (b *browser) signIn(t *testing.T, page, token, ready string) {
	t.Helper()
	b.do(t, "loading "+page, chromedp.Navigate(page), chromedp.WaitVisible(chromedp.CSS("#token")))
	b.screenshot(t, "login")
	b.do(t, "signing in", chromedp.SetValue(chromedp.CSS("#token"), token), chromedp.Click(chromedp.CSS(`form.login button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS(ready)))
}

// TestBrowserEvacuate signs in at the login page with a ServiceAccount's
// token (kairon-ui with --auth token --allow-write), evacuates a node from
// the Nodes page, and checks that the MachineMigrations created are the
// ones the budget allows and that the page lists the Machines it held back,
// with the budget's reason. Without --allow-write the page has no action.
func TestBrowserEvacuate(t *testing.T) {
	env := testenv.Get(t)
	b := newBrowser(t)
	url := startUIWith(t, env.Config, ui.Options{Auth: ui.AuthToken, AllowWrite: true})
	ns := env.Namespace(t)
	node := "ui-evac-" + ns[len(ns)-5:]
	kaironNode(t, env, node, true)
	sel := map[string]string{"ui-evacuate": ns}
	for i := 1; i <= 5; i++ {
		machine(t, env, ns, fmt.Sprintf("web-%d", i), node, kaironv1.MachineRunning, sel)
	}
	// 5 healthy, 3 must stay: 2 may go.
	budget(t, env, ns, "web", sel, ptr.To(intstr.FromInt32(3)), nil)
	operator := serviceAccount(t, env, ns, "operator")
	grantCluster(t, env, ns, "operator", operatorRules)

	// Without a token the Nodes page sends the browser to the login page.
	b.signIn(t, url+"/nodes", operator, "table#nodes")
	row := fmt.Sprintf(`tr[data-name=%q]`, node)
	b.waitFor(t, "the Nodes page as the operator, with the node's 5 Machines", fmt.Sprintf(
		`location.pathname === "/nodes" && document.querySelector(%q)?.children[5]?.textContent === "5"`, row))
	b.waitFor(t, "the event stream", `document.body.dataset.live === "connected"`)
	if who := b.text(t, "#user"); who != "system:serviceaccount:"+ns+":operator" {
		t.Errorf("signed in as %q", who)
	}

	// Evacuate: open the panel, press the button.
	panel := "#evacuate-" + node
	b.openPanel(t, panel)
	b.press(t, "evacuating "+node, panel+` button[type="submit"]`, actionStarted)
	b.waitFor(t, "the evacuation's result", `document.getElementById("action-result").className === "done"`)
	b.screenshot(t, "nodes-evacuated")

	var migs kaironv1.MachineMigrationList
	if err := env.Client.List(context.Background(), &migs, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var moved []string
	for _, m := range migs.Items {
		if m.Labels[kaironv1.LabelEvacuatedNode] != node {
			t.Errorf("migration %s lacks the evacuated-node label: %v", m.Name, m.Labels)
		}
		moved = append(moved, m.Spec.MachineName)
	}
	if len(moved) != 2 {
		t.Fatalf("the evacuation created migrations for %v, want 2 (the budget allows 2 of 5)", moved)
	}
	created := b.text(t, "#action-result ul.created")
	for _, m := range moved {
		if !strings.Contains(created, ns+"/"+m) {
			t.Errorf("the page's created list %q lacks %s", created, m)
		}
	}
	if n := b.eval(t, `document.querySelectorAll("#action-result ul.skipped li").length === 3`); !n {
		t.Errorf("the page lists skipped: %q, want 3 Machines", b.text(t, "#action-result"))
	}
	skipped := b.text(t, "#action-result ul.skipped")
	for i := 1; i <= 5; i++ {
		name := fmt.Sprintf("web-%d", i)
		if !slices.Contains(moved, name) && !strings.Contains(skipped, ns+"/"+name+": budget "+ns+"/web allows no more disruptions") {
			t.Errorf("the page's skipped list %q lacks %s held back by budget %s/web", skipped, name, ns)
		}
	}
	if errs := b.consoleErrors(); len(errs) > 0 {
		t.Errorf("the pages logged errors:\n%s", strings.Join(errs, "\n"))
	}

	// Migrating a skipped Machine from its page: the budget, spent by the
	// evacuation, holds it back, and the page says so.
	var held string
	for i := 1; i <= 5 && held == ""; i++ {
		if name := fmt.Sprintf("web-%d", i); !slices.Contains(moved, name) {
			held = name
		}
	}
	b.open(t, url+"/machines/"+ns+"/"+held, "machine-migrate")
	b.openPanel(t, "#migrate")
	b.press(t, "migrating "+held, `#migrate-form button[type="submit"]`, actionStarted)
	b.waitFor(t, "the migration's refusal", `document.getElementById("action-result").className === "refused"`)
	if got := b.text(t, "#action-result"); !strings.Contains(got, "HTTP 409") || !strings.Contains(got, "machine "+ns+"/"+held+" not migrated: budget "+ns+"/web allows no more disruptions") {
		t.Errorf("migrating %s shows %q, want the budget's refusal", held, got)
	}
	if n := migrationCount(t, env, ns); n != 2 {
		t.Errorf("%d migrations after the refused migrate, want the evacuation's 2", n)
	}

	// Without --allow-write, the same page has no action.
	readOnly := startUIWith(t, env.Config, ui.Options{})
	b.open(t, readOnly+"/nodes", "nodes-read-only")
	b.waitFor(t, "the node on the read-only Nodes page", fmt.Sprintf(`document.querySelector(%q) !== null`, row))
	if b.eval(t, `document.querySelector("details.action, form[data-action]") !== null`) {
		t.Error("the Nodes page without --allow-write shows an action")
	}
}

// TestBrowserShowsRefusal: an action the API server refuses shows its
// message on the page exactly as the API server wrote it. The user may
// scale pools when the page loads (so it shows the Scale form), and loses
// that right before pressing it.
func TestBrowserShowsRefusal(t *testing.T) {
	env := testenv.Get(t)
	b := newBrowser(t)
	url := startUIWith(t, env.Config, ui.Options{Auth: ui.AuthToken, AllowWrite: true})
	ns := env.Namespace(t)
	pool := &kaironv1.MachinePool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "warm"},
		Spec: kaironv1.MachinePoolSpec{Replicas: ptr.To[int32](1), Template: kaironv1.MachineTemplateSpec{Spec: kaironv1.MachineSpec{CPU: 1, Memory: resource.MustParse("256Mi")}}}}
	env.Create(t, pool)
	scaler := serviceAccount(t, env, ns, "scaler")
	grantCluster(t, env, ns, "scaler", readRules)
	binding := grantClusterAs(t, env, ns+"-scaler-scale", ns, "scaler", []rbacv1.PolicyRule{{APIGroups: []string{kaironGroup}, Resources: []string{"machinepools/scale"}, Verbs: []string{"patch"}}})

	form := "#scale-" + ns + "-warm"
	b.signIn(t, url+"/pools?namespace="+ns, scaler, form)

	// The right goes; wait until the API server refuses the same patch.
	if err := env.Client.Delete(context.Background(), binding); err != nil {
		t.Fatal(err)
	}
	sc := tokenClient(t, env, scaler)
	var refusal string
	testenv.Eventually(t, 30*time.Second, "the API server to refuse scaling as scaler", func() (bool, string) {
		err := sc.SubResource("scale").Patch(context.Background(), pool.DeepCopy(), client.RawPatch(types.MergePatchType, []byte(`{"spec":{"replicas":5}}`)), client.DryRunAll)
		if err == nil {
			return false, "allowed"
		}
		refusal = err.Error()
		return apierrors.IsForbidden(err), refusal
	})

	b.press(t, "scaling warm to 5", form+" button", actionStarted, chromedp.SetValue(chromedp.CSS(form+" input[name=replicas]"), "5"))
	b.waitFor(t, "the refusal", `document.getElementById("action-result").className === "refused"`)
	b.screenshot(t, "pools-refused")
	if got := b.text(t, "#action-result .message"); got != refusal {
		t.Errorf("the page shows %q, want the API server's %q", got, refusal)
	}
	if got := b.text(t, "#action-result b"); !strings.Contains(got, "HTTP 403") {
		t.Errorf("the page says %q, want the API server's status 403", got)
	}
	var got kaironv1.MachinePool
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(pool), &got); err != nil || *got.Spec.Replicas != 1 {
		t.Errorf("pool warm after the refused scale: %v, replicas %v", err, got.Spec.Replicas)
	}
}
