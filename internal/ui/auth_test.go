package ui_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
	"github.com/zyvor/kairon/internal/ui"
)

const kaironGroup = "kairon.zyvor.dev"

// readRules may read everything the UI shows, in every namespace, and
// nothing more.
var readRules = []rbacv1.PolicyRule{
	{APIGroups: []string{kaironGroup}, Resources: []string{"machines", "machinepools", "machineclaims", "machinemigrations", "machinenetworkpolicies", "machinedisruptionbudgets"}, Verbs: []string{"get", "list", "watch"}},
	{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch"}},
	{APIGroups: []string{"events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"get", "list", "watch"}},
}

// operatorRules are readRules and the rights of the three actions.
var operatorRules = append([]rbacv1.PolicyRule{
	{APIGroups: []string{kaironGroup}, Resources: []string{"machinemigrations"}, Verbs: []string{"create"}},
	{APIGroups: []string{kaironGroup}, Resources: []string{"machinepools/scale"}, Verbs: []string{"get", "patch", "update"}},
}, readRules...)

// serviceAccount creates ServiceAccount ns/name and returns a token of it
// from the TokenRequest API.
func serviceAccount(t *testing.T, env *testenv.Env, ns, name string) string {
	t.Helper()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	env.Create(t, sa)
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}
	if err := env.Client.SubResource("token").Create(context.Background(), sa, tr); err != nil {
		t.Fatalf("token of %s/%s: %v", ns, name, err)
	}
	return tr.Status.Token
}

// grantCluster gives ServiceAccount ns/sa rules in every namespace; the
// ClusterRole and its binding go when the test ends.
func grantCluster(t *testing.T, env *testenv.Env, ns, sa string, rules []rbacv1.PolicyRule) {
	t.Helper()
	grantClusterAs(t, env, ns+"-"+sa, ns, sa, rules)
}

// grantClusterAs is grantCluster with the ClusterRole and binding named
// name; it returns the binding.
func grantClusterAs(t *testing.T, env *testenv.Env, name, ns, sa string, rules []rbacv1.PolicyRule) *rbacv1.ClusterRoleBinding {
	t.Helper()
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: ns, Name: sa}},
	}
	env.Create(t, role)
	env.Create(t, binding)
	t.Cleanup(func() {
		_ = env.Client.Delete(context.Background(), binding)
		_ = env.Client.Delete(context.Background(), role)
	})
	return binding
}

// grantNamespace gives ServiceAccount ns/sa rules in namespace ns only.
func grantNamespace(t *testing.T, env *testenv.Env, ns, sa string, rules []rbacv1.PolicyRule) {
	t.Helper()
	env.Create(t, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sa}, Rules: rules})
	env.Create(t, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sa},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: sa},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: ns, Name: sa}},
	})
}

// tokenClient is a client acting as the token, straight to the API server.
func tokenClient(t *testing.T, env *testenv.Env, token string) client.Client {
	t.Helper()
	cfg := rest.AnonymousClientConfig(env.Config)
	cfg.BearerToken = token
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// call is one request to the UI.
type call struct {
	method, path, token string
	body                any
	header              map[string]string
}

// do makes the call and returns the status and the body; a POST carries
// the header every action needs unless the call's header overrides it.
func (c call) do(t *testing.T, base string) (int, string) {
	t.Helper()
	var body io.Reader
	if c.body != nil {
		b, err := json.Marshal(c.body)
		if err != nil {
			t.Fatal(err)
		}
		body = strings.NewReader(string(b))
	}
	method := c.method
	if method == "" {
		method = http.MethodGet
	}
	req, err := http.NewRequest(method, base+c.path, body)
	if err != nil {
		t.Fatal(err)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if method == http.MethodPost {
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Kairon-UI", "1")
	}
	for k, v := range c.header {
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	resp, err := noRedirects.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

var noRedirects = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// apiError is the "error" of a JSON error body.
func apiError(t *testing.T, body string) string {
	t.Helper()
	var e struct {
		Error string `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error == "" {
		t.Fatalf("not a JSON error: %s", body)
	}
	return e.Error
}

func migrationCount(t *testing.T, env *testenv.Env, ns string) int {
	t.Helper()
	var migs kaironv1.MachineMigrationList
	if err := env.Client.List(context.Background(), &migs, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	return len(migs.Items)
}

// TestAuthToken runs kairon-ui with --auth token (its own identity the
// test's admin, which must lend nothing) and checks that each request acts
// as its own bearer token: no token or a bad one is 401, reads need the
// user's list right (a SelfSubjectAccessReview as the user) or are 403,
// action buttons show only for users who may do them, and an action a
// read-only user crafts by hand is refused by the API server, whose message
// comes back verbatim.
func TestAuthToken(t *testing.T) {
	env := testenv.Get(t)
	url := startUIWith(t, env.Config, ui.Options{Auth: ui.AuthToken, AllowWrite: true})
	ns, ns2 := env.Namespace(t), env.Namespace(t)
	node := "ui-auth-" + ns[len(ns)-5:]
	kaironNode(t, env, node, false)
	sel := map[string]string{"ui-auth": ns}
	machine(t, env, ns, "web-1", node, kaironv1.MachineRunning, sel)
	machine(t, env, ns2, "other-1", node, kaironv1.MachineRunning, sel)
	budget(t, env, ns, "web", sel, ptr.To(intstr.FromInt32(0)), nil)
	pool := &kaironv1.MachinePool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "warm"},
		Spec: kaironv1.MachinePoolSpec{Replicas: ptr.To[int32](1), Template: kaironv1.MachineTemplateSpec{Spec: kaironv1.MachineSpec{CPU: 1, Memory: resource.MustParse("256Mi")}}}}
	env.Create(t, pool)

	nobody := serviceAccount(t, env, ns, "nobody")
	nsReader := serviceAccount(t, env, ns, "ns-reader")
	grantNamespace(t, env, ns, "ns-reader", readRules[:1])
	reader := serviceAccount(t, env, ns, "reader")
	grantCluster(t, env, ns, "reader", readRules)
	operator := serviceAccount(t, env, ns, "operator")
	grantCluster(t, env, ns, "operator", operatorRules)

	// The cache has both Machines before anything is checked.
	var code int
	var body string
	testenv.Eventually(t, 30*time.Second, "the UI to list web-1 and other-1", func() (bool, string) {
		code, body := call{path: "/api/v1/machines?labelSelector=ui-auth%3D" + ns, token: reader}.do(t, url)
		return code == http.StatusOK && strings.Count(body, `"phase":"Running"`) == 2, fmt.Sprint(code, body)
	})

	// No token, or one the API server does not accept.
	if code, body := (call{path: "/api/v1/machines"}).do(t, url); code != http.StatusUnauthorized {
		t.Errorf("no token: %d %s, want 401", code, body)
	}
	if code, body := (call{path: "/api/v1/machines", token: "not-a-token"}).do(t, url); code != http.StatusUnauthorized {
		t.Errorf("a bad token: %d %s, want 401", code, body)
	}
	if code, _ := (call{path: "/machines"}).do(t, url); code != http.StatusSeeOther {
		t.Errorf("a page without a token: %d, want 303 to the login page", code)
	}

	// A token without list rights is refused, though kairon-ui's own
	// identity may read everything.
	for _, path := range []string{"/api/v1/machines?namespace=" + ns, "/api/v1/machines", "/api/v1/disruption-budgets?namespace=" + ns, "/api/v1/nodes", "/api/v1/machine-pools?namespace=" + ns} {
		code, body := call{path: path, token: nobody}.do(t, url)
		if code != http.StatusForbidden || !strings.Contains(apiError(t, body), "you may not list") {
			t.Errorf("GET %s as nobody: %d %s, want 403", path, code, body)
		}
	}
	if code, body := (call{path: "/machines?namespace=" + ns, token: nobody}).do(t, url); code != http.StatusForbidden || !strings.Contains(body, "you may not list machines.kairon.zyvor.dev in namespace "+ns) {
		t.Errorf("the Machines page as nobody: %d\n%s", code, body)
	}
	// The overview shows nobody nothing, and says why.
	if code, body := (call{path: "/?namespace=" + ns, token: nobody}).do(t, url); code != http.StatusOK || strings.Contains(body, `id="card-machines"`) || !strings.Contains(body, "Not shown: you may not list machines.kairon.zyvor.dev in namespace "+ns) {
		t.Errorf("the overview as nobody: %d\n%s", code, body)
	}

	// A namespace reader reads its namespace, not every namespace, and the
	// budget's receipts name no Machine of the namespace it may not list.
	var machines ui.List[ui.Machine]
	code, body = call{path: "/api/v1/machines?namespace=" + ns, token: nsReader}.do(t, url)
	if code != http.StatusOK || json.Unmarshal([]byte(body), &machines) != nil || machineNames(machines.Items) != "web-1" {
		t.Errorf("machines of %s as ns-reader: %d %s", ns, code, body)
	}
	if code, body := (call{path: "/api/v1/machines", token: nsReader}).do(t, url); code != http.StatusForbidden || !strings.Contains(body, "in every namespace") {
		t.Errorf("machines of every namespace as ns-reader: %d %s, want 403", code, body)
	}
	var budgets ui.List[ui.Budget]
	code, body = call{path: "/api/v1/disruption-budgets?namespace=" + ns, token: nsReader}.do(t, url)
	if code != http.StatusOK || json.Unmarshal([]byte(body), &budgets) != nil || len(budgets.Items) != 1 {
		t.Fatalf("budgets as ns-reader: %d %s", code, body)
	}
	if b := budgets.Items[0]; b.ExpectedMachines != 2 || len(b.Machines) != 1 || b.Machines[0].Name != "web-1" || b.HiddenMachines != 1 {
		t.Errorf("budget web as ns-reader: %d expected, receipts %+v, %d hidden; want 2, web-1 only, 1 hidden", b.ExpectedMachines, b.Machines, b.HiddenMachines)
	}
	code, body = call{path: "/api/v1/disruption-budgets?namespace=" + ns, token: reader}.do(t, url)
	if code != http.StatusOK || json.Unmarshal([]byte(body), &budgets) != nil || len(budgets.Items[0].Machines) != 2 || budgets.Items[0].HiddenMachines != 0 {
		t.Errorf("budgets as reader (every namespace): %d %s", code, body)
	}

	// Buttons: the operator sees each action, the reader none.
	pages := []struct{ path, action string }{
		{"/nodes", `data-action="evacuate"`},
		{"/machines/" + ns + "/web-1", `data-action="migrate"`},
		{"/pools?namespace=" + ns, `data-action="scale"`},
	}
	for _, p := range pages {
		if code, body := (call{path: p.path, token: operator}).do(t, url); code != http.StatusOK || !strings.Contains(body, p.action) {
			t.Errorf("%s as operator: %d, no %s", p.path, code, p.action)
		}
		if code, body := (call{path: p.path, token: reader}).do(t, url); code != http.StatusOK || strings.Contains(body, "data-action") {
			t.Errorf("%s as reader: %d, has an action:\n%s", p.path, code, body)
		}
	}

	// A reader's hand-made actions go to the API server, which refuses
	// them: the message is the API server's own, as the same request made
	// straight to it with the reader's token gets.
	rc := tokenClient(t, env, reader)
	// The API server's refusal of a migration in a namespace.
	refusal := func(ns, machine string) string {
		err := rc.Create(context.Background(), &kaironv1.MachineMigration{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: machine + "-mig-"},
			Spec:       kaironv1.MachineMigrationSpec{MachineName: machine},
		}, client.DryRunAll)
		if err == nil || !strings.Contains(err.Error(), "forbidden") {
			t.Fatalf("creating a migration in %s as reader straight at the API server: %v, want forbidden", ns, err)
		}
		return err.Error()
	}
	direct, direct2 := refusal(ns, "web-1"), refusal(ns2, "other-1")
	code, body = call{method: http.MethodPost, path: "/api/v1/actions/migrate", token: reader, body: ui.MigrateRequest{Namespace: ns, Machine: "web-1"}}.do(t, url)
	if code != http.StatusForbidden || apiError(t, body) != direct {
		t.Errorf("POST migrate as reader: %d %s\nwant 403 with the API server's %q", code, body, direct)
	}
	// The evacuation stops at its first refused create, in whichever
	// namespace sorts first.
	code, body = call{method: http.MethodPost, path: "/api/v1/actions/evacuate", token: reader, body: ui.EvacuateRequest{Node: node}}.do(t, url)
	if msg := apiError(t, body); code != http.StatusForbidden || msg != direct && msg != direct2 {
		t.Errorf("POST evacuate as reader: %d %s\nwant 403 with the API server's %q or %q", code, body, direct, direct2)
	}
	directScale := rc.SubResource("scale").Patch(context.Background(), pool.DeepCopy(), client.RawPatch(types.MergePatchType, []byte(`{"spec":{"replicas":3}}`)))
	if directScale == nil {
		t.Fatal("scaling as reader straight at the API server was allowed")
	}
	code, body = call{method: http.MethodPost, path: "/api/v1/actions/scale", token: reader, body: ui.ScaleRequest{Namespace: ns, Pool: "warm", Replicas: ptr.To[int32](3)}}.do(t, url)
	if code != http.StatusForbidden || apiError(t, body) != directScale.Error() {
		t.Errorf("POST scale as reader: %d %s\nwant 403 with the API server's %q", code, body, directScale.Error())
	}
	if n := migrationCount(t, env, ns); n != 0 {
		t.Errorf("%d migrations after the reader's refused actions", n)
	}

	// Cross-site requests are refused before anything is asked.
	for name, h := range map[string]map[string]string{
		"no X-Kairon-UI header": {"X-Kairon-UI": ""},
		"another Origin":        {"Origin": "http://evil.example"},
		"a cross-site fetch":    {"Sec-Fetch-Site": "cross-site"},
	} {
		code, body := call{method: http.MethodPost, path: "/api/v1/actions/migrate", token: operator, header: h, body: ui.MigrateRequest{Namespace: ns, Machine: "web-1"}}.do(t, url)
		if code != http.StatusForbidden {
			t.Errorf("migrate with %s: %d %s, want 403", name, code, body)
		}
	}

	// The operator's actions go through, or are held back by the budget
	// (minAvailable 0 of 2: both may go; the pool scales).
	code, body = call{method: http.MethodPost, path: "/api/v1/actions/migrate", token: operator, body: ui.MigrateRequest{Namespace: ns, Machine: "web-1", Strategy: "live"}}.do(t, url)
	var migrated ui.Migrated
	if code != http.StatusOK || json.Unmarshal([]byte(body), &migrated) != nil || migrated.SourceNode != node || migrated.Strategy != "live" {
		t.Fatalf("migrate as operator: %d %s", code, body)
	}
	var mig kaironv1.MachineMigration
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: migrated.Migration}, &mig); err != nil || mig.Spec.MachineName != "web-1" || mig.Spec.Strategy != kaironv1.MigrationLive {
		t.Errorf("migration %s: %v %+v", migrated.Migration, err, mig.Spec)
	}
	// A second one is refused: web-1 has one in flight.
	if code, body := (call{method: http.MethodPost, path: "/api/v1/actions/migrate", token: operator, body: ui.MigrateRequest{Namespace: ns, Machine: "web-1"}}).do(t, url); code != http.StatusConflict || !strings.Contains(body, "in flight") {
		t.Errorf("second migrate of web-1: %d %s, want 409", code, body)
	}
	code, body = call{method: http.MethodPost, path: "/api/v1/actions/scale", token: operator, body: ui.ScaleRequest{Namespace: ns, Pool: "warm", Replicas: ptr.To[int32](4)}}.do(t, url)
	if code != http.StatusOK {
		t.Errorf("scale as operator: %d %s", code, body)
	}
	var got kaironv1.MachinePool
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(pool), &got); err != nil || got.Spec.Replicas == nil || *got.Spec.Replicas != 4 {
		t.Errorf("pool after scale: %v %v", err, got.Spec.Replicas)
	}
	// Not found is the API server's 404.
	if code, body := (call{method: http.MethodPost, path: "/api/v1/actions/scale", token: operator, body: ui.ScaleRequest{Namespace: ns, Pool: "nope", Replicas: ptr.To[int32](1)}}).do(t, url); code != http.StatusNotFound || !strings.Contains(apiError(t, body), `"nope" not found`) {
		t.Errorf("scaling a pool that does not exist: %d %s", code, body)
	}

	// The login page: a token the API server accepts is kept in an
	// HttpOnly, SameSite=Strict cookie, and the pages then act as it.
	form := strings.NewReader(neturlValues("token", operator, "next", "/nodes"))
	req, _ := http.NewRequest(http.MethodPost, url+"/login", form)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := noRedirects.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	var cookie *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == "kairon_ui_token" {
			cookie = c
		}
	}
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/nodes" || cookie == nil || !cookie.HttpOnly || cookie.SameSite != http.SameSiteStrictMode {
		t.Fatalf("login: %s, Location %q, cookie %+v", resp.Status, resp.Header.Get("Location"), cookie)
	}
	if code, body := (call{path: "/nodes", header: map[string]string{"Cookie": "kairon_ui_token=" + cookie.Value}}).do(t, url); code != http.StatusOK || !strings.Contains(body, "system:serviceaccount:"+ns+":operator") || !strings.Contains(body, `data-action="evacuate"`) {
		t.Errorf("the Nodes page with the login cookie: %d\n%s", code, body)
	}
	// With the cookie alone, an action still needs the header.
	if code, _ := (call{method: http.MethodPost, path: "/api/v1/actions/scale", header: map[string]string{"Cookie": "kairon_ui_token=" + cookie.Value, "X-Kairon-UI": ""}, body: ui.ScaleRequest{Namespace: ns, Pool: "warm", Replicas: ptr.To[int32](1)}}).do(t, url); code != http.StatusForbidden {
		t.Errorf("scale with the cookie but without X-Kairon-UI: %d, want 403", code)
	}
	// After signing in, only a page of this site: another site's address
	// in next goes to the overview instead, and behind an HTTPS proxy the
	// cookie is Secure.
	for _, next := range []string{"//evil.example/x", "/\\evil.example/x", "https://evil.example/x"} {
		req, _ := http.NewRequest(http.MethodPost, url+"/login", strings.NewReader(neturlValues("token", operator, "next", next)))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("X-Forwarded-Proto", "https")
		resp, err := noRedirects.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if loc := resp.Header.Get("Location"); resp.StatusCode != http.StatusSeeOther || loc != "/" {
			t.Errorf("login with next=%q: %s to %q, want 303 to /", next, resp.Status, loc)
		}
		if cs := resp.Cookies(); len(cs) != 1 || !cs[0].Secure {
			t.Errorf("login behind an HTTPS proxy: cookies %+v, want one Secure cookie", cs)
		}
	}
	// A login form posted from another site is refused.
	req, _ = http.NewRequest(http.MethodPost, url+"/login", strings.NewReader(neturlValues("token", operator)))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", "http://evil.example")
	if resp, err := noRedirects.Do(req); err != nil || resp.StatusCode != http.StatusForbidden || len(resp.Cookies()) != 0 {
		t.Errorf("login from another Origin: %v %v, want 403 and no cookie", err, resp)
	} else {
		resp.Body.Close()
	}
	req, _ = http.NewRequest(http.MethodPost, url+"/login", strings.NewReader(neturlValues("token", "not-a-token")))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if resp, err := noRedirects.Do(req); err != nil || resp.StatusCode != http.StatusUnauthorized || len(resp.Cookies()) != 0 {
		t.Errorf("login with a bad token: %v %v", err, resp)
	} else {
		resp.Body.Close()
	}
}

func neturlValues(kv ...string) string {
	v := url.Values{}
	for i := 0; i+1 < len(kv); i += 2 {
		v.Set(kv[i], kv[i+1])
	}
	return v.Encode()
}

// TestActionsOff: without --allow-write no page shows an action and every
// action endpoint refuses, whoever asks.
func TestActionsOff(t *testing.T) {
	env := testenv.Get(t)
	url := startUIWith(t, env.Config, ui.Options{Auth: ui.AuthToken})
	ns := env.Namespace(t)
	node := "ui-off-" + ns[len(ns)-5:]
	kaironNode(t, env, node, false)
	machine(t, env, ns, "web-1", node, kaironv1.MachineRunning, nil)
	operator := serviceAccount(t, env, ns, "operator")
	grantCluster(t, env, ns, "operator", operatorRules)
	testenv.Eventually(t, 30*time.Second, "the UI to show web-1", func() (bool, string) {
		code, body := call{path: "/machines/" + ns + "/web-1", token: operator}.do(t, url)
		return code == http.StatusOK, fmt.Sprint(code, body)
	})
	for _, path := range []string{"/nodes", "/machines/" + ns + "/web-1", "/pools"} {
		if code, body := (call{path: path, token: operator}).do(t, url); code != http.StatusOK || strings.Contains(body, "data-action") {
			t.Errorf("%s without --allow-write: %d, has an action", path, code)
		}
	}
	for _, c := range []call{
		{method: http.MethodPost, path: "/api/v1/actions/evacuate", token: operator, body: ui.EvacuateRequest{Node: node}},
		{method: http.MethodPost, path: "/api/v1/actions/migrate", token: operator, body: ui.MigrateRequest{Namespace: ns, Machine: "web-1"}},
		{method: http.MethodPost, path: "/api/v1/actions/scale", token: operator, body: ui.ScaleRequest{Namespace: ns, Pool: "warm", Replicas: ptr.To[int32](1)}},
	} {
		if code, body := c.do(t, url); code != http.StatusForbidden || !strings.Contains(body, "--allow-write") {
			t.Errorf("POST %s without --allow-write: %d %s, want 403", c.path, code, body)
		}
	}
	if n := migrationCount(t, env, ns); n != 0 {
		t.Errorf("%d migrations created without --allow-write", n)
	}
}
