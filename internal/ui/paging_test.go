package ui_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
	"github.com/zyvor/kairon/internal/ui"
)

// TestAPIPaging walks /api/v1/machines page by page over known Machines:
// every Machine exactly once, in namespace/name order, with none lost when
// a Machine of an earlier page is deleted between two pages; a continue
// token that was edited, or is used with other filters, is refused with
// 400, as is a bad limit.
func TestAPIPaging(t *testing.T) {
	env := testenv.Get(t)
	base := startUI(t, env)
	ns := env.Namespace(t)
	const total = 23
	var want []string
	for i := range total {
		name := fmt.Sprintf("vm-%02d", i)
		phase := kaironv1.MachineRunning
		if i%3 == 0 {
			phase = kaironv1.MachineBooting
		}
		machine(t, env, ns, name, "", phase, nil)
		want = append(want, name)
	}
	list := base + "/api/v1/machines?namespace=" + ns
	testenv.Eventually(t, 30*time.Second, "the UI's cache to hold the 23 Machines", func() (bool, string) {
		var l ui.List[ui.Machine]
		getJSON(t, list, http.StatusOK, &l)
		return l.Total == total && len(l.Items) == total && l.Continue == "", fmt.Sprintf("total %d, %d items", l.Total, len(l.Items))
	})

	// Pages of 5: 5+5+5+5+3, each naming the next.
	var got []string
	var tokens []string
	next := ""
	for pages := 0; ; pages++ {
		if pages > total {
			t.Fatalf("more pages than Machines: %v", got)
		}
		u := list + "&limit=5"
		if next != "" {
			u += "&continue=" + url.QueryEscape(next)
		}
		var l ui.List[ui.Machine]
		getJSON(t, u, http.StatusOK, &l)
		if l.Total != total {
			t.Errorf("page %d: total %d, want %d", pages, l.Total, total)
		}
		if len(l.Items) > 5 || len(l.Items) == 0 {
			t.Fatalf("page %d has %d items", pages, len(l.Items))
		}
		for _, m := range l.Items {
			got = append(got, m.Name)
		}
		if l.Continue == "" {
			break
		}
		next = l.Continue
		tokens = append(tokens, next)
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("paged through\n%v\nwant\n%v", got, want)
	}
	if len(tokens) != 4 {
		t.Errorf("%d continue tokens for 23 Machines in pages of 5, want 4", len(tokens))
	}

	// The last Machine of the first page is deleted: the second page
	// still starts right after it (a position is a key, not an index).
	if err := env.Client.Delete(context.Background(), &kaironv1.Machine{ObjectMeta: metaOf(ns, "vm-04")}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "vm-04 to leave the UI's cache", func() (bool, string) {
		var l ui.List[ui.Machine]
		getJSON(t, list, http.StatusOK, &l)
		return l.Total == total-1, fmt.Sprint(l.Total)
	})
	var second ui.List[ui.Machine]
	getJSON(t, list+"&limit=5&continue="+url.QueryEscape(tokens[0]), http.StatusOK, &second)
	if names := machineNames(second.Items); names != "vm-05 vm-06 vm-07 vm-08 vm-09" {
		t.Errorf("the second page after vm-04 was deleted: %s", names)
	}

	// Filters page too, and a token is bound to its filters.
	var booting ui.List[ui.Machine]
	getJSON(t, list+"&phase=Booting&limit=3", http.StatusOK, &booting)
	if names := machineNames(booting.Items); names != "vm-00 vm-03 vm-06" || booting.Total != 8 || booting.Continue == "" {
		t.Errorf("Booting, first 3: %s of %d, continue %q", names, booting.Total, booting.Continue)
	}
	getJSON(t, list+"&phase=Booting&limit=10&continue="+url.QueryEscape(booting.Continue), http.StatusOK, &booting)
	if names := machineNames(booting.Items); names != "vm-09 vm-12 vm-15 vm-18 vm-21" || booting.Continue != "" {
		t.Errorf("Booting, the rest: %s, continue %q", names, booting.Continue)
	}

	// An empty filter is no filter: the token of the unfiltered list
	// goes on with the filter form's empty fields.
	var withEmpty ui.List[ui.Machine]
	getJSON(t, list+"&phase=&node=&labelSelector=&limit=5&continue="+url.QueryEscape(tokens[0]), http.StatusOK, &withEmpty)
	if names := machineNames(withEmpty.Items); names != "vm-05 vm-06 vm-07 vm-08 vm-09" {
		t.Errorf("the second page with empty filters: %s", names)
	}

	tok := tokens[1]
	tampered := []struct{ what, query string }{
		{"another filter", list + "&phase=Running&continue=" + url.QueryEscape(tok)},
		{"another namespace", base + "/api/v1/machines?continue=" + url.QueryEscape(tok)},
		{"another endpoint", base + "/api/v1/migrations?namespace=" + ns + "&continue=" + url.QueryEscape(tok)},
		{"an edited position", list + "&continue=" + url.QueryEscape(editPosition(t, tok, ns+"\x00vm-20"))},
		{"an edited digest", list + "&continue=" + url.QueryEscape(tok[:len(tok)-2]+flip(tok[len(tok)-2:]))},
		{"garbage", list + "&continue=not-a-token"},
		{"limit 0", list + "&limit=0"},
		{"limit too big", list + fmt.Sprintf("&limit=%d", ui.MaxPageSize+1)},
		{"limit not a number", list + "&limit=ten"},
	}
	for _, tc := range tampered {
		var e map[string]string
		getJSON(t, tc.query, http.StatusBadRequest, &e)
		if !strings.Contains(e["error"], "invalid") {
			t.Errorf("%s: error %q", tc.what, e["error"])
		}
	}

	// The Migrations page pages too.
	for _, name := range []string{"mig-a", "mig-b"} {
		env.Create(t, &kaironv1.MachineMigration{ObjectMeta: metaOf(ns, name), Spec: kaironv1.MachineMigrationSpec{MachineName: "vm-01", Strategy: kaironv1.MigrationCold}})
	}
	testenv.Eventually(t, 30*time.Second, "the Migrations page to show 1 of the 2 migrations and a next page", func() (bool, string) {
		code, body := (call{path: "/migrations?namespace=" + ns + "&limit=1"}).do(t, base)
		return code == http.StatusOK && strings.Contains(body, "MachineMigrations 1–1 of 2") && strings.Contains(body, `class="next"`) && strings.Contains(body, `data-name="mig-a"`) && !strings.Contains(body, `data-name="mig-b"`), body
	})

	// Every list endpoint pages; without a limit the default page size.
	for _, path := range []string{"nodes", "machine-pools", "machine-claims", "migrations", "network-policies", "disruption-budgets"} {
		var l ui.List[map[string]any]
		getJSON(t, base+"/api/v1/"+path+"?limit=1", http.StatusOK, &l)
		if len(l.Items) > 1 || l.Total > 1 && l.Continue == "" {
			t.Errorf("%s?limit=1: %d items of %d, continue %q", path, len(l.Items), l.Total, l.Continue)
		}
	}
}

// editPosition returns tok with its position replaced by after, and the
// digest kept.
func editPosition(t *testing.T, tok, after string) string {
	t.Helper()
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		t.Fatalf("continue token %q is not v1.POSITION.DIGEST", tok)
	}
	return parts[0] + "." + base64URL(after) + "." + parts[2]
}

func flip(s string) string {
	if s[0] == 'A' {
		return "B" + s[1:]
	}
	return "A" + s[1:]
}

// TestBrowserPaging: the Machines page with a page size shows its first
// page and a next page link that keeps the filters; the next page shows
// the following Machines, still updates live, and links back to the first.
func TestBrowserPaging(t *testing.T) {
	env := testenv.Get(t)
	b := newBrowser(t)
	base := startUI(t, env)
	ns := env.Namespace(t)
	for i := range 7 {
		machine(t, env, ns, fmt.Sprintf("vm-%02d", i), "", kaironv1.MachineRunning, map[string]string{"paging": "yes"})
	}
	machine(t, env, ns, "unlabelled", "", kaironv1.MachineRunning, nil)
	b.open(t, base+"/machines?namespace="+ns+"&labelSelector=paging%3Dyes&limit=3", "machines-paged")
	b.waitFor(t, "the first page of 3 of the 7 labelled Machines", `document.getElementById("machines-count")?.dataset.total === "7"`)
	if got := b.text(t, "#machines-count"); got != "Machines 1–3 of 7" {
		t.Errorf("first page says %q", got)
	}
	if got := rowNames(t, b); got != "vm-00 vm-01 vm-02" {
		t.Errorf("first page rows: %s", got)
	}
	b.follow(t, "following the next page link", "nav.pager a.next", `document.querySelector('#machines-count[data-from="4"]') !== null`)
	b.waitFor(t, "the event stream of the second page", `document.body.dataset.live === "connected"`)
	b.screenshot(t, "machines-page-2")
	if got := rowNames(t, b); got != "vm-03 vm-04 vm-05" {
		t.Errorf("second page rows: %s", got)
	}
	if q := b.text(t, "#machines-count") + " " + locationSearch(t, b); !strings.Contains(q, "labelSelector=paging%3Dyes") || !strings.Contains(q, "limit=3") || !strings.Contains(q, "namespace="+ns) {
		t.Errorf("the next page lost the filters: %s", q)
	}
	// Live on a paged page: a Machine that sorts into this page shows up
	// (and pushes vm-05 to the next) without a reload.
	b.eval(t, `window.kaironNoReload = true`)
	machine(t, env, ns, "vm-03a", "", kaironv1.MachineBooting, map[string]string{"paging": "yes"})
	b.waitFor(t, "vm-03a on the second page", `document.querySelector('tr[data-name="vm-03a"]') !== null && document.getElementById("machines-count").dataset.total === "8"`)
	if got := rowNames(t, b); got != "vm-03 vm-03a vm-04" {
		t.Errorf("second page after vm-03a: %s", got)
	}
	if !b.eval(t, `window.kaironNoReload === true`) {
		t.Error("the page was reloaded")
	}
	b.follow(t, "following the first page link", "nav.pager a.first", `document.querySelector('#machines-count[data-from="1"]') !== null`)
	if q := locationSearch(t, b); strings.Contains(q, "continue") || !strings.Contains(q, "limit=3") {
		t.Errorf("the first page link: %s", q)
	}
	if errs := b.consoleErrors(); len(errs) > 0 {
		t.Errorf("the pages logged errors:\n%s", strings.Join(errs, "\n"))
	}
	// A tampered token is a 400 page, not another page.
	resp, err := http.Get(base + "/machines?namespace=" + ns + "&continue=v1.AAAA.BBBB")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("Machines page with a bad continue token: %s, want 400", resp.Status)
	}
}

func rowNames(t *testing.T, b *browser) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Evaluate[string](`Array.from(document.querySelectorAll("#machines tbody tr[data-name]")).map(r => r.dataset.name).join(" ")`))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func locationSearch(t *testing.T, b *browser) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Evaluate[string](`location.search`))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func metaOf(ns, name string) metav1.ObjectMeta { return metav1.ObjectMeta{Namespace: ns, Name: name} }

func base64URL(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
