package ui_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
	"github.com/zyvor/kairon/internal/ui"
)

// TestBrowserEvacuateUntilEmpty: "Keep going until the node is empty" on
// the Nodes page, with a budget that lets 2 of the node's 4 Machines go at
// a time and migrations run to completion by the test: the server makes
// passes as migrations finish, never more than 2 in flight, and the page
// shows the progress live until the node is empty, without a reload.
func TestBrowserEvacuateUntilEmpty(t *testing.T) {
	env := testenv.Get(t)
	b := newBrowser(t)
	url := startUIWith(t, env.Config, ui.Options{AllowWrite: true, EvacuatePoll: time.Second})
	ns := env.Namespace(t)
	node, target := "ui-drain-"+ns[len(ns)-5:], "ui-dest-"+ns[len(ns)-5:]
	kaironNode(t, env, node, true)
	kaironNode(t, env, target, false)
	sel := map[string]string{"ui-until-empty": ns}
	for i := 1; i <= 4; i++ {
		machine(t, env, ns, fmt.Sprintf("web-%d", i), node, kaironv1.MachineRunning, sel)
	}
	// 4 healthy, 2 must stay: 2 may go at a time.
	budget(t, env, ns, "web", sel, ptr.To(intstr.FromInt32(2)), nil)
	stop := testenv.RunMigrations(t, env, ns, target, 700*time.Millisecond)
	stopped := false
	defer func() {
		if !stopped {
			stop()
		}
	}()

	row := fmt.Sprintf(`tr[data-name=%q]`, node)
	b.open(t, url+"/nodes", "nodes-before-until-empty")
	b.waitFor(t, "the node's 4 Machines", fmt.Sprintf(`document.querySelector(%q)?.children[5]?.textContent === "4"`, row))
	b.eval(t, `window.kaironNoReload = true`)
	panel := "#evacuate-" + node
	// Opened, ticked and submitted in one evaluation: the page updates the
	// node's row live, and a click between two of chromedp's steps found
	// the element it had queried replaced ("Could not find node with given
	// id").
	if !b.eval(t, fmt.Sprintf(`(() => {
		const p = document.querySelector(%q);
		if (!p) return false;
		if (!p.open) p.querySelector("summary").click();
		const box = document.getElementById(%q);
		if (!box.checked) box.click();
		p.querySelector('button[type="submit"]').click();
		return box.checked;
	})()`, panel, "until-empty-"+node)) {
		t.Fatalf("evacuating %s until empty: no evacuate panel, or its until-empty box would not tick", node)
	}
	b.waitFor(t, "the first pass's result", `document.getElementById("action-result").className === "done"`)
	if got := b.text(t, "#action-result"); !strings.Contains(got, "2 migrations created") || !strings.Contains(got, "keeps going until "+node+" is empty") {
		t.Errorf("the first pass says %q", got)
	}
	job := fmt.Sprintf(`section.evacuation[data-node=%q]`, node)
	b.waitFor(t, "the evacuation's progress on the page", fmt.Sprintf(`document.querySelector(%q) !== null`, job))
	b.screenshot(t, "nodes-evacuating-until-empty")
	ctx, cancel := context.WithTimeout(b.ctx, 90*time.Second)
	defer cancel()
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](fmt.Sprintf(`document.querySelector('%s[data-state="Empty"]') !== null`, job), chromedp.WithPollingTimeout(90*time.Second))); err != nil {
		t.Fatalf("waiting for the page to say the node is empty: %v; it says %q", err, b.text(t, job))
	}
	b.waitFor(t, "the node row to count 0 Machines", fmt.Sprintf(`document.querySelector(%q)?.children[5]?.textContent === "0"`, row))
	b.screenshot(t, "nodes-evacuated-until-empty")
	if got := b.text(t, job); !strings.Contains(got, "node "+node+" is empty") || !strings.Contains(got, "4 migrations created") {
		t.Errorf("the finished evacuation says %q", got)
	}
	if !b.eval(t, `window.kaironNoReload === true`) {
		t.Error("the Nodes page was reloaded")
	}
	stopped = true
	if peak := stop(); peak > 2 {
		t.Errorf("%d migrations were in flight at once; the budget allows 2", peak)
	}
	var migs kaironv1.MachineMigrationList
	if err := env.Client.List(context.Background(), &migs, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	moved := map[string]bool{}
	for _, m := range migs.Items {
		if m.Labels[kaironv1.LabelEvacuatedNode] != node || m.Status.Phase != kaironv1.MigrationSucceeded || moved[m.Spec.MachineName] {
			t.Errorf("migration %s of %s: labels %v, phase %s", m.Name, m.Spec.MachineName, m.Labels, m.Status.Phase)
		}
		moved[m.Spec.MachineName] = true
	}
	if len(moved) != 4 {
		t.Errorf("migrations for %v, want each of the 4 Machines once", moved)
	}
	if errs := b.consoleErrors(); len(errs) > 0 {
		t.Errorf("the pages logged errors:\n%s", strings.Join(errs, "\n"))
	}
}

// evacuationsNow is GET /api/v1/evacuations.
func evacuationsNow(t *testing.T, url string) []ui.EvacuationJob {
	t.Helper()
	var l ui.List[ui.EvacuationJob]
	getJSON(t, url+"/api/v1/evacuations", http.StatusOK, &l)
	return l.Items
}

func findJob(jobs []ui.EvacuationJob, id string) *ui.EvacuationJob {
	for i := range jobs {
		if jobs[i].ID == id {
			return &jobs[i]
		}
	}
	return nil
}

// TestEvacuateUntilEmptyStops: an evacuation until empty stops as Stuck,
// saying why, when the budgets let nothing move and nothing is in flight;
// a second one of a node being evacuated is refused; Cancel stops one.
func TestEvacuateUntilEmptyStops(t *testing.T) {
	env := testenv.Get(t)
	url := startUIWith(t, env.Config, ui.Options{AllowWrite: true, EvacuatePoll: 200 * time.Millisecond, EvacuateStuckAfter: 2 * time.Second})
	ns := env.Namespace(t)
	suffix := ns[len(ns)-5:]
	held, moving := "ui-held-"+suffix, "ui-moving-"+suffix
	kaironNode(t, env, held, true)
	kaironNode(t, env, moving, true)
	for i := 1; i <= 2; i++ {
		machine(t, env, ns, fmt.Sprintf("db-%d", i), held, kaironv1.MachineRunning, map[string]string{"tier": "db"})
		machine(t, env, ns, fmt.Sprintf("web-%d", i), moving, kaironv1.MachineRunning, map[string]string{"tier": "web"})
	}
	// db: both must stay. web: 1 may go.
	budget(t, env, ns, "db", map[string]string{"tier": "db"}, ptr.To(intstr.FromInt32(2)), nil)
	budget(t, env, ns, "web", map[string]string{"tier": "web"}, ptr.To(intstr.FromInt32(1)), nil)

	evacuate := func(node string) (int, ui.Evacuation, string) {
		code, body := (call{method: http.MethodPost, path: "/api/v1/actions/evacuate", body: ui.EvacuateRequest{Node: node, UntilEmpty: true}}).do(t, url)
		var res ui.Evacuation
		if code == http.StatusOK {
			if err := json.Unmarshal([]byte(body), &res); err != nil {
				t.Fatal(err)
			}
		}
		return code, res, body
	}

	// Held: nothing may move, nothing is in flight: Stuck, with the budget.
	code, res, body := evacuate(held)
	if code != http.StatusOK || res.Job == nil || len(res.Created) != 0 || len(res.Skipped) != 2 || res.Job.State != ui.EvacuationRunning {
		t.Fatalf("evacuating %s until empty: %d %s", held, code, body)
	}
	var stuck *ui.EvacuationJob
	testenv.Eventually(t, 30*time.Second, "the evacuation of "+held+" to stop as Stuck", func() (bool, string) {
		stuck = findJob(evacuationsNow(t, url), res.Job.ID)
		return stuck != nil && stuck.State != ui.EvacuationRunning, fmt.Sprintf("%+v", stuck)
	})
	if stuck.State != ui.EvacuationStuck || !strings.Contains(stuck.Reason, "nothing can move") ||
		!strings.Contains(stuck.Reason, ns+"/db-1: budget "+ns+"/db allows no more disruptions") || stuck.FinishedAt == nil || stuck.Remaining != 2 {
		t.Errorf("the held evacuation ended %s: %q (%+v)", stuck.State, stuck.Reason, stuck)
	}

	// Moving: 1 migration in flight that nothing completes: it runs on;
	// a second evacuation of the node is refused; Cancel stops it.
	code, res, body = evacuate(moving)
	if code != http.StatusOK || res.Job == nil || len(res.Created) != 1 {
		t.Fatalf("evacuating %s until empty: %d %s", moving, code, body)
	}
	if code, _, body := evacuate(moving); code != http.StatusConflict || !strings.Contains(body, "already being evacuated until empty") {
		t.Errorf("a second evacuation of %s: %d %s, want 409", moving, code, body)
	}
	testenv.Eventually(t, 30*time.Second, "a later pass to see the migration in flight", func() (bool, string) {
		j := findJob(evacuationsNow(t, url), res.Job.ID)
		return j != nil && j.Passes >= 2 && j.Last != nil && len(j.Last.InFlight) == 1, fmt.Sprintf("%+v", j)
	})
	if j := findJob(evacuationsNow(t, url), res.Job.ID); j.State != ui.EvacuationRunning {
		t.Errorf("with a migration in flight the evacuation stopped: %s %q", j.State, j.Reason)
	}
	code, body = (call{method: http.MethodPost, path: "/api/v1/actions/evacuate-cancel", body: ui.CancelEvacuationRequest{ID: res.Job.ID}}).do(t, url)
	if code != http.StatusOK || !strings.Contains(body, `"state":"Cancelled"`) {
		t.Errorf("cancelling: %d %s", code, body)
	}
	if j := findJob(evacuationsNow(t, url), res.Job.ID); j == nil || j.State != ui.EvacuationCancelled || j.FinishedAt == nil {
		t.Errorf("after Cancel: %+v", j)
	}
	// Cancelled, it makes no more passes: the migration it left in
	// flight is the only one.
	if n := migrationCount(t, env, ns); n != 1 {
		t.Errorf("%d migrations, want the 1 the cancelled evacuation created", n)
	}
	if code, body := (call{method: http.MethodPost, path: "/api/v1/actions/evacuate-cancel", body: ui.CancelEvacuationRequest{ID: "nope"}}).do(t, url); code != http.StatusNotFound {
		t.Errorf("cancelling an unknown evacuation: %d %s", code, body)
	}
}
